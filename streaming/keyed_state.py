"""Spark stage 2: `applyInPandasWithState` per hash bucket of keys, around `windowing.advance`.

Spark pays a fixed cost for every group it hands to Python, so grouping by (tenant, source)
made 10,000 tenants many times slower than 10. The stream therefore groups by
`bucket = pmod(xxhash64(tenant, source), state_buckets)`, and each group call does, for all the
keys of its bucket at once:

1. sort the bucket's records by (tenant, source, partition, offset): SPEC §2's per-key order;
2. quarantine what cannot be accepted (unknown key, clock too far ahead), as whole columns;
3. run the pure windowing logic key by key over plain Python lists, so a key costs a function
   call, not a pandas round trip;
4. advance the watermark of the bucket's idle keys (`idle_timeout`);
5. emit one union row per output row, tagged with the table it belongs to (`kind`), built
   column-wise once per bucket. The sink splits them by `kind`.

The per-key watermark is untouched by bucketing: each key keeps its own `KeyState`, stored in
the bucket's state (`bucket_state`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
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
from streaming.bucket_state import STATE_LAYOUT, BucketState, Key, StoredKey
from streaming.hooks import NO_FAULTS, FaultHook, FaultPoint
from streaming.parsing import QuarantineReason
from streaming.windowing import BatchResult, RecordInput, advance
from tenants.config_store import ConfigSnapshots
from tenants.registry import TenantRegistry

BUCKET_COLUMN = "bucket"


def bucket_expression(state_buckets: int) -> str:
    """The SQL that buckets a routed record; frozen once a checkpoint exists."""
    return f"pmod(xxhash64(tenant, source), {state_buckets}) AS {BUCKET_COLUMN}"


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
# pyspark 4.2 lower-cases nested state schemas on the worker: keep the state flat.
STATE_SCHEMA = StructType(
    [StructField("layout", IntegerType()), StructField("keys_arrow", BinaryType())]
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
_EMPTY_BATCH_COLUMNS = ["tenant", "source", "partition", "offset", "reason", "error"]

BucketProcessor = Callable[[Any, Iterable[pd.DataFrame], GroupState], Iterator[pd.DataFrame]]


def make_bucket_processor(
    snapshots: ConfigSnapshots, fault_hook: FaultHook = NO_FAULTS
) -> BucketProcessor:
    def process(
        _bucket: Any, frames: Iterable[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        # The batch timestamp, the same in a replay: never the wall clock.
        processing_time_ms = int(state.getCurrentProcessingTimeMs())
        registry = snapshots.registry_at(processing_time_ms)
        batch = _sorted_batch(list(frames))
        if not batch.empty:
            offsets = batch["offset"]
            fault_hook.reached(FaultPoint.STATE_FUNCTION, int(offsets.min()), int(offsets.max()))
        keys = _load(state)
        out = _Output(batch)
        _process_bucket(batch, keys, registry, processing_time_ms, out)
        _save(state, keys, processing_time_ms)
        yield out.frame()

    return process


def _sorted_batch(frames: list[pd.DataFrame]) -> pd.DataFrame:
    if not frames:
        return pd.DataFrame(columns=_EMPTY_BATCH_COLUMNS)
    batch = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    # SPEC §2: a key's records are handled in (partition, offset) order. Malformed records have
    # no key; they sort last and only go to quarantine.
    return batch.sort_values(
        ["tenant", "source", "partition", "offset"], kind="stable", na_position="last"
    ).reset_index(drop=True)


def _process_bucket(
    batch: pd.DataFrame,
    keys: BucketState,
    registry: TenantRegistry,
    processing_time_ms: int,
    out: _Output,
) -> None:
    reasons: list[str | None] = batch["reason"].tolist()
    errors: list[str | None] = batch["error"].tolist()
    tenants = _strings(batch["tenant"])
    sources = _strings(batch["source"])
    event_times: list[Any] = batch["event_time_ms"].tolist() if "event_time_ms" in batch else []
    metric_inputs: list[str | None] = (
        batch["metric_inputs_json"].tolist() if "metric_inputs_json" in batch else []
    )
    processed: set[Key] = set()
    for first, last in _key_runs(tenants, sources):
        tenant, source = tenants[first], sources[first]
        resolved = registry.resolve(tenant, source) if tenant and source else None
        accepted: list[int] = []
        for index in range(first, last):
            if reasons[index] is not None:
                continue
            if resolved is None:
                reasons[index], errors[index] = QuarantineReason.UNKNOWN_SOURCE.value, "no rules"
            elif event_times[index] > processing_time_ms + resolved.rules.max_future_skew_ms:
                # One bad clock must not move the key's watermark and close its windows early.
                reasons[index] = QuarantineReason.FUTURE_SKEW.value
                errors[index] = _future_skew_error(
                    int(event_times[index]), processing_time_ms, resolved.rules.max_future_skew_ms
                )
            else:
                accepted.append(index)
        if resolved is None or tenant is None or source is None:
            continue
        key = (tenant, source)
        stored = keys.get(key)
        stored.quarantined_records += (last - first) - len(accepted)
        records = [
            RecordInput(int(event_times[index]), _metric_inputs(metric_inputs, index))
            for index in accepted
        ]
        result = advance(stored.key_state, records, resolved.rules, processing_time_ms)
        _after_advance(stored, resolved.rules.idle_timeout_ms, processing_time_ms)
        out.add_result(key, accepted, result)
        out.add_status(key, stored, processing_time_ms)
        processed.add(key)
    for key in keys.idle_keys(processing_time_ms):
        if key in processed:
            continue
        resolved = registry.resolve(*key)
        if resolved is None:
            continue  # a key whose config is gone keeps its state; see the closing note
        stored = keys.get(key)
        result = advance(stored.key_state, [], resolved.rules, processing_time_ms)
        _after_advance(stored, resolved.rules.idle_timeout_ms, processing_time_ms)
        out.add_result(key, [], result)
        out.add_status(key, stored, processing_time_ms)
    out.set_quarantine(reasons, errors)


def _strings(column: pd.Series) -> list[str | None]:
    # Nulls may arrive as None or NaN; both mean "no key".
    return [value if isinstance(value, str) else None for value in column.tolist()]


def _key_runs(tenants: list[str | None], sources: list[str | None]) -> Iterator[tuple[int, int]]:
    """[first, last) index ranges of equal (tenant, source) in a sorted batch."""
    first = 0
    for index in range(1, len(tenants) + 1):
        if (
            index == len(tenants)
            or tenants[index] != tenants[first]
            or sources[index] != sources[first]
        ):
            yield first, index
            first = index


def _metric_inputs(metric_inputs: list[str | None], index: int) -> dict[str, float | None]:
    text = metric_inputs[index] if metric_inputs else None
    return json.loads(text) if text else {}


def _future_skew_error(event_time_ms: int, processing_time_ms: int, max_skew_ms: int) -> str:
    return (
        f"event time {event_time_ms} is {event_time_ms - processing_time_ms} ms ahead of "
        f"processing time {processing_time_ms}; max_future_skew is {max_skew_ms} ms"
    )


def _after_advance(stored: StoredKey, idle_timeout_ms: int | None, processing_time_ms: int) -> None:
    # Call this key again when it has been idle that long, to advance its watermark.
    stored.idle_deadline_ms = (
        processing_time_ms + idle_timeout_ms
        if idle_timeout_ms is not None and stored.key_state.windows
        else None
    )


def _load(state: GroupState) -> BucketState:
    if not state.exists:
        return BucketState()
    layout, blob = state.get
    if layout != STATE_LAYOUT:
        # `checkpoint_identity` refuses such checkpoints before the query starts.
        raise RuntimeError(f"state layout {layout} in the checkpoint; this code reads layout 2")
    return BucketState.from_bytes(blob)


def _save(state: GroupState, keys: BucketState, processing_time_ms: int) -> None:
    if len(keys) == 0:
        if state.exists:
            state.remove()
        return
    state.update((STATE_LAYOUT, keys.to_bytes()))
    deadline_ms = keys.next_idle_deadline_ms()
    if deadline_ms is not None:
        state.setTimeoutDuration(max(1, deadline_ms - processing_time_ms))


@dataclass
class _Output:
    """The union rows of one bucket call, gathered as columns and built into one frame."""

    batch: pd.DataFrame
    event_indexes: list[int] = field(default_factory=list)
    event_columns: dict[str, list[Any]] = field(default_factory=dict)
    late_indexes: list[int] = field(default_factory=list)
    late_columns: dict[str, list[Any]] = field(default_factory=dict)
    pane_columns: dict[str, list[Any]] = field(default_factory=dict)
    status_columns: dict[str, list[Any]] = field(default_factory=dict)
    quarantine_mask: np.ndarray | None = None

    def add_result(self, key: Key, accepted: list[int], result: BatchResult) -> None:
        tenant, source = key
        for assignment in result.assignments:
            self.event_indexes.append(accepted[assignment.record_index])
            _append(
                self.event_columns,
                tenant=tenant,
                source=source,
                window_id=assignment.window_id,
                window_start_ms=assignment.window_start_ms,
                window_end_ms=assignment.window_end_ms,
                pane_index=assignment.pane_index,
                timing=assignment.timing.value,
            )
        for too_late in result.too_late:
            self.late_indexes.append(accepted[too_late.record_index])
            _append(
                self.late_columns,
                tenant=tenant,
                source=source,
                window_start_ms=too_late.window_start_ms,
                window_end_ms=too_late.window_end_ms,
                lateness_ms=too_late.lateness_ms,
                watermark_ms=too_late.watermark_ms,
            )
        for pane in result.panes:
            _append(
                self.pane_columns,
                tenant=tenant,
                source=source,
                window_id=pane.window_id,
                window_start_ms=pane.window_start_ms,
                window_end_ms=pane.window_end_ms,
                pane_index=pane.pane_index,
                timing=pane.timing.value,
                is_final=pane.is_final,
                count=pane.count,
                metrics_json=json.dumps(pane.metrics, sort_keys=True),
                merged_window_ids_json=json.dumps(list(pane.merged_window_ids)),
                watermark_ms=pane.watermark_ms,
            )

    def add_status(self, key: Key, stored: StoredKey, processing_time_ms: int) -> None:
        key_state = stored.key_state
        _append(
            self.status_columns,
            tenant=key[0],
            source=key[1],
            watermark_ms=key_state.watermark_ms,
            max_event_time_ms=key_state.max_event_time_ms,
            open_windows=len(key_state.windows),
            last_record_processing_ms=key_state.last_record_processing_ms,
            processing_time_ms=processing_time_ms,
            on_time_records=key_state.on_time_records,
            late_records=key_state.late_records,
            too_late_records=key_state.too_late_records,
            quarantined_records=stored.quarantined_records,
        )

    def set_quarantine(self, reasons: list[str | None], errors: list[str | None]) -> None:
        if not reasons:
            return
        self.batch["reason"] = reasons
        self.batch["error"] = errors
        self.quarantine_mask = self.batch["reason"].notna().to_numpy()

    def frame(self) -> pd.DataFrame:
        parts = [
            self._record_rows(EVENTS.name, self.event_indexes, self.event_columns),
            self._record_rows(LATE_EVENTS.name, self.late_indexes, self.late_columns),
            _column_rows(WINDOWS.name, self.pane_columns),
            _column_rows(TENANT_STATUS.name, self.status_columns),
        ]
        if self.quarantine_mask is not None and self.quarantine_mask.any():
            rows = self.batch.loc[
                self.quarantine_mask,
                ["tenant", "source", *_RECORD_COLUMNS, "event_id", "reason", "error"],
            ]
            parts.append(rows.assign(kind=QUARANTINE.name))
        non_empty = [part for part in parts if not part.empty]
        rows = pd.concat(non_empty, ignore_index=True) if non_empty else pd.DataFrame()
        return output_frame(rows)

    def _record_rows(
        self, kind: str, indexes: list[int], columns: dict[str, list[Any]]
    ) -> pd.DataFrame:
        if not indexes:
            return pd.DataFrame()
        rows = self.batch.iloc[indexes][[*_RECORD_COLUMNS, "event_time_ms", "event_id"]]
        rows = rows.reset_index(drop=True)
        return rows.assign(kind=kind, **columns)


def _append(columns: dict[str, list[Any]], **values: Any) -> None:
    for name, value in values.items():
        columns.setdefault(name, []).append(value)


def _column_rows(kind: str, columns: dict[str, list[Any]]) -> pd.DataFrame:
    if not columns:
        return pd.DataFrame()
    return pd.DataFrame(columns).assign(kind=kind)


def output_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """Every output column, in schema order, with nullable dtypes."""
    return rows.reindex(columns=list(_OUTPUT_DTYPES)).astype(_OUTPUT_DTYPES)
