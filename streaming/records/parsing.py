"""Decode a Kafka value and route it to its (tenant, source), or say why it cannot be accepted.

Pure Python, no Spark: the query calls `parse_value` once per record, before grouping by key.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from tenants.models import ID_PATTERN, EventTimeFormat, EventTimeSpec, MetricKind, MetricSpec
from tenants.registry import ResolvedSource, TenantRegistry

# Python's datetime cannot go past year 9999; Spark and Delta timestamps cannot either.
MAX_EVENT_TIME_MS = 253_402_300_799_999
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_ID_RE = re.compile(ID_PATTERN)


class QuarantineReason(StrEnum):
    MALFORMED_JSON = "malformed_json"
    MISSING_FIELD = "missing_field"
    BAD_EVENT_TIME = "bad_event_time"
    UNKNOWN_TENANT = "unknown_tenant"
    UNKNOWN_SOURCE = "unknown_source"
    FUTURE_SKEW = "future_skew"
    TOO_LARGE = "too_large"
    BAD_METRIC_VALUE = "bad_metric_value"


@dataclass(frozen=True)
class Accepted:
    tenant: str
    source: str
    event_time_ms: int
    event_id: str | None
    metric_inputs: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Rejected:
    reason: QuarantineReason
    error: str
    # Whatever tenant/source the record claimed, kept so quarantine can be queried per tenant.
    tenant: str | None = None
    source: str | None = None


def parse_value(
    value: bytes | None, registry: TenantRegistry, max_record_bytes: int
) -> Accepted | Rejected:
    if value is None:
        return Rejected(QuarantineReason.MALFORMED_JSON, "Kafka value is null")
    if len(value) > max_record_bytes:
        return Rejected(
            QuarantineReason.TOO_LARGE,
            f"value is {len(value)} bytes, the limit is {max_record_bytes}",
        )
    try:
        # Decode explicitly: json.loads(bytes) would also accept UTF-16 and UTF-32.
        record = json.loads(value.decode("utf-8"))
    # ValueError covers JSONDecodeError, bad UTF-8, and integers longer than Python's
    # int/str conversion limit; RecursionError covers pathologically deep nesting.
    except (ValueError, RecursionError) as error:
        return Rejected(QuarantineReason.MALFORMED_JSON, f"not valid UTF-8 JSON: {error}")
    if not isinstance(record, dict):
        return Rejected(
            QuarantineReason.MALFORMED_JSON, f"expected a JSON object, got {type(record).__name__}"
        )

    tenant, source = record.get("tenant"), record.get("source")
    claimed_tenant = tenant if isinstance(tenant, str) else None
    claimed_source = source if isinstance(source, str) else None
    for field_name, field_value in (("tenant", tenant), ("source", source)):
        if not isinstance(field_value, str):
            problem = "is missing" if field_value is None else "must be a string"
            return Rejected(
                QuarantineReason.MISSING_FIELD,
                f"field {field_name!r} {problem}",
                claimed_tenant,
                claimed_source,
            )
    assert isinstance(tenant, str) and isinstance(source, str)
    resolved = route_key(tenant, source, registry)
    if isinstance(resolved, Rejected):
        return resolved
    return accept_record(record, tenant, source, resolved)


def route_key(tenant: str, source: str, registry: TenantRegistry) -> ResolvedSource | Rejected:
    """The key's config, or why records claiming it are rejected (the same for all of them)."""
    if not _ID_RE.fullmatch(tenant) or not registry.knows_tenant(tenant):
        return Rejected(
            QuarantineReason.UNKNOWN_TENANT, f"tenant {tenant!r} is not configured", tenant, source
        )
    resolved = registry.resolve(tenant, source)
    if resolved is None:
        return Rejected(
            QuarantineReason.UNKNOWN_SOURCE,
            f"source {source!r} is not configured for tenant {tenant!r}",
            tenant,
            source,
        )
    return resolved


def accept_record(
    record: dict[str, object], tenant: str, source: str, resolved: ResolvedSource
) -> Accepted | Rejected:
    """A decoded record of a configured key: its event time and metric inputs, or why not."""
    event_time = extract_event_time(record, resolved.event_time)
    if isinstance(event_time, Rejected):
        return Rejected(event_time.reason, event_time.error, tenant, source)
    metric_inputs = extract_metric_inputs(record, resolved.rules.metrics)
    if isinstance(metric_inputs, Rejected):
        return Rejected(metric_inputs.reason, metric_inputs.error, tenant, source)
    event_id = record.get("event_id")
    return Accepted(
        tenant, source, event_time, None if event_id is None else str(event_id), metric_inputs
    )


def extract_metric_inputs(
    record: dict[str, object], metrics: dict[str, MetricSpec]
) -> dict[str, float | None] | Rejected:
    """Per metric: 1.0/0.0 for a count (filter matched or not), else the number or None."""
    inputs: dict[str, float | None] = {}
    for name, spec in metrics.items():
        value = lookup(record, spec.path)
        if spec.kind is MetricKind.COUNT:
            inputs[name] = 1.0 if spec.field is None or same_value(value, spec.equals) else 0.0
        elif value is None:
            inputs[name] = None  # skipped, like SQL skips nulls
        elif isinstance(value, bool) or not isinstance(value, int | float):
            return Rejected(
                QuarantineReason.BAD_METRIC_VALUE,
                f"metric {name!r} needs a number in {spec.field!r}, got {value!r}",
            )
        else:
            number = _finite_float(value)
            if number is None:
                return Rejected(
                    QuarantineReason.BAD_METRIC_VALUE,
                    f"metric {name!r}: {spec.field!r}={value!r} is not a finite double",
                )
            inputs[name] = number
    return inputs


def _finite_float(value: int | float) -> float | None:
    try:
        number = float(value)  # an integer beyond the double range raises OverflowError
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def lookup(record: dict[str, object], path: tuple[str, ...]) -> object:
    node: object = record
    for part in path:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def same_value(value: object, expected: object) -> bool:
    # JSON true must not count as 1, nor "1" as 1: compare kinds as well as values.
    if isinstance(value, bool) or isinstance(expected, bool):
        return value is expected
    if isinstance(value, int | float) and isinstance(expected, int | float):
        return value == expected
    return type(value) is type(expected) and value == expected


def extract_event_time(record: dict[str, object], spec: EventTimeSpec) -> int | Rejected:
    """The record's event time in ms since the epoch, by its source's rule."""
    node: object = record
    for part in spec.path:
        if not isinstance(node, dict) or part not in node:
            return Rejected(
                QuarantineReason.MISSING_FIELD, f"event time field {spec.field!r} is missing"
            )
        node = node[part]
    if node is None:
        return Rejected(QuarantineReason.MISSING_FIELD, f"event time field {spec.field!r} is null")
    try:
        event_time_ms = _to_epoch_ms(node, spec.format)
    except (ValueError, OverflowError) as error:
        return Rejected(
            QuarantineReason.BAD_EVENT_TIME, f"event time {spec.field!r}={node!r}: {error}"
        )
    if not 0 <= event_time_ms <= MAX_EVENT_TIME_MS:
        return Rejected(
            QuarantineReason.BAD_EVENT_TIME,
            f"event time {spec.field!r}={node!r} is outside 1970-01-01..9999-12-31",
        )
    return event_time_ms


def _to_epoch_ms(value: object, time_format: EventTimeFormat) -> int:
    if time_format is EventTimeFormat.ISO8601:
        if not isinstance(value, str):
            raise ValueError(f"expected an ISO 8601 string, got {type(value).__name__}")
        parsed = datetime.fromisoformat(value)
        # A timestamp without an offset is taken as UTC, the product's only time zone.
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        # Integer arithmetic: float seconds would round some millisecond values.
        return (parsed - _EPOCH) // _ONE_MS
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    scale = 1 if time_format is EventTimeFormat.EPOCH_MS else 1000
    return math.floor(value * scale)
