"""Spark stage 2: `applyInPandasWithState` per (tenant, source), around `windowing.advance`.

Each group call gets one key's records of one micro-batch, orders them by (partition, offset),
runs the pure windowing logic, keeps the key's `KeyState` as one JSON string (pyspark 4.2
lower-cases nested state schemas, so the state stays flat), and emits one union row per output
row, tagged with the table it belongs to (`kind`). The sink splits them by `kind`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from typing import Any

import pandas as pd
from pyspark.sql.streaming.state import GroupState
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from streaming.parsing import QuarantineReason
from streaming.windowing import KeyState, advance
from tenants.registry import TenantRegistry

KIND_EVENTS = "events"
KIND_WINDOWS = "windows"
KIND_LATE = "late_events"
KIND_QUARANTINE = "quarantine"

_OUTPUT_FIELDS: list[tuple[str, DataType]] = [
    ("kind", StringType()),
    ("tenant", StringType()),
    ("source", StringType()),
    ("window_start_ms", LongType()),
    ("window_end_ms", LongType()),
    ("pane_index", IntegerType()),
    ("timing", StringType()),
    ("is_final", BooleanType()),
    ("count", LongType()),
    ("event_time_ms", LongType()),
    ("lateness_ms", LongType()),
    ("watermark_ms", LongType()),
    ("topic", StringType()),
    ("partition", IntegerType()),
    ("offset", LongType()),
    ("kafka_timestamp_ms", LongType()),
    ("event_id", StringType()),
    ("key", BinaryType()),
    ("value", BinaryType()),
    ("reason", StringType()),
    ("error", StringType()),
]
OUTPUT_SCHEMA = StructType([StructField(name, data_type) for name, data_type in _OUTPUT_FIELDS])
STATE_SCHEMA = StructType([StructField("key_state_json", StringType())])

# Nullable pandas dtypes, so a missing number stays null instead of turning into a float NaN.
_PANDAS_DTYPES: dict[type[DataType], str] = {
    LongType: "Int64",
    IntegerType: "Int32",
    BooleanType: "boolean",
    StringType: "object",
    BinaryType: "object",
}
_OUTPUT_DTYPES = {name: _PANDAS_DTYPES[type(data_type)] for name, data_type in _OUTPUT_FIELDS}
_RECORD_COLUMNS = ["topic", "partition", "offset", "kafka_timestamp_ms", "key", "value"]

KeyProcessor = Callable[[Any, Iterable[pd.DataFrame], GroupState], Iterator[pd.DataFrame]]


def make_key_processor(registry: TenantRegistry) -> KeyProcessor:
    def process(
        key: Any, frames: Iterable[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        tenant, source = key
        batch = pd.concat(list(frames), ignore_index=True)
        # SPEC §2: a key's records are handled in (partition, offset) order.
        batch = batch.sort_values(["partition", "offset"], kind="stable", ignore_index=True)
        resolved = registry.resolve(tenant, source) if tenant and source else None
        rejected = batch["reason"].notna()
        if resolved is None and not rejected.all():
            # Only reachable if routing and state saw different configs; never drop the record.
            batch.loc[~rejected, "reason"] = QuarantineReason.UNKNOWN_SOURCE.value
            batch.loc[~rejected, "error"] = f"no rules for ({tenant}, {source})"
            rejected[:] = True
        parts = [quarantine_rows(batch[rejected])]
        accepted = batch[~rejected].reset_index(drop=True)
        if resolved is not None and len(accepted) > 0:
            key_state = _load_state(state)
            event_times_ms = accepted["event_time_ms"].astype("int64").tolist()
            result = advance(key_state, event_times_ms, resolved.rules)
            state.update((json.dumps(key_state.to_json_dict(), separators=(",", ":")),))
            parts.append(event_rows(accepted, result.assignments, tenant, source))
            parts.append(late_rows(accepted, result.too_late, tenant, source))
            parts.append(pane_rows(result.panes, tenant, source))
        yield output_frame(pd.concat(parts, ignore_index=True))

    return process


def _load_state(state: GroupState) -> KeyState:
    if not state.exists:
        return KeyState()
    (key_state_json,) = state.get
    loaded: dict[str, object] = json.loads(key_state_json)
    return KeyState.from_json_dict(loaded)


def quarantine_rows(records: pd.DataFrame) -> pd.DataFrame:
    rows = records[["tenant", "source", *_RECORD_COLUMNS, "event_id", "reason", "error"]].copy()
    rows["kind"] = KIND_QUARANTINE
    return rows


def event_rows(
    accepted: pd.DataFrame, assignments: list[Any], tenant: str, source: str
) -> pd.DataFrame:
    if not assignments:
        return pd.DataFrame()
    index = [a.record_index for a in assignments]
    rows = accepted.loc[index, [*_RECORD_COLUMNS, "event_time_ms", "event_id"]].reset_index(
        drop=True
    )
    rows["kind"] = KIND_EVENTS
    rows["tenant"], rows["source"] = tenant, source
    rows["window_start_ms"] = [a.window_start_ms for a in assignments]
    rows["window_end_ms"] = [a.window_end_ms for a in assignments]
    rows["pane_index"] = [a.pane_index for a in assignments]
    rows["timing"] = [a.timing.value for a in assignments]
    return rows


def late_rows(
    accepted: pd.DataFrame, too_late: list[Any], tenant: str, source: str
) -> pd.DataFrame:
    if not too_late:
        return pd.DataFrame()
    index = [t.record_index for t in too_late]
    rows = accepted.loc[index, [*_RECORD_COLUMNS, "event_time_ms", "event_id"]].reset_index(
        drop=True
    )
    rows["kind"] = KIND_LATE
    rows["tenant"], rows["source"] = tenant, source
    rows["window_start_ms"] = [t.window_start_ms for t in too_late]
    rows["window_end_ms"] = [t.window_end_ms for t in too_late]
    rows["lateness_ms"] = [t.lateness_ms for t in too_late]
    rows["watermark_ms"] = [t.watermark_ms for t in too_late]
    return rows


def pane_rows(panes: list[Any], tenant: str, source: str) -> pd.DataFrame:
    if not panes:
        return pd.DataFrame()
    rows = pd.DataFrame([asdict(pane) for pane in panes])
    rows["timing"] = rows["timing"].map(str)
    rows["kind"] = KIND_WINDOWS
    rows["tenant"], rows["source"] = tenant, source
    return rows


def output_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """Every output column, in schema order, with nullable dtypes."""
    return rows.reindex(columns=list(_OUTPUT_DTYPES)).astype(_OUTPUT_DTYPES)
