"""Inputs of the stateful stage for tests without Spark: a registry of tenants, routed records
as a bucket receives them, and a bucket's state as older releases stored it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa

from tenants.conf_reader import load_registry
from tenants.registry import TenantRegistry
from tests.support.sample_conf import SAMPLE_CONF
from tests.support.timestamps import T0_MS


def registry_with(tmp_path: Path, tenants: list[str]) -> TenantRegistry:
    """The sample config's sources, with `tenants` sending `web` under its default rules."""
    conf = tmp_path / "conf"
    (conf / "tenants").mkdir(parents=True)
    (conf / "sources.yaml").write_text((SAMPLE_CONF / "sources.yaml").read_text())
    for tenant in tenants:
        (conf / "tenants" / f"{tenant}.yaml").write_text(f"id: {tenant}\nsources: [web]\n")
    return load_registry(conf)


def routed_records(rows: list[tuple[str | None, int, int, int]]) -> pd.DataFrame:
    """Routed records: (tenant or None for a malformed one, partition, offset, event time)."""
    return pd.DataFrame(
        {
            "tenant": [tenant for tenant, _, _, _ in rows],
            "source": ["web" if tenant else None for tenant, _, _, _ in rows],
            "key": [b"k"] * len(rows),
            "value": [b"{}"] * len(rows),
            "topic": "events",
            "partition": [partition for _, partition, _, _ in rows],
            "offset": [offset for _, _, offset, _ in rows],
            "kafka_timestamp_ms": T0_MS,
            "event_time_ms": pd.array([t if tenant else None for tenant, _, _, t in rows], "Int64"),
            "event_id": None,
            "metric_values": None,
            "reason": [None if tenant else "malformed_json" for tenant, _, _, _ in rows],
            "error": [None if tenant else "truncated" for tenant, _, _, _ in rows],
        }
    )


def json_layout_blob(tenants: list[str], bodies: list[str]) -> bytes:
    """A bucket as releases before the columnar state wrote it: a key's state as JSON, with its
    rules inside."""
    legacy_schema = pa.schema(
        [
            pa.field("tenant", pa.string(), nullable=False),
            pa.field("source", pa.string(), nullable=False),
            pa.field("key_state_json", pa.large_string(), nullable=False),
            pa.field("quarantined_records", pa.int64(), nullable=False),
            pa.field("idle_deadline_ms", pa.int64()),
        ]
    )
    table = pa.table(
        [tenants, ["web"] * len(tenants), bodies, [2] * len(tenants), [None] * len(tenants)],
        schema=legacy_schema,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, legacy_schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())
