"""Sample multi-tenant, out-of-order traffic for demos, tests and benchmarks.

`generate` is pure and deterministic for a seed; `send` produces to Kafka at a bounded rate.
Event times are written where each record's source says they live, in its format.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from streaming.kafka.client import PLAINTEXT, KafkaSecurity, kafka_python_producer
from tenants.models import EventTimeFormat, EventTimeSpec, NonNegativeDurationMs, PositiveDurationMs

# Malformed variants cover each quarantine reason the parser can decide alone.
MALFORMED_KINDS = (
    "malformed_json",
    "missing_field",
    "bad_event_time",
    "unknown_tenant",
    "unknown_source",
)


class LoadSpec(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True
    )

    tenants: tuple[str, ...] = ("acme", "globex", "initech")
    sources: tuple[str, ...] = ("web", "billing")
    count: int = Field(default=6_000, gt=0, le=50_000_000)
    start_ms: int = Field(default=1_767_225_600_000, ge=0, description="2026-01-01T00:00:00Z")
    step_ms: PositiveDurationMs = Field(
        default=1_000, alias="step", description="Event-time gap per key."
    )
    jitter_ms: NonNegativeDurationMs = Field(
        default=5_000, alias="jitter", description="Out-of-orderness."
    )
    late_share: float = Field(default=0.02, ge=0, le=1)
    late_by_ms: PositiveDurationMs = Field(default=180_000, alias="late_by")
    malformed_share: float = Field(default=0.01, ge=0, le=1)
    ahead_ms: Mapping[str, int] = Field(
        default_factory=dict, alias="ahead", description="Tenant -> ms ahead."
    )
    seed: int = 7


@dataclass(frozen=True)
class SampleRecord:
    key: bytes
    value: bytes
    tenant: str
    source: str
    event_time_ms: int | None
    kind: str
    """`good`, `late` or one of MALFORMED_KINDS: what the generator meant the record to be."""


def generate(
    spec: LoadSpec, event_time_specs: Mapping[str, EventTimeSpec]
) -> Iterator[SampleRecord]:
    rng = random.Random(spec.seed)
    keys = [(tenant, source) for tenant in spec.tenants for source in spec.sources]
    clock_ms = {key: spec.start_ms + spec.ahead_ms.get(key[0], 0) for key in keys}
    for index in range(spec.count):
        tenant, source = keys[index % len(keys)]
        clock_ms[(tenant, source)] += spec.step_ms
        event_time_ms = clock_ms[(tenant, source)] - rng.randint(0, spec.jitter_ms)
        kind = "good"
        if rng.random() < spec.late_share:
            event_time_ms -= spec.late_by_ms
            kind = "late"
        record: dict[str, object] = {
            "tenant": tenant,
            "source": source,
            "event_id": f"{tenant}-{source}-{index}",
            "amount": rng.randint(1, 500),
            "level": rng.choice(["INFO", "INFO", "WARN", "ERROR"]),
        }
        set_event_time(record, event_time_specs[source], event_time_ms)
        if rng.random() < spec.malformed_share:
            kind = rng.choice(MALFORMED_KINDS)
            yield _malformed(kind, record, tenant, source)
            continue
        value = json.dumps(record, separators=(",", ":")).encode()
        yield SampleRecord(tenant.encode(), value, tenant, source, event_time_ms, kind)


def send(
    records: Iterator[SampleRecord],
    bootstrap_servers: str,
    topic: str,
    rate_per_s: float | None = None,
    timeout_s: float = 300.0,
    security: KafkaSecurity = PLAINTEXT,
) -> int:
    """Produce every record (acks=all, idempotent); bounded by count and by `timeout_s`."""
    producer = kafka_python_producer(
        bootstrap_servers, security, acks="all", enable_idempotence=True, linger_ms=5
    )
    deadline = time.monotonic() + timeout_s
    started = time.monotonic()
    sent = 0
    try:
        for record in records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"produced {sent} records in {timeout_s}s, then gave up")
            producer.send(topic, key=record.key, value=record.value)
            sent += 1
            if rate_per_s:
                ahead_s = sent / rate_per_s - (time.monotonic() - started)
                if ahead_s > 0:
                    time.sleep(ahead_s)
        producer.flush(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        producer.close(timeout=10)
    return sent


def set_event_time(record: dict[str, object], spec: EventTimeSpec, event_time_ms: int) -> None:
    node = record
    *parents, leaf = spec.path
    for part in parents:
        child = node.setdefault(part, {})
        assert isinstance(child, dict)
        node = child
    if spec.format is EventTimeFormat.ISO8601:
        moment = datetime.fromtimestamp(event_time_ms / 1000, tz=UTC)
        node[leaf] = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    elif spec.format is EventTimeFormat.EPOCH_MS:
        node[leaf] = event_time_ms
    else:
        node[leaf] = event_time_ms / 1000


def _malformed(kind: str, record: dict[str, object], tenant: str, source: str) -> SampleRecord:
    if kind == "malformed_json":
        value = b'{"tenant": "' + tenant.encode() + b'", "truncated'
    elif kind == "missing_field":
        value = json.dumps({k: v for k, v in record.items() if k != "tenant"}).encode()
    elif kind == "bad_event_time":
        value = json.dumps(
            {"tenant": tenant, "source": source, "ts": "yesterday", "meta": {"event_ms": "x"}}
        ).encode()
    elif kind == "unknown_tenant":
        value = json.dumps({**record, "tenant": "not-onboarded"}).encode()
    else:
        value = json.dumps({**record, "source": "no-such-source"}).encode()
    return SampleRecord(tenant.encode(), value, tenant, source, None, kind)
