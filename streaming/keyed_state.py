"""Spark stage 2: `applyInPandasWithState` per hash bucket of keys, around `windowing.advance`.

Spark pays a fixed cost for every group it hands to Python, so grouping by (tenant, source)
made 10,000 tenants many times slower than 10. The stream therefore groups by
`bucket = pmod(xxhash64(tenant, source), state_buckets)`, and each group call does, for all the
keys of its bucket at once:

1. sort the bucket's records by (tenant, source, partition, offset): SPEC §2's per-key order;
2. when the tenant config changed since the bucket last looked, close the keys whose config
   is gone (offboarding): each open window gets its final pane, and the key's state is dropped;
3. quarantine what cannot be accepted (unknown key, clock too far ahead), as whole columns;
4. run the windowing for the keys with records and the idle keys (`idle_timeout`): the keys
   with fixed windows, by rule set, all at once as columns (`bucket_windowing`); sessions and
   keys whose open windows were opened with older rules record by record (`windowing.advance`);
5. emit one union row per output row, tagged with the table it belongs to (`kind`), built
   column-wise once per bucket. The sink splits them by `kind`.

The per-key watermark is untouched by bucketing: each key keeps its own watermark and windows in
the bucket's state (`bucket_state`), whichever way it is advanced.

A bucket runs only when it has records or its processing-time timeout fires, so a bucket with
state always sets one: its first idle deadline or `config_recheck_interval` from now, whichever
comes first. Otherwise an offboarded key with no records and no idle timeout would never close.
"""

from __future__ import annotations

import gc
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql.pandas.types import to_arrow_schema
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
from streaming.bucket_windowing import (
    BucketAdvance,
    RecordColumns,
    advance_bucket,
    handles_window,
    metric_names,
    optional_times,
    window_ids,
)
from streaming.hooks import NO_FAULTS, FaultHook, FaultPoint
from streaming.key_summary import BucketSummary, summarise_bucket
from streaming.offboarding import close_all_windows
from streaming.parsing import QuarantineReason
from streaming.windowing import (
    Assignment,
    BatchResult,
    Pane,
    RecordInput,
    Timing,
    TooLate,
    advance,
)
from tenants.config_store import ConfigSnapshots
from tenants.models import WindowRules
from tenants.registry import ResolvedSource, TenantRegistry

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
    ("lifecycle", StringType()),
]
OUTPUT_SCHEMA = StructType([StructField(name, data_type) for name, data_type in _OUTPUT_FIELDS])
# pyspark 4.2 lower-cases nested state schemas on the worker: keep the state flat.
STATE_SCHEMA = StructType(
    [StructField("layout", IntegerType()), StructField("keys_arrow", BinaryType())]
)

OUTPUT_ARROW_SCHEMA = to_arrow_schema(OUTPUT_SCHEMA)
_NULLABLE_PANDAS_TYPES = {
    pa.int64(): pd.Int64Dtype(),
    pa.int32(): pd.Int32Dtype(),
    pa.bool_(): pd.BooleanDtype(),
}
_RECORD_COLUMNS = ["topic", "partition", "offset", "kafka_timestamp_ms", "key", "value"]
_EMPTY_BATCH_COLUMNS = ["tenant", "source", "partition", "offset", "reason", "error"]

BucketProcessor = Callable[[Any, Iterable[pd.DataFrame], GroupState], Iterator[pd.DataFrame]]


class Lifecycle(StrEnum):
    """Where a key stands, as its `tenant_status` rows say."""

    CONFIGURED = "configured"
    """Its config appeared in this batch; no record has been processed yet."""
    ACTIVE = "active"
    OFFBOARDED = "offboarded"
    """Its config is gone: its windows got their final panes and its state was dropped."""


class LatestSummaries(AccumulatorParam[dict[int, BucketSummary]]):
    """A Spark accumulator of each bucket's latest `BucketSummary`, by bucket.

    The driver merges each task's updates in its accumulator server's thread while the metrics
    read the value in theirs, so a merge builds a new dict instead of changing the one read."""

    def zero(self, value: dict[int, BucketSummary]) -> dict[int, BucketSummary]:
        return {}

    def addInPlace(  # noqa: N802 (Spark's name)
        self, value1: dict[int, BucketSummary], value2: dict[int, BucketSummary]
    ) -> dict[int, BucketSummary]:
        merged = dict(value1)
        for bucket, summary in value2.items():
            held = merged.get(bucket)
            if held is None or held.processing_time_ms <= summary.processing_time_ms:
                merged[bucket] = summary
        return merged


@dataclass(frozen=True)
class KeySummaries:
    """Where the buckets report their keys for the metrics (`key_summary`); picklable."""

    accumulator: Accumulator[dict[int, BucketSummary]]
    top_tenants: int | None
    """Tenants each bucket lists, those with the oldest watermarks; None: all of them."""

    def report(self, bucket: int, keys: pa.Table, processing_time_ms: int) -> None:
        summary = summarise_bucket(keys, processing_time_ms, self.top_tenants)
        self.accumulator.add({bucket: summary})


def make_bucket_processor(
    snapshots: ConfigSnapshots,
    config_recheck_interval_ms: int,
    fault_hook: FaultHook = NO_FAULTS,
    key_summaries: KeySummaries | None = None,
) -> BucketProcessor:
    def process(
        bucket: Any, frames: Iterable[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        # The batch timestamp, the same in a replay: never the wall clock.
        processing_time_ms = int(state.getCurrentProcessingTimeMs())
        registry = snapshots.registry_at(processing_time_ms)
        batch = sorted_batch(list(frames))
        if not batch.empty:
            offsets = batch["offset"]
            fault_hook.reached(FaultPoint.STATE_FUNCTION, int(offsets.min()), int(offsets.max()))
        result = run_bucket(_stored_blob(state), batch, registry, processing_time_ms)
        _save(state, result, processing_time_ms, config_recheck_interval_ms)
        if key_summaries is not None:
            key_summaries.report(int(bucket[0]), result.keys, processing_time_ms)
        yield result.rows

    return process


@dataclass(frozen=True)
class BucketRun:
    rows: pd.DataFrame
    """The union rows of the bucket's batch."""
    blob: bytes | None
    """The bucket's new state; None: no key left."""
    next_idle_deadline_ms: int | None
    keys: pa.Table
    """Every key's state in `blob`, a row each (`bucket_state`'s columns)."""


def run_bucket(
    blob: bytes | None, batch: pd.DataFrame, registry: TenantRegistry, processing_time_ms: int
) -> BucketRun:
    """One bucket's batch, from its stored state to its rows and new state, free of Spark."""
    with cyclic_gc_paused():
        # A function of its own, so the decoded keys are freed before the collector resumes:
        # left alive, the collection that follows walks every one of them.
        return _run_bucket(blob, batch, registry, processing_time_ms)


def _run_bucket(
    blob: bytes | None, batch: pd.DataFrame, registry: TenantRegistry, processing_time_ms: int
) -> BucketRun:
    keys = BucketState.from_bytes(blob)
    out = _Output(batch)
    _process_bucket(batch, keys, registry, processing_time_ms, out)
    rows = keys.rows()
    return BucketRun(
        out.frame(),
        keys.to_bytes(rows) if rows.num_rows else None,
        keys.next_idle_deadline_ms(),
        rows,
    )


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cycle collector off for one bucket call.

    A call decodes thousands of keys' state into short-lived containers; each collection then
    walks every tracked object of the worker, the loaded tenant config included. At 10,000
    tenants that was a third of the bucket's CPU (`infra/dev/benchmarks/bucket_cost`).
    Reference counting still frees almost everything; the few cycles go at the next collection.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def sorted_batch(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """A bucket's routed records in one frame, in the order `run_bucket` needs."""
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
    event_times = _event_times(batch)
    metric_values: list[str | None] = (
        batch["metric_values_json"].tolist() if "metric_values_json" in batch else []
    )
    if keys.checked_fingerprint != registry.fingerprint:
        _offboard_gone_keys(keys, registry, processing_time_ms, out)
    runs = list(_key_runs(tenants, sources))
    routes = [
        registry.resolve(tenant, source)
        if (tenant := tenants[first]) and (source := sources[first])
        else None
        for first, _ in runs
    ]
    # Every record's fate in a few passes over the bucket, not a loop per key: a key of a
    # 100,000-tenant stream has one or two records a batch.
    run_lengths = [last - first for first, last in runs]
    known = np.repeat([route is not None for route in routes], run_lengths).astype(bool)
    # One bad clock must not move the key's watermark and close its windows early.
    latest_ms = processing_time_ms + np.repeat(
        [route.rules.max_future_skew_ms if route else 0 for route in routes], run_lengths
    ).astype(np.int64)
    unrejected = batch["reason"].isna().to_numpy()
    skewed = unrejected & known & (event_times > latest_ms)
    accepted = unrejected & known & ~skewed
    for index in np.flatnonzero(unrejected & ~known).tolist():
        # Routing quarantines these already with the same config; this keeps the reasons
        # right should the two ever disagree.
        reasons[index], errors[index] = _unknown_key(registry, tenants[index], sources[index])
    for index in np.flatnonzero(skewed).tolist():
        reasons[index] = QuarantineReason.FUTURE_SKEW.value
        errors[index] = _future_skew_error(
            int(event_times[index]), processing_time_ms, int(latest_ms[index]) - processing_time_ms
        )
    accepted_rows = np.flatnonzero(accepted)
    bounds = np.searchsorted(accepted_rows, [first for first, _ in runs] + [len(tenants)]).tolist()
    # Idle keys are found before any key is read out, as the stored rows say.
    idle = keys.idle_keys(processing_time_ms)
    work: list[_KeyWork] = []
    for number, ((first, last), resolved) in enumerate(zip(runs, routes, strict=True)):
        tenant, source = tenants[first], sources[first]
        if resolved is None or tenant is None or source is None:
            continue
        rows = accepted_rows[bounds[number] : bounds[number + 1]]
        work.append(_KeyWork((tenant, source), resolved, rows, (last - first) - len(rows)))
    with_records = {item.key for item in work}
    for key in idle:
        resolved = registry.resolve(*key)
        # None is not reached: `_offboard_gone_keys` dropped the keys whose config is gone.
        if key not in with_records and resolved is not None:
            work.append(_KeyWork(key, resolved, _NO_ROWS, 0))
    records = _Records(event_times, metric_values)
    groups, by_object = _column_groups(work, keys)
    keys.decode([item.key for item in by_object])
    for group, positions in groups:
        _advance_columns(group, positions, keys, records, processing_time_ms, out)
    for item in by_object:
        stored = keys.get(item.key)
        stored.quarantined_records += item.quarantined
        _advance_key(item, stored, records, processing_time_ms, out)
    out.set_quarantine(reasons, errors)


_NO_ROWS = np.zeros(0, np.int64)


@dataclass(frozen=True)
class _KeyWork:
    """A key the batch runs: its rules, its accepted records' rows, how many it quarantined."""

    key: Key
    resolved: ResolvedSource
    rows: np.ndarray
    quarantined: int


def _column_groups(
    work: list[_KeyWork], keys: BucketState
) -> tuple[list[tuple[list[_KeyWork], np.ndarray]], list[_KeyWork]]:
    """The keys `bucket_windowing` can advance, by rule set, each group with its keys' stored
    rows: fixed windows, and every open window opened with the key's current rules. Then the
    others, which go record by record."""
    fixed = [number for number, item in enumerate(work) if handles_window(item.resolved.rules)]
    if not fixed:
        return [], work
    usable, positions = keys.column_keys(
        [work[number].key for number in fixed], [work[number].resolved.rules_id for number in fixed]
    )
    by_rules: dict[str, list[int]] = {}
    for number in np.flatnonzero(usable).tolist():
        by_rules.setdefault(work[fixed[number]].resolved.rules_id, []).append(number)
    groups = [
        ([work[fixed[number]] for number in numbers], positions[numbers])
        for numbers in by_rules.values()
    ]
    by_columns = np.zeros(len(work), bool)
    by_columns[np.array(fixed)[usable]] = True
    return groups, [item for item, column in zip(work, by_columns, strict=True) if not column]


@dataclass(frozen=True)
class _Records:
    """The batch's event times and metric inputs, for the keys' rows to pick from."""

    event_times_ms: np.ndarray
    metric_values_json: list[str | None]
    """As the router wrote them: a JSON array per record, in the source's metric order."""

    def metric_matrix(self, rows: np.ndarray, rules: WindowRules) -> np.ndarray:
        """A row per record, a column per metric in `metric_names` order; NaN: no value."""
        names = list(rules.metrics)
        if not names or not len(rows):
            return np.zeros((len(rows), len(names)), np.float64)
        # One parse for all the rows: each is a JSON array of the source's metrics.
        texts = [self._values_json(row, len(names)) for row in rows.tolist()]
        values = np.array(orjson.loads("[" + ",".join(texts) + "]"), dtype=np.float64)
        stored_order = [names.index(name) for name in metric_names(rules)]
        return values.reshape(len(rows), len(names))[:, stored_order]

    def inputs(self, rows: np.ndarray, rules: WindowRules) -> list[RecordInput]:
        names = list(rules.metrics)
        return [
            RecordInput(
                int(self.event_times_ms[row]),
                dict(zip(names, orjson.loads(self._values_json(row, len(names))), strict=True))
                if names
                else {},
            )
            for row in rows.tolist()
        ]

    def _values_json(self, row: int, metrics: int) -> str:
        text = self.metric_values_json[row] if self.metric_values_json else None
        return text or "[" + ",".join(["null"] * metrics) + "]"


def _advance_columns(
    group: list[_KeyWork],
    positions: np.ndarray,
    keys: BucketState,
    records: _Records,
    processing_time_ms: int,
    out: _Output,
) -> None:
    """Advance a group of keys with the same rules together (`bucket_windowing`)."""
    resolved = group[0].resolved
    rules = resolved.rules
    columns = keys.take_columns([item.key for item in group], positions, len(rules.metrics))
    columns.quarantined_records += np.array([item.quarantined for item in group], np.int64)
    rows = np.concatenate([item.rows for item in group])
    record_key = np.repeat(np.arange(len(group)), [len(item.rows) for item in group])
    result = advance_bucket(
        columns,
        RecordColumns(record_key, records.event_times_ms[rows], records.metric_matrix(rows, rules)),
        rules,
        processing_time_ms,
    )
    keys.put_columns(result.keys, resolved.rules_id, rules.model_dump(mode="json"))
    out.add_columns(result, rows, record_key, metric_names(rules), processing_time_ms)


def _offboard_gone_keys(
    keys: BucketState, registry: TenantRegistry, processing_time_ms: int, out: _Output
) -> None:
    """Close and drop every key of the bucket that `registry` no longer configures.

    Called only when the config changed since the bucket last looked, so a bucket of many keys
    does not resolve each of them in every batch.
    """
    for key in sorted(keys.keys()):
        if registry.configures(*key):
            continue
        stored = keys.get(key)
        out.panes += [(key, pane) for pane in close_all_windows(stored.key_state)]
        out.add_status(key, stored, processing_time_ms, Lifecycle.OFFBOARDED)
        keys.drop(key)
    keys.checked_fingerprint = registry.fingerprint


def _unknown_key(
    registry: TenantRegistry, tenant: str | None, source: str | None
) -> tuple[str, str]:
    if tenant is None or not registry.knows_tenant(tenant):
        return QuarantineReason.UNKNOWN_TENANT.value, f"tenant {tenant!r} is not configured"
    return (
        QuarantineReason.UNKNOWN_SOURCE.value,
        f"source {source!r} is not configured for tenant {tenant!r}",
    )


def _advance_key(
    item: _KeyWork,
    stored: StoredKey,
    records: _Records,
    processing_time_ms: int,
    out: _Output,
) -> None:
    """Run one key's batch (or its idle timeout, with no records) record by record."""
    rules, state = item.resolved.rules, stored.key_state
    inputs = records.inputs(item.rows, rules)
    result = advance(state, inputs, rules, processing_time_ms, item.resolved.rules_id)
    out.add_result(item.key, item.rows.tolist(), result)
    # Call this key again when it has been idle that long, to advance its watermark.
    stored.idle_deadline_ms = (
        processing_time_ms + rules.idle_timeout_ms
        if rules.idle_timeout_ms is not None and state.windows
        else None
    )
    out.add_status(item.key, stored, processing_time_ms, Lifecycle.ACTIVE)


def _event_times(batch: pd.DataFrame) -> np.ndarray:
    """Event times as int64 (-1 where a record has none: those are quarantined already)."""
    if "event_time_ms" not in batch:
        return np.zeros(len(batch), dtype=np.int64)
    times: np.ndarray = batch["event_time_ms"].to_numpy(dtype=np.float64, na_value=-1.0)
    return times.astype(np.int64)


def _strings(column: pd.Series) -> list[str | None]:
    # Nulls may arrive as None or NaN; both mean "no key".
    return [value if isinstance(value, str) else None for value in column.tolist()]


def _key_runs(tenants: list[str | None], sources: list[str | None]) -> Iterator[tuple[int, int]]:
    """[first, last) index ranges of equal (tenant, source) in a sorted batch."""
    if not tenants:
        return
    tenant_column = np.array(tenants, dtype=object)
    source_column = np.array(sources, dtype=object)
    changes = (tenant_column[1:] != tenant_column[:-1]) | (source_column[1:] != source_column[:-1])
    bounds = [0, *(np.flatnonzero(changes) + 1).tolist(), len(tenants)]
    yield from itertools.pairwise(bounds)


def _future_skew_error(event_time_ms: int, processing_time_ms: int, max_skew_ms: int) -> str:
    return (
        f"event time {event_time_ms} is {event_time_ms - processing_time_ms} ms ahead of "
        f"processing time {processing_time_ms}; max_future_skew is {max_skew_ms} ms"
    )


def _stored_blob(state: GroupState) -> bytes | None:
    if not state.exists:
        return None
    layout, blob = state.get
    if layout != STATE_LAYOUT:
        # `checkpoint_identity` refuses such checkpoints before the query starts.
        raise RuntimeError(
            f"state layout {layout} in the checkpoint; this code reads layout {STATE_LAYOUT}"
        )
    stored: bytes = blob
    return stored


def _save(
    state: GroupState, result: BucketRun, processing_time_ms: int, config_recheck_interval_ms: int
) -> None:
    if result.blob is None:
        if state.exists:
            state.remove()
        return
    state.update((STATE_LAYOUT, result.blob))
    state.setTimeoutDuration(
        wake_up_after_ms(
            result.next_idle_deadline_ms, processing_time_ms, config_recheck_interval_ms
        )
    )


def wake_up_after_ms(
    idle_deadline_ms: int | None, processing_time_ms: int, config_recheck_interval_ms: int
) -> int:
    """How long until a bucket with state must run again: its first idle deadline, or the next
    look at the config, so the keys of an offboarded tenant close even if nothing arrives."""
    recheck_at_ms = processing_time_ms + config_recheck_interval_ms
    wake_at_ms = recheck_at_ms if idle_deadline_ms is None else min(idle_deadline_ms, recheck_at_ms)
    return max(1, wake_at_ms - processing_time_ms)


@dataclass
class _Output:
    """The union rows of one bucket call, gathered per table and built into one frame.

    Keys advanced as columns give their rows as Arrow tables at once. Keys that went record by
    record give windowing objects, turned into columns once per bucket, one list comprehension
    per column. The union is assembled in Arrow, where a column another table does not have
    costs one null array, and converted to pandas once.
    """

    batch: pd.DataFrame
    tables: list[pa.Table] = field(default_factory=list)
    """Rows of the keys advanced as columns."""
    assignments: list[tuple[Key, int, Assignment]] = field(default_factory=list)
    too_late: list[tuple[Key, int, TooLate]] = field(default_factory=list)
    panes: list[tuple[Key, Pane]] = field(default_factory=list)
    statuses: list[tuple[Key, StoredKey, int, Lifecycle]] = field(default_factory=list)
    quarantine_mask: np.ndarray | None = None

    def add_columns(
        self,
        result: BucketAdvance,
        rows: np.ndarray,
        record_key: np.ndarray,
        names: list[str],
        processing_time_ms: int,
    ) -> None:
        """The rows of keys advanced together: `rows[i]` is record i's row in the batch,
        `record_key[i]` its key in `result.keys`."""
        keys, panes = result.keys, result.panes
        placed, rejected = result.placements, result.rejections

        def record_columns(kind: str, record: np.ndarray) -> dict[str, Any]:
            key = record_key[record]
            return self._record_columns(kind, rows[record], keys.tenant[key], keys.source[key])

        if len(placed.record_index):
            record = placed.record_index
            self.tables.append(
                union_table(
                    {
                        **record_columns(EVENTS.name, record),
                        "window_id": window_ids(placed.window_start_ms, placed.window_end_ms),
                        "window_start_ms": placed.window_start_ms,
                        "window_end_ms": placed.window_end_ms,
                        "pane_index": placed.pane_index,
                        "timing": np.where(placed.late, Timing.LATE.value, Timing.ON_TIME.value),
                    },
                    len(record),
                )
            )
        if len(rejected.record_index):
            record = rejected.record_index
            self.tables.append(
                union_table(
                    {
                        **record_columns(LATE_EVENTS.name, record),
                        "window_start_ms": rejected.window_start_ms,
                        "window_end_ms": rejected.window_end_ms,
                        "lateness_ms": rejected.watermark_ms - rejected.window_end_ms,
                        "watermark_ms": rejected.watermark_ms,
                    },
                    len(record),
                )
            )
        if len(panes.key):
            self.tables.append(
                union_table(
                    {
                        "kind": [WINDOWS.name] * len(panes.key),
                        "tenant": keys.tenant[panes.key],
                        "source": keys.source[panes.key],
                        "window_id": window_ids(panes.window_start_ms, panes.window_end_ms),
                        "window_start_ms": panes.window_start_ms,
                        "window_end_ms": panes.window_end_ms,
                        "pane_index": panes.pane_index,
                        "timing": np.where(panes.late, Timing.LATE.value, Timing.ON_TIME.value),
                        "is_final": panes.is_final,
                        "count": panes.count,
                        "metrics_json": panes.metrics_json(names),
                        "merged_window_ids_json": ["[]"] * len(panes.key),
                        "watermark_ms": optional_times(panes.watermark_ms),
                    },
                    len(panes.key),
                )
            )
        count = len(keys.tenant)
        self.tables.append(
            union_table(
                {
                    "kind": [TENANT_STATUS.name] * count,
                    "tenant": keys.tenant,
                    "source": keys.source,
                    "watermark_ms": optional_times(keys.watermark_ms),
                    "max_event_time_ms": optional_times(keys.max_event_time_ms),
                    "open_windows": np.bincount(keys.windows.key, minlength=count),
                    "last_record_processing_ms": optional_times(keys.last_record_processing_ms),
                    "processing_time_ms": np.full(count, processing_time_ms, np.int64),
                    "on_time_records": keys.on_time_records,
                    "late_records": keys.late_records,
                    "too_late_records": keys.too_late_records,
                    "quarantined_records": keys.quarantined_records,
                    "lifecycle": [Lifecycle.ACTIVE.value] * count,
                },
                count,
            )
        )

    def add_result(self, key: Key, rows: list[int], result: BatchResult) -> None:
        self.assignments += [(key, rows[a.record_index], a) for a in result.assignments]
        self.too_late += [(key, rows[t.record_index], t) for t in result.too_late]
        self.panes += [(key, pane) for pane in result.panes]

    def add_status(
        self, key: Key, stored: StoredKey, processing_time_ms: int, lifecycle: Lifecycle
    ) -> None:
        self.statuses.append((key, stored, processing_time_ms, lifecycle))

    def set_quarantine(self, reasons: list[str | None], errors: list[str | None]) -> None:
        if not reasons:
            return
        self.batch["reason"] = reasons
        self.batch["error"] = errors
        self.quarantine_mask = self.batch["reason"].notna().to_numpy()

    def frame(self) -> pd.DataFrame:
        parts = [
            part
            for part in (
                *self.tables,
                self._event_rows(),
                self._late_rows(),
                self._pane_rows(),
                self._status_rows(),
                self._quarantine_rows(),
            )
            if part is not None
        ]
        table = pa.concat_tables(parts) if parts else OUTPUT_ARROW_SCHEMA.empty_table()
        return table.to_pandas(types_mapper=_NULLABLE_PANDAS_TYPES.get)

    def _event_rows(self) -> pa.Table | None:
        if not self.assignments:
            return None
        objects = [assignment for _, _, assignment in self.assignments]
        return union_table(
            {
                **self._object_record_columns(EVENTS.name, self.assignments),
                "window_id": [a.window_id for a in objects],
                "window_start_ms": [a.window_start_ms for a in objects],
                "window_end_ms": [a.window_end_ms for a in objects],
                "pane_index": [a.pane_index for a in objects],
                "timing": [a.timing.value for a in objects],
            },
            len(objects),
        )

    def _late_rows(self) -> pa.Table | None:
        if not self.too_late:
            return None
        objects = [too_late for _, _, too_late in self.too_late]
        return union_table(
            {
                **self._object_record_columns(LATE_EVENTS.name, self.too_late),
                "window_start_ms": [t.window_start_ms for t in objects],
                "window_end_ms": [t.window_end_ms for t in objects],
                "lateness_ms": [t.lateness_ms for t in objects],
                "watermark_ms": [t.watermark_ms for t in objects],
            },
            len(objects),
        )

    def _object_record_columns(
        self, kind: str, objects: list[tuple[Key, int, Assignment]] | list[tuple[Key, int, TooLate]]
    ) -> dict[str, Any]:
        return self._record_columns(
            kind,
            np.array([row for _, row, _ in objects], dtype=np.int64),
            [key[0] for key, _, _ in objects],
            [key[1] for key, _, _ in objects],
        )

    def _record_columns(
        self, kind: str, rows: np.ndarray, tenants: Any, sources: Any
    ) -> dict[str, Any]:
        """The batch's columns of these records, and their keys."""
        return {
            **self._batch_columns(rows, [*_RECORD_COLUMNS, "event_time_ms", "event_id"]),
            "kind": [kind] * len(rows),
            "tenant": tenants,
            "source": sources,
        }

    def _quarantine_rows(self) -> pa.Table | None:
        if self.quarantine_mask is None or not self.quarantine_mask.any():
            return None
        indexes = np.flatnonzero(self.quarantine_mask)
        columns = ["tenant", "source", *_RECORD_COLUMNS, "event_id", "reason", "error"]
        return union_table(
            {**self._batch_columns(indexes, columns), "kind": [QUARANTINE.name] * len(indexes)},
            len(indexes),
        )

    def _batch_columns(self, indexes: np.ndarray, names: list[str]) -> dict[str, Any]:
        """The batch's rows at `indexes`, in the given columns."""
        return {name: self.batch[name].take(indexes) for name in names}

    def _pane_rows(self) -> pa.Table | None:
        if not self.panes:
            return None
        panes = [pane for _, pane in self.panes]
        return union_table(
            {
                "kind": [WINDOWS.name] * len(panes),
                "tenant": [key[0] for key, _ in self.panes],
                "source": [key[1] for key, _ in self.panes],
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
            },
            len(panes),
        )

    def _status_rows(self) -> pa.Table | None:
        if not self.statuses:
            return None
        stored_keys = [stored for _, stored, _, _ in self.statuses]
        states = [stored.key_state for stored in stored_keys]
        return union_table(
            {
                "kind": [TENANT_STATUS.name] * len(states),
                "tenant": [key[0] for key, _, _, _ in self.statuses],
                "source": [key[1] for key, _, _, _ in self.statuses],
                "watermark_ms": [state.watermark_ms for state in states],
                "max_event_time_ms": [state.max_event_time_ms for state in states],
                "open_windows": [len(state.windows) for state in states],
                "last_record_processing_ms": [state.last_record_processing_ms for state in states],
                "processing_time_ms": [now_ms for _, _, now_ms, _ in self.statuses],
                "on_time_records": [state.on_time_records for state in states],
                "late_records": [state.late_records for state in states],
                "too_late_records": [state.too_late_records for state in states],
                "quarantined_records": [stored.quarantined_records for stored in stored_keys],
                "lifecycle": [lifecycle.value for _, _, _, lifecycle in self.statuses],
            },
            len(states),
        )


def union_table(columns: dict[str, Any], rows: int) -> pa.Table:
    """A table of the union schema: `columns` as given, every other column null.

    A column is a list of values, a NumPy array or a column of the batch (a pandas Series).
    """
    arrays = [
        _arrow_column(columns[field.name], field.type)
        if field.name in columns
        else pa.nulls(rows, field.type)
        for field in OUTPUT_ARROW_SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=OUTPUT_ARROW_SCHEMA)


def _arrow_column(values: Any, arrow_type: pa.DataType) -> pa.Array:
    if isinstance(values, pa.Array):
        return values if values.type == arrow_type else values.cast(arrow_type)
    if isinstance(values, pd.Series):
        # A column of the batch: pandas' missing values (None, NaN or NA) become nulls.
        return pa.Array.from_pandas(values, type=arrow_type)
    return pa.array(values, arrow_type)
