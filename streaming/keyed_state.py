"""Spark stage 2: `applyInPandasWithState` per (tenant, source), around `windowing.advance`.

Each group call gets one key's records of one micro-batch (or none, when the key's idle timeout
fired), orders them by (partition, offset), guards against future clocks, runs the pure
windowing logic, keeps the key's `KeyState` as one JSON string (pyspark 4.2 lower-cases nested
state schemas, so the state stays flat), and emits one union row per output row, tagged with the
table it belongs to (`kind`). The sink splits them by `kind`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
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

from storage.tables import EVENTS, LATE_EVENTS, QUARANTINE, TENANT_STATUS, WINDOWS
from streaming.hooks import NO_FAULTS, FaultHook, FaultPoint
from streaming.parsing import QuarantineReason
from streaming.windowing import (
    Assignment,
    BatchResult,
    KeyState,
    Pane,
    RecordInput,
    TooLate,
    advance,
)
from tenants.config_store import ConfigSnapshots
from tenants.models import WindowRules

# `kind` names the table a union row belongs to: the table specs are the one source of truth.
KIND_EVENTS = EVENTS.name
KIND_WINDOWS = WINDOWS.name
KIND_LATE = LATE_EVENTS.name
KIND_QUARANTINE = QUARANTINE.name
KIND_STATUS = TENANT_STATUS.name

_OUTPUT_FIELDS: list[tuple[str, DataType]] = [
    ("kind", StringType()),
    ("tenant", StringType()),
    ("source", StringType()),
    ("window_id", StringType()),
    ("window_start_ms", LongType()),
    ("window_end_ms", LongType()),
    ("pane_index", IntegerType()),
    ("timing", StringType()),
    ("is_final", BooleanType()),
    ("count", LongType()),
    ("metrics_json", StringType()),
    ("merged_window_ids_json", StringType()),
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
    # tenant_status only
    ("max_event_time_ms", LongType()),
    ("open_windows", IntegerType()),
    ("last_record_processing_ms", LongType()),
    ("processing_time_ms", LongType()),
    ("on_time_records", LongType()),
    ("late_records", LongType()),
    ("too_late_records", LongType()),
    ("quarantined_records", LongType()),
]
OUTPUT_SCHEMA = StructType([StructField(name, data_type) for name, data_type in _OUTPUT_FIELDS])
STATE_SCHEMA = StructType(
    [StructField("key_state_json", StringType()), StructField("quarantined_records", LongType())]
)

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


@dataclass
class _StoredState:
    key_state: KeyState
    quarantined_records: int


def make_key_processor(
    snapshots: ConfigSnapshots, fault_hook: FaultHook = NO_FAULTS
) -> KeyProcessor:
    def process(
        key: Any, frames: Iterable[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        tenant, source = key
        # The batch timestamp, the same in a replay: never the wall clock.
        processing_time_ms = int(state.getCurrentProcessingTimeMs())
        registry = snapshots.registry_at(processing_time_ms)
        resolved = registry.resolve(tenant, source) if tenant and source else None
        frame_list = list(frames)
        batch = (
            pd.concat(frame_list, ignore_index=True)
            if frame_list
            else pd.DataFrame(columns=["partition", "offset", "reason", "error"])
        )
        # SPEC §2: a key's records are handled in (partition, offset) order.
        batch = batch.sort_values(["partition", "offset"], kind="stable", ignore_index=True)
        if not batch.empty:
            offsets = batch["offset"]
            fault_hook.reached(FaultPoint.STATE_FUNCTION, int(offsets.min()), int(offsets.max()))
        if resolved is None:
            _reject(batch, batch["reason"].isna(), QuarantineReason.UNKNOWN_SOURCE, "no rules")
        else:
            _reject_future_skew(batch, resolved.rules, processing_time_ms)
        rejected = batch["reason"].notna()
        parts = [quarantine_rows(batch[rejected])]
        if resolved is not None:
            stored = _load(state)
            stored.quarantined_records += int(rejected.sum())
            accepted = batch[~rejected].reset_index(drop=True)
            records = [
                RecordInput(int(event_time), json.loads(inputs) if inputs else {})
                for event_time, inputs in zip(
                    accepted.get("event_time_ms", []),
                    accepted.get("metric_inputs_json", []),
                    strict=True,
                )
            ]
            result = advance(stored.key_state, records, resolved.rules, processing_time_ms)
            parts += _result_rows(accepted, result, tenant, source)
            parts.append(status_row(stored, tenant, source, processing_time_ms))
            _save(state, stored, resolved.rules)
        non_empty = [part for part in parts if not part.empty]
        yield output_frame(pd.concat(non_empty, ignore_index=True) if non_empty else pd.DataFrame())

    return process


def _reject(batch: pd.DataFrame, mask: pd.Series, reason: QuarantineReason, error: str) -> None:
    batch.loc[mask, "reason"] = reason.value
    batch.loc[mask, "error"] = error


def _reject_future_skew(batch: pd.DataFrame, rules: WindowRules, processing_time_ms: int) -> None:
    if batch.empty:
        return
    limit_ms = processing_time_ms + rules.max_future_skew_ms
    ahead = batch["reason"].isna() & (batch["event_time_ms"] > limit_ms)
    if ahead.any():
        # One bad clock must not move the key's watermark and close its windows early.
        batch.loc[ahead, "reason"] = QuarantineReason.FUTURE_SKEW.value
        batch.loc[ahead, "error"] = [
            f"event time {int(t)} is {int(t) - processing_time_ms} ms ahead of processing time "
            f"{processing_time_ms}; max_future_skew is {rules.max_future_skew_ms} ms"
            for t in batch.loc[ahead, "event_time_ms"]
        ]


def _load(state: GroupState) -> _StoredState:
    if not state.exists:
        return _StoredState(KeyState(), 0)
    key_state_json, quarantined = state.get
    return _StoredState(KeyState.from_json_dict(json.loads(key_state_json)), int(quarantined))


def _save(state: GroupState, stored: _StoredState, rules: WindowRules) -> None:
    key_state_json = json.dumps(stored.key_state.to_json_dict(), separators=(",", ":"))
    state.update((key_state_json, stored.quarantined_records))
    if rules.idle_timeout_ms is not None and stored.key_state.windows:
        # Call this key again when it has been idle that long, to advance its watermark.
        state.setTimeoutDuration(rules.idle_timeout_ms)


def _result_rows(
    accepted: pd.DataFrame, result: BatchResult, tenant: str, source: str
) -> list[pd.DataFrame]:
    return [
        event_rows(accepted, result.assignments, tenant, source),
        late_rows(accepted, result.too_late, tenant, source),
        pane_rows(result.panes, tenant, source),
    ]


def quarantine_rows(records: pd.DataFrame) -> pd.DataFrame:
    if records.empty:
        return pd.DataFrame()
    rows = records[["tenant", "source", *_RECORD_COLUMNS, "event_id", "reason", "error"]].copy()
    rows["kind"] = KIND_QUARANTINE
    return rows


def _record_rows(
    accepted: pd.DataFrame, indexes: list[int], kind: str, tenant: str, source: str
) -> pd.DataFrame:
    rows = accepted.loc[indexes, [*_RECORD_COLUMNS, "event_time_ms", "event_id"]]
    rows = rows.reset_index(drop=True)
    rows["kind"], rows["tenant"], rows["source"] = kind, tenant, source
    return rows


def event_rows(
    accepted: pd.DataFrame, assignments: list[Assignment], tenant: str, source: str
) -> pd.DataFrame:
    if not assignments:
        return pd.DataFrame()
    rows = _record_rows(
        accepted, [a.record_index for a in assignments], KIND_EVENTS, tenant, source
    )
    rows["window_id"] = [a.window_id for a in assignments]
    rows["window_start_ms"] = [a.window_start_ms for a in assignments]
    rows["window_end_ms"] = [a.window_end_ms for a in assignments]
    rows["pane_index"] = [a.pane_index for a in assignments]
    rows["timing"] = [a.timing.value for a in assignments]
    return rows


def late_rows(
    accepted: pd.DataFrame, too_late: list[TooLate], tenant: str, source: str
) -> pd.DataFrame:
    if not too_late:
        return pd.DataFrame()
    rows = _record_rows(accepted, [t.record_index for t in too_late], KIND_LATE, tenant, source)
    rows["window_start_ms"] = [t.window_start_ms for t in too_late]
    rows["window_end_ms"] = [t.window_end_ms for t in too_late]
    rows["lateness_ms"] = [t.lateness_ms for t in too_late]
    rows["watermark_ms"] = [t.watermark_ms for t in too_late]
    return rows


def pane_rows(panes: list[Pane], tenant: str, source: str) -> pd.DataFrame:
    if not panes:
        return pd.DataFrame()
    return pd.DataFrame(
        {
            "kind": KIND_WINDOWS,
            "tenant": tenant,
            "source": source,
            "window_id": [p.window_id for p in panes],
            "window_start_ms": [p.window_start_ms for p in panes],
            "window_end_ms": [p.window_end_ms for p in panes],
            "pane_index": [p.pane_index for p in panes],
            "timing": [p.timing.value for p in panes],
            "is_final": [p.is_final for p in panes],
            "count": [p.count for p in panes],
            "metrics_json": [json.dumps(p.metrics, sort_keys=True) for p in panes],
            "merged_window_ids_json": [json.dumps(list(p.merged_window_ids)) for p in panes],
            "watermark_ms": [p.watermark_ms for p in panes],
        }
    )


def status_row(
    stored: _StoredState, tenant: str, source: str, processing_time_ms: int
) -> pd.DataFrame:
    key_state = stored.key_state
    return pd.DataFrame(
        {
            "kind": [KIND_STATUS],
            "tenant": [tenant],
            "source": [source],
            "watermark_ms": [key_state.watermark_ms],
            "max_event_time_ms": [key_state.max_event_time_ms],
            "open_windows": [len(key_state.windows)],
            "last_record_processing_ms": [key_state.last_record_processing_ms],
            "processing_time_ms": [processing_time_ms],
            "on_time_records": [key_state.on_time_records],
            "late_records": [key_state.late_records],
            "too_late_records": [key_state.too_late_records],
            "quarantined_records": [stored.quarantined_records],
        }
    )


def output_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """Every output column, in schema order, with nullable dtypes."""
    return rows.reindex(columns=list(_OUTPUT_DTYPES)).astype(_OUTPUT_DTYPES)
