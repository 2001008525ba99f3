"""Spark stage 2: `applyInPandasWithState` per hash bucket of keys, around `key_windows.advance`.

Spark pays a fixed cost for every group it hands to Python, so grouping by (tenant, source)
made 10,000 tenants many times slower than 10. The stream therefore groups by a hash bucket of
the key (`bucket_placement`), and each group call does, for all the keys of its bucket at once:

1. sort the bucket's records by (tenant, source, partition, offset): contract §2's per-key order;
2. when the tenant config changed since the bucket last looked, close the keys whose config
   is gone (offboarding): each open window gets its final pane, and the key's state is dropped;
3. quarantine what cannot be accepted (unknown key, clock too far ahead), as whole columns;
4. run the windowing for the keys with records and the idle keys (`idle_timeout`): the keys
   with fixed windows, by rule set, all at once as columns (`columnar_windows`); sessions and
   keys whose open windows were opened with older rules record by record (`key_windows.advance`);
5. emit one union row per output row, tagged with the table it belongs to (`kind`), built
   column-wise once per bucket (`union_rows`) and handed to Spark packed as a few Arrow IPC
   values (`storage.lake.packed_rows`). The sink's writer splits them by `kind`.

The per-key watermark is untouched by bucketing: each key keeps its own watermark and windows in
the bucket's state (`bucket_state`), whichever way it is advanced.

A bucket runs only when it has records or its processing-time timeout fires, so a bucket with
state always sets one: its first idle deadline or `config_recheck_interval` from now, whichever
comes first. Otherwise an offboarded key with no records and no idle timeout would never close.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql.streaming.state import GroupState

from storage.lake.packed_rows import PACKED_COLUMN, packed
from streaming.fault_points import NO_FAULTS, FaultHook, FaultPoint
from streaming.records.bulk_parsing import METRIC_VALUE_DTYPE, unpacked_metric_values
from streaming.records.parsing import QuarantineReason
from streaming.state.bucket_state import BucketState, Key, StoredKey
from streaming.state.key_summary import BucketSummary, summarise_bucket
from streaming.state.state_layouts import StateLayout
from streaming.state.union_rows import (
    Lifecycle,
    UnionRows,
)
from streaming.windowing.closing import close_all_windows
from streaming.windowing.columnar_windows import (
    RecordColumns,
    advance_bucket,
    handles_window,
    metric_names,
)
from streaming.windowing.key_state import RecordInput
from streaming.windowing.key_windows import advance
from tenants.config_store import ConfigSnapshots
from tenants.models import WindowRules
from tenants.registry import ResolvedSource, TenantRegistry

_EMPTY_BATCH_COLUMNS = ["tenant", "source", "partition", "offset", "reason", "error"]

BucketProcessor = Callable[[Any, Iterable[pd.DataFrame], GroupState], Iterator[pd.DataFrame]]


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
    layout: StateLayout,
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
        blob = layout.blob(state.get) if state.exists else None
        result = run_bucket(blob, batch, registry, processing_time_ms)
        _save(state, layout, result, processing_time_ms, config_recheck_interval_ms)
        if key_summaries is not None:
            key_summaries.report(int(bucket[0]), result.keys, processing_time_ms)
        yield pd.DataFrame({PACKED_COLUMN: packed(result.rows)}, dtype=object)

    return process


@dataclass(frozen=True)
class BucketRun:
    rows: pa.Table
    """The union rows of the bucket's batch (`union_rows.OUTPUT_ARROW_SCHEMA`)."""
    blob: bytes | None
    """The bucket's new state; None: no key left."""
    next_idle_deadline_ms: int | None
    keys: pa.Table
    """Every key in `blob`, a row each: what the metrics sum up (`BucketState.summary_rows`)."""


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
    out = UnionRows(batch)
    _process_bucket(batch, keys, registry, processing_time_ms, out)
    summary_rows = keys.summary_rows()
    return BucketRun(
        out.table(),
        keys.to_bytes() if summary_rows.num_rows else None,
        keys.next_idle_deadline_ms(),
        summary_rows,
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
    # contract §2: a key's records are handled in (partition, offset) order. Malformed records have
    # no key; they sort last and only go to quarantine. Arrow sorts the strings in C++ (pandas
    # builds a categorical of each first): half the time for a bucket's batch.
    sort_keys = pa.table(
        {
            name: pa.array(batch[name].to_numpy(), from_pandas=True)
            for name in ["tenant", "source", "partition", "offset"]
        }
    )
    order = pc.sort_indices(
        sort_keys, [(name, "ascending", "at_end") for name in sort_keys.column_names]
    )
    return batch.take(order.to_numpy()).reset_index(drop=True)


def _process_bucket(
    batch: pd.DataFrame,
    keys: BucketState,
    registry: TenantRegistry,
    processing_time_ms: int,
    out: UnionRows,
) -> None:
    tenants = _strings(batch["tenant"])
    sources = _strings(batch["source"])
    event_times = _event_times(batch)
    metric_values = (
        batch["metric_values"].to_numpy(dtype=object)
        if "metric_values" in batch
        else np.zeros(0, dtype=object)
    )
    if keys.checked_fingerprint != registry.fingerprint:
        _offboard_gone_keys(keys, registry, processing_time_ms, out)
    firsts, lengths = _key_runs(tenants, sources)
    routes = [
        registry.resolve(tenant, source) if tenant and source else None
        for tenant, source in zip(tenants[firsts].tolist(), sources[firsts].tolist(), strict=True)
    ]
    # Every record's fate in a few passes over the bucket, not a loop per key: a key of a
    # 100,000-tenant stream has one or two records a batch.
    routed = np.array([route is not None for route in routes], bool)
    known = np.repeat(routed, lengths)
    # One bad clock must not move the key's watermark and close its windows early.
    latest_ms = processing_time_ms + np.repeat(
        np.array([route.rules.max_future_skew_ms if route else 0 for route in routes], np.int64),
        lengths,
    )
    unrejected = batch["reason"].isna().to_numpy()
    skewed = unrejected & known & (event_times > latest_ms)
    accepted = unrejected & known & ~skewed
    unknown = np.flatnonzero(unrejected & ~known)
    if len(unknown) or skewed.any():
        reasons: list[str | None] = batch["reason"].tolist()
        errors: list[str | None] = batch["error"].tolist()
        for index in unknown.tolist():
            # Routing quarantines these already with the same config; this keeps the reasons
            # right should the two ever disagree.
            reasons[index], errors[index] = _unknown_key(registry, tenants[index], sources[index])
        for index in np.flatnonzero(skewed).tolist():
            reasons[index] = QuarantineReason.FUTURE_SKEW.value
            errors[index] = _future_skew_error(
                int(event_times[index]),
                processing_time_ms,
                int(latest_ms[index]) - processing_time_ms,
            )
        out.set_quarantine(reasons, errors)
    # Idle keys are found before any key is read out, as the stored rows say.
    idle = keys.idle_keys(processing_time_ms)
    work = _Work.of_batch(tenants, sources, firsts, lengths, routes, routed, accepted)
    work.add_idle(idle, registry)
    records = _Records(event_times, metric_values)
    groups, by_object = _column_groups(work, keys)
    keys.decode([work.keys[number] for number in by_object])
    for numbers, positions in groups:
        _advance_columns(work, numbers, positions, keys, records, processing_time_ms, out)
    for number in by_object.tolist():
        item = work.key_work(number)
        stored = keys.get(item.key)
        stored.quarantined_records += item.quarantined
        _advance_key(item, stored, records, processing_time_ms, out)


@dataclass(frozen=True)
class _KeyWork:
    """A key run record by record: its rules, its accepted records' rows, how many it
    quarantined."""

    key: Key
    resolved: ResolvedSource
    rows: np.ndarray
    quarantined: int


@dataclass
class _Work:
    """The keys a batch runs, as columns: those with records, then idle ones without.

    Nothing here is an object per key but the key and its resolved rules, which the registry
    holds already; a key's records are found by its number in `record_key`."""

    keys: list[Key]
    routes: list[ResolvedSource]
    accepted_rows: np.ndarray
    """The batch's accepted records' rows, in batch order (so by key)."""
    record_key: np.ndarray
    """The key number of each of `accepted_rows`."""
    quarantined: np.ndarray
    """Per key, its records that were not accepted."""

    @classmethod
    def of_batch(
        cls,
        tenants: np.ndarray,
        sources: np.ndarray,
        firsts: np.ndarray,
        lengths: np.ndarray,
        routes: list[ResolvedSource | None],
        routed: np.ndarray,
        accepted: np.ndarray,
    ) -> _Work:
        """`routed`: which of `routes` is not None. A route is found only for a key with a
        tenant and a source (`_process_bucket`)."""
        kept = firsts[routed]
        kept_keys: list[Key] = list(
            zip(tenants[kept].tolist(), sources[kept].tolist(), strict=True)
        )
        kept_routes: list[ResolvedSource] = [route for route in routes if route is not None]
        number_of_run = np.full(len(routes), -1, np.int64)
        number_of_run[routed] = np.arange(len(kept_keys))
        accepted_rows = np.flatnonzero(accepted)
        # Accepted records have a route, so their key has a number; in batch order, the
        # numbers never fall.
        record_key = np.repeat(number_of_run, lengths)[accepted_rows]
        return cls(
            keys=kept_keys,
            routes=kept_routes,
            accepted_rows=accepted_rows,
            record_key=record_key,
            quarantined=lengths[routed] - np.bincount(record_key, minlength=len(kept_keys)),
        )

    def add_idle(self, idle: list[Key], registry: TenantRegistry) -> None:
        """Keys whose idle timeout fired, with no records in the batch."""
        if not idle:
            return
        with_records = set(self.keys)
        added = 0
        for key in idle:
            resolved = registry.resolve(*key)
            # None is not reached: `_offboard_gone_keys` dropped the keys whose config is gone.
            if key not in with_records and resolved is not None:
                self.keys.append(key)
                self.routes.append(resolved)
                added += 1
        self.quarantined = np.r_[self.quarantined, np.zeros(added, np.int64)]

    def rows_of(self, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The accepted rows of these keys (ascending numbers), and each one's place among
        them."""
        place = np.full(len(self.keys), -1, np.int64)
        place[numbers] = np.arange(len(numbers))
        placed = place[self.record_key]
        mine = placed >= 0
        return self.accepted_rows[mine], placed[mine]

    def key_work(self, number: int) -> _KeyWork:
        """One key's work, for the record-by-record path."""
        first, last = np.searchsorted(self.record_key, [number, number + 1]).tolist()
        return _KeyWork(
            self.keys[number],
            self.routes[number],
            self.accepted_rows[first:last],
            int(self.quarantined[number]),
        )


def _column_groups(
    work: _Work, keys: BucketState
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """The keys `columnar_windows` can advance, by rule set, each group with its keys' stored
    rows: fixed windows, and every open window opened with the key's current rules. Then the
    others, which go record by record. Keys are given by their numbers in `work`."""
    rules_ids = [route.rules_id for route in work.routes]
    handled: dict[str, bool] = {}
    for route in work.routes:
        if route.rules_id not in handled:
            handled[route.rules_id] = handles_window(route.rules)
    fixed = np.flatnonzero(np.array([handled[rules_id] for rules_id in rules_ids], bool))
    if not len(fixed):
        return [], np.arange(len(work.keys))
    usable, positions = keys.column_keys(
        [work.keys[number] for number in fixed.tolist()],
        [rules_ids[number] for number in fixed.tolist()],
    )
    by_columns = fixed[usable]
    group_ids = np.array([rules_ids[number] for number in by_columns.tolist()], dtype=object)
    groups = []
    for rules_id in dict.fromkeys(group_ids.tolist()):
        in_group = group_ids == rules_id
        groups.append((by_columns[in_group], positions[usable][in_group]))
    by_object = np.ones(len(work.keys), bool)
    by_object[by_columns] = False
    return groups, np.flatnonzero(by_object)


@dataclass(frozen=True)
class _Records:
    """The batch's event times and metric inputs, for the keys' rows to pick from."""

    event_times_ms: np.ndarray
    metric_values: np.ndarray
    """As the router packed them (`bulk_parsing.packed_metric_values`), a value per record
    (object), in the source's metric order; None: no metric values. Empty: the batch has no
    such column."""

    def metric_matrix(self, rows: np.ndarray, rules: WindowRules) -> np.ndarray:
        """A row per record, a column per metric in `metric_names` order; NaN: no value."""
        names = list(rules.metrics)
        if not names or not len(rows):
            return np.zeros((len(rows), len(names)), np.float64)
        # The rows' values side by side are the matrix's bytes: nothing to parse.
        packed = b"".join(self._packed(rows, len(names)))
        values = np.frombuffer(packed, METRIC_VALUE_DTYPE)
        stored_order = [names.index(name) for name in metric_names(rules)]
        return values.reshape(len(rows), len(names))[:, stored_order]

    def inputs(self, rows: np.ndarray, rules: WindowRules) -> list[RecordInput]:
        names = list(rules.metrics)
        packed = self._packed(rows, len(names))
        return [
            RecordInput(
                int(self.event_times_ms[row]),
                dict(zip(names, unpacked_metric_values(values), strict=True)) if names else {},
            )
            for row, values in zip(rows.tolist(), packed, strict=True)
        ]

    def _packed(self, rows: np.ndarray, metrics: int) -> list[bytes]:
        """These records' packed values, one of no values where a record has none."""
        nothing = np.full(metrics, np.nan, METRIC_VALUE_DTYPE).tobytes()
        if not len(self.metric_values):
            return [nothing] * len(rows)
        values = self.metric_values[rows]
        missing = pd.isna(values)
        if missing.any():
            values = np.where(missing, nothing, values)
        packed: list[bytes] = values.tolist()
        return packed


def _advance_columns(
    work: _Work,
    numbers: np.ndarray,
    positions: np.ndarray,
    keys: BucketState,
    records: _Records,
    processing_time_ms: int,
    out: UnionRows,
) -> None:
    """Advance a group of keys with the same rules together (`columnar_windows`)."""
    resolved = work.routes[int(numbers[0])]
    rules = resolved.rules
    columns = keys.take_columns(
        [work.keys[number] for number in numbers.tolist()], positions, len(rules.metrics)
    )
    columns.quarantined_records += work.quarantined[numbers]
    rows, record_key = work.rows_of(numbers)
    result = advance_bucket(
        columns,
        RecordColumns(record_key, records.event_times_ms[rows], records.metric_matrix(rows, rules)),
        rules,
        processing_time_ms,
    )
    keys.put_columns(result.keys, resolved.rules_id, rules.model_dump(mode="json"))
    out.add_columns(result, rows, record_key, metric_names(rules), processing_time_ms)


def _offboard_gone_keys(
    keys: BucketState, registry: TenantRegistry, processing_time_ms: int, out: UnionRows
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
    out: UnionRows,
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


def _strings(column: pd.Series) -> np.ndarray:
    """A string column as objects, None where missing: nulls may arrive as None or NaN, and
    both mean "no key"."""
    values: np.ndarray = column.to_numpy(dtype=object, copy=True)
    values[pd.isna(values)] = None
    return values


def _key_runs(tenants: np.ndarray, sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first index and the length of each run of equal (tenant, source) in a sorted batch
    (`_strings`)."""
    if not len(tenants):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    changes = (tenants[1:] != tenants[:-1]) | (sources[1:] != sources[:-1])
    firsts = np.r_[0, np.flatnonzero(changes) + 1].astype(np.int64)
    return firsts, np.diff(np.r_[firsts, len(tenants)])


def _future_skew_error(event_time_ms: int, processing_time_ms: int, max_skew_ms: int) -> str:
    return (
        f"event time {event_time_ms} is {event_time_ms - processing_time_ms} ms ahead of "
        f"processing time {processing_time_ms}; max_future_skew is {max_skew_ms} ms"
    )


def _save(
    state: GroupState,
    layout: StateLayout,
    result: BucketRun,
    processing_time_ms: int,
    config_recheck_interval_ms: int,
) -> None:
    if result.blob is None:
        if state.exists:
            state.remove()
        return
    state.update(layout.stored(result.blob))
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
