"""`key_windows.advance` for many keys at once: a bucket's keys and open windows as columns.

At 10,000 tenants a key has two or three records a batch, so any work per key (decoding its
state into objects, a call per record, encoding it again) costs more than the records. Here the
keys of a bucket that share one rule set of fixed windows (tumbling or sliding) are advanced
together with NumPy: their state is arrays with a row per key (`KeyColumns`) and a row per open
window (`WindowColumns`), and nothing loops over keys or records in Python.

`key_windows` stays the reference, one record at a time. This computes the same result:

- W before record i is the running maximum of `event time - out_of_orderness` over the key's
  records before it (a maximum per key segment), never below W at the batch's start, which the
  key's idle timeout may have raised first;
- a record's windows are integer arithmetic on its event time; a (record, window) pair is too
  late when W before it >= end + allowed lateness, late when W before it >= end, on time else.
  W never falls, so a window's on-time pairs come before its late ones, in record order;
- a window's ON_TIME pane is cut when W at the batch's end has reached its end: it holds what
  was pending plus the batch's on-time records. Late records are pending after it; they make a
  LATE pane at the batch's end; W past end + allowed lateness makes the last pane final;
- aggregates are folded in record order, one value at a time (a sum's last bits depend on its
  order), so they match the reference to the last bit.

Keys whose open windows were opened with other rules, and session windows, go through `advance`.
`tests/unit/streaming/windowing/test_columnar_windows.py` holds this to the reference on random
keys, rules and batches.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streaming.windowing.kinds import windower_of
from tenants.models import Accumulation, Emit, MetricKind, WindowRules

NO_TIME = np.iinfo(np.int64).min
"""A time that is not set (None in `KeyState`): below every real one, so `maximum` ignores it."""


def metric_names(rules: WindowRules) -> list[str]:
    """The order of a rule set's metrics in every metric array: by name, as the state stores it."""
    return sorted(rules.metrics)


def window_ids(start_ms: np.ndarray, end_ms: np.ndarray) -> pa.Array:
    """`<start>-<end>`, a fixed window's id (`windowing.place_in_fixed`), for many at once."""
    return pc.binary_join_element_wise(
        pc.cast(pa.array(start_ms, pa.int64()), pa.string()),
        pc.cast(pa.array(end_ms, pa.int64()), pa.string()),
        "-",
    )


def optional_times(times_ms: np.ndarray) -> pa.Array:
    """Times as Arrow, null where `NO_TIME`."""
    return pa.array(times_ms, pa.int64(), mask=times_ms == NO_TIME)


def handles_window(rules: WindowRules) -> bool:
    """Whether the rules' windows lie on a fixed grid, which this engine computes on columns."""
    return windower_of(rules.window).fixed_grid is not None


@dataclass
class AggregateColumns:
    """`windowing.Aggregates` of many windows: a row per window, a column per metric."""

    count: np.ndarray
    values: np.ndarray
    """float64; 0.0 where the metric has no value yet."""
    seen: np.ndarray
    """How many values each metric has folded in; 0: none (the metric's result is null)."""

    @classmethod
    def zeros(cls, windows: int, metrics: int) -> AggregateColumns:
        return cls(
            np.zeros(windows, np.int64),
            np.zeros((windows, metrics), np.float64),
            np.zeros((windows, metrics), np.int64),
        )

    def take(self, rows: np.ndarray) -> AggregateColumns:
        return AggregateColumns(self.count[rows], self.values[rows], self.seen[rows])

    def put(self, rows: np.ndarray, other: AggregateColumns) -> None:
        self.count[rows] = other.count
        self.values[rows] = other.values
        self.seen[rows] = other.seen

    def clear(self, rows: np.ndarray) -> None:
        self.put(rows, AggregateColumns.zeros(len(rows), self.values.shape[1]))

    def results(self, kinds: list[MetricKind]) -> tuple[np.ndarray, np.ndarray]:
        """Each metric's value per window, and where it is set (an aggregate of nothing is null,
        except a count, which is 0), as `Aggregates.results`."""
        with np.errstate(divide="ignore", invalid="ignore"):
            means = self.values / np.maximum(self.seen, 1)
        values = self.values.copy()
        present = self.seen > 0
        for column, kind in enumerate(kinds):
            if kind is MetricKind.MEAN:
                values[:, column] = means[:, column]
            elif kind is MetricKind.COUNT:
                present[:, column] = True
        return values, present


@dataclass
class WindowColumns:
    """Open windows, a row each, ordered by key, then start."""

    key: np.ndarray
    """The window's key: its row in `KeyColumns`."""
    start_ms: np.ndarray
    end_ms: np.ndarray
    next_pane_index: np.ndarray
    on_time_sealed: np.ndarray
    had_late_records: np.ndarray
    total: AggregateColumns
    pending: AggregateColumns

    @classmethod
    def empty(cls, metrics: int) -> WindowColumns:
        times = np.zeros(0, np.int64)
        return cls(
            times,
            times,
            times,
            times,
            np.zeros(0, bool),
            np.zeros(0, bool),
            AggregateColumns.zeros(0, metrics),
            AggregateColumns.zeros(0, metrics),
        )

    def take(self, rows: np.ndarray) -> WindowColumns:
        return WindowColumns(
            self.key[rows],
            self.start_ms[rows],
            self.end_ms[rows],
            self.next_pane_index[rows],
            self.on_time_sealed[rows],
            self.had_late_records[rows],
            self.total.take(rows),
            self.pending.take(rows),
        )


@dataclass
class KeyColumns:
    """`KeyState`s of many keys with the same rules: a row per key (times `NO_TIME` if unset)."""

    tenant: np.ndarray
    source: np.ndarray
    watermark_ms: np.ndarray
    max_event_time_ms: np.ndarray
    last_record_processing_ms: np.ndarray
    watermark_at_last_record_ms: np.ndarray
    on_time_records: np.ndarray
    late_records: np.ndarray
    too_late_records: np.ndarray
    quarantined_records: np.ndarray
    idle_deadline_ms: np.ndarray
    windows: WindowColumns


@dataclass(frozen=True)
class RecordColumns:
    """A batch's accepted records of those keys, ordered by key, then (partition, offset)."""

    key: np.ndarray
    event_time_ms: np.ndarray
    metric_values: np.ndarray
    """A row per record, a column per metric (`metric_names` order); NaN where it has none."""


@dataclass(frozen=True)
class Placements:
    """Accepted (record, window) pairs, as the reference lists `Assignment`s."""

    record_index: np.ndarray
    window_start_ms: np.ndarray
    window_end_ms: np.ndarray
    pane_index: np.ndarray
    late: np.ndarray


@dataclass(frozen=True)
class Rejections:
    """Too-late (record, window) pairs, as the reference lists `TooLate`s."""

    record_index: np.ndarray
    window_start_ms: np.ndarray
    window_end_ms: np.ndarray
    watermark_ms: np.ndarray


@dataclass(frozen=True)
class PaneColumns:
    """The panes fired, a row each, as the reference's `Pane`s (fixed windows merge nothing)."""

    key: np.ndarray
    window_start_ms: np.ndarray
    window_end_ms: np.ndarray
    pane_index: np.ndarray
    late: np.ndarray
    is_final: np.ndarray
    count: np.ndarray
    metric_values: np.ndarray
    metric_present: np.ndarray
    watermark_ms: np.ndarray

    def metrics_map(self, names: list[str]) -> pa.MapArray:
        """Each pane's metrics as the reference's `Pane.metrics`, by name (`names` sorted):
        a map per pane, null where a metric has no value."""
        panes, metrics = self.metric_values.shape
        return pa.MapArray.from_arrays(
            pa.array(np.arange(panes + 1, dtype=np.int32) * metrics),
            pa.array(np.tile(np.array(names, dtype=object), panes), pa.string()),
            pa.array(self.metric_values.ravel(), pa.float64(), mask=~self.metric_present.ravel()),
        )


@dataclass(frozen=True)
class BucketAdvance:
    keys: KeyColumns
    """The keys' new state."""
    placements: Placements
    rejections: Rejections
    panes: PaneColumns


def advance_bucket(
    keys: KeyColumns, records: RecordColumns, rules: WindowRules, processing_time_ms: int
) -> BucketAdvance:
    """`key_windows.advance` for every key of `keys` (rules `rules`, every open window opened with
    them), each with its records in `records`; keys without records only run their idle timeout.
    """
    grid = windower_of(rules.window).fixed_grid
    assert grid is not None, "sessions are key_windows' (handles_window)"
    size_ms, slide_ms = grid
    kinds = [rules.metrics[name].kind for name in metric_names(rules)]
    key_count = len(keys.tenant)
    start_watermark_ms = _after_idle_timeout(keys, rules, processing_time_ms)

    # W before each record, and at the batch's end, per key.
    record_key = records.key
    firsts = np.flatnonzero(np.r_[True, record_key[1:] != record_key[:-1]])[: len(record_key)]
    lasts = np.r_[firsts[1:] - 1, len(record_key) - 1][: len(firsts)]
    running_max_ms = _running_max_per_key(records.event_time_ms - rules.out_of_orderness_ms, firsts)
    before_ms = np.empty_like(running_max_ms)
    before_ms[1:] = running_max_ms[:-1]
    before_ms[firsts] = NO_TIME
    watermark_before_ms = np.maximum(before_ms, start_watermark_ms[record_key])
    final_watermark_ms = start_watermark_ms.copy()
    with_records = record_key[firsts]
    final_watermark_ms[with_records] = np.maximum(
        final_watermark_ms[with_records], running_max_ms[lasts]
    )

    # Every (record, window) pair, in record order, windows by start within a record.
    per_record = size_ms // slide_ms
    last_start_ms = records.event_time_ms - records.event_time_ms % slide_ms
    steps = np.arange(per_record - 1, -1, -1, dtype=np.int64) * slide_ms
    pair_start_ms = (last_start_ms[:, None] - steps[None, :]).ravel()
    pair_end_ms = pair_start_ms + size_ms
    pair_record = np.repeat(np.arange(len(record_key), dtype=np.int64), per_record)
    pair_key = record_key[pair_record]
    pair_watermark_ms = watermark_before_ms[pair_record]
    too_late = pair_watermark_ms >= pair_end_ms + rules.allowed_lateness_ms
    late = ~too_late & (pair_watermark_ms >= pair_end_ms)
    accepted = np.flatnonzero(~too_late)
    accepted_late = late[accepted]

    windows, window_of_pair = _batch_windows(
        keys.windows, pair_key[accepted], pair_start_ms[accepted], size_ms, len(kinds)
    )
    _seal_new_windows(windows, window_of_pair, pair_watermark_ms[accepted])
    on_time_pairs, late_pairs = accepted[~accepted_late], accepted[accepted_late]
    on_time_windows, late_windows = window_of_pair[~accepted_late], window_of_pair[accepted_late]
    keys = replace(
        keys,
        on_time_records=keys.on_time_records + _per(pair_key[on_time_pairs], key_count),
        late_records=keys.late_records + _per(pair_key[late_pairs], key_count),
        too_late_records=keys.too_late_records + _per(pair_key[too_late], key_count),
    )

    # What the watermark's rise does to each window, in the order the reference does it.
    fold = _Fold(records.metric_values, pair_record, kinds)
    panes = _Panes(windows, rules.accumulation is Accumulation.ACCUMULATING, kinds)
    fold.into(windows, on_time_windows, on_time_pairs)
    window_watermark_ms = final_watermark_ms[windows.key]
    reached_end = window_watermark_ms >= windows.end_ms
    on_time_pane_index = windows.next_pane_index.copy()
    cut_on_time = ~windows.on_time_sealed & reached_end & (windows.pending.count > 0)
    panes.cut(cut_on_time, late=False)
    windows.on_time_sealed |= reached_end
    late_pane_index = windows.next_pane_index.copy()
    fold.into(windows, late_windows, late_pairs)
    windows.had_late_records[late_windows] = True
    cut_late = windows.on_time_sealed & (windows.pending.count > 0)
    panes.cut(cut_late, late=True)
    closed = window_watermark_ms >= windows.end_ms + rules.allowed_lateness_ms
    # A window closed without a pane in this batch still gets a final one, maybe empty.
    panes.cut(closed & ~cut_on_time & ~cut_late, late=True)

    every_pane = rules.emit is Emit.EVERY_PANE
    fired = panes.every_pane(closed) if every_pane else panes.final_only(closed)
    pane_index = np.where(
        accepted_late, late_pane_index[window_of_pair], on_time_pane_index[window_of_pair]
    )
    return BucketAdvance(
        _after_batch(
            keys,
            records,
            firsts,
            final_watermark_ms,
            windows.take(np.flatnonzero(~closed)),
            rules,
            processing_time_ms,
        ),
        Placements(
            pair_record[accepted],
            pair_start_ms[accepted],
            pair_end_ms[accepted],
            pane_index if every_pane else np.zeros(len(accepted), np.int64),
            accepted_late,
        ),
        Rejections(
            pair_record[too_late],
            pair_start_ms[too_late],
            pair_end_ms[too_late],
            pair_watermark_ms[too_late],
        ),
        replace(fired, watermark_ms=final_watermark_ms[fired.key]),
    )


def _after_idle_timeout(
    keys: KeyColumns, rules: WindowRules, processing_time_ms: int
) -> np.ndarray:
    """W per key once its idle timeout has moved it (`KeyBatch.advance_idle_watermark`)."""
    watermark_ms: np.ndarray = keys.watermark_ms.copy()
    if rules.idle_timeout_ms is None:
        return watermark_ms
    known = (keys.last_record_processing_ms != NO_TIME) & (
        keys.watermark_at_last_record_ms != NO_TIME
    )
    idle_ms = processing_time_ms - np.where(
        known, keys.last_record_processing_ms, processing_time_ms
    )
    due = known & (idle_ms >= rules.idle_timeout_ms)
    moved_ms = np.where(due, keys.watermark_at_last_record_ms + idle_ms, NO_TIME)
    raised_ms: np.ndarray = np.maximum(watermark_ms, moved_ms)
    return raised_ms


def _running_max_per_key(values: np.ndarray, firsts: np.ndarray) -> np.ndarray:
    """The running maximum of `values` restarted at each key's first record.

    Each key's values are lifted above every earlier key's by a per-key offset, so one running
    maximum over the batch never carries a value from one key into the next. When the offsets
    could overflow (event times many centuries apart), keys are done one at a time.
    """
    if not len(values):
        return values.copy()
    low, high = int(values.min()), int(values.max())
    span = high - low + 1
    if span * len(firsts) >= 2**62:
        bounds = [*firsts.tolist(), len(values)]
        return np.concatenate(
            [np.maximum.accumulate(values[a:b]) for a, b in itertools.pairwise(bounds)]
        )
    per_key = np.diff(np.r_[firsts, len(values)])
    lifts = np.repeat(np.arange(len(firsts), dtype=np.int64) * span, per_key)
    lifted = (values - low) + lifts
    result: np.ndarray = np.maximum.accumulate(lifted) - lifts + low
    return result


def _per(keys_of_items: np.ndarray, key_count: int) -> np.ndarray:
    return np.bincount(keys_of_items, minlength=key_count).astype(np.int64)


def _batch_windows(
    stored: WindowColumns,
    pair_key: np.ndarray,
    pair_start_ms: np.ndarray,
    size_ms: int,
    metrics: int,
) -> tuple[WindowColumns, np.ndarray]:
    """The keys' open windows and those the accepted pairs open, ordered by (key, start), and
    each pair's window among them. New windows have `next_pane_index` -1 until sealed."""
    stored_count = len(stored.key)
    every_key = np.concatenate([stored.key, pair_key])
    every_start = np.concatenate([stored.start_ms, pair_start_ms])
    order = np.lexsort((every_start, every_key))
    sorted_key, sorted_start = every_key[order], every_start[order]
    begins = np.r_[
        True, (sorted_key[1:] != sorted_key[:-1]) | (sorted_start[1:] != sorted_start[:-1])
    ]
    begins = begins[: len(order)]
    number = np.empty(len(order), np.int64)
    number[order] = np.cumsum(begins) - 1
    count = int(begins.sum())
    windows = WindowColumns(
        sorted_key[begins],
        sorted_start[begins],
        sorted_start[begins] + size_ms,
        np.full(count, -1, np.int64),
        np.zeros(count, bool),
        np.zeros(count, bool),
        AggregateColumns.zeros(count, metrics),
        AggregateColumns.zeros(count, metrics),
    )
    existing = number[:stored_count]
    windows.end_ms[existing] = stored.end_ms
    windows.next_pane_index[existing] = stored.next_pane_index
    windows.on_time_sealed[existing] = stored.on_time_sealed
    windows.had_late_records[existing] = stored.had_late_records
    windows.total.put(existing, stored.total)
    windows.pending.put(existing, stored.pending)
    return windows, number[stored_count:]


def _seal_new_windows(
    windows: WindowColumns, window_of_pair: np.ndarray, pair_watermark_ms: np.ndarray
) -> None:
    """A new window is opened by its first accepted record; if that one is already late, the
    window never has an ON_TIME pane (`KeyBatch.open_window`)."""
    opened, first = np.unique(window_of_pair, return_index=True)
    new = windows.next_pane_index[opened] < 0
    opened = opened[new]
    windows.on_time_sealed[opened] = pair_watermark_ms[first[new]] >= windows.end_ms[opened]
    windows.next_pane_index[opened] = 0


class _Fold:
    """Folds records into windows' aggregates in record order, as `Aggregates.add` does one
    record at a time: per metric, a window's first value replaces nothing, then min, max or +."""

    by_window_only = False
    """Tests set it to fold every window one at a time."""

    def short_limit(self, lengths: np.ndarray) -> int:
        """Windows up to this many values are folded a position at a time across windows (a
        step per position of the longest), longer ones a window at a time (a step per window):
        the limit that takes fewest steps. At 10,000 tenants windows hold one or two values a
        batch; at 10 tenants dozens."""
        if self.by_window_only:
            return 0
        limits = np.r_[0, np.sort(lengths)]
        # With the k shortest windows by position: limits[k] steps, plus one per other window.
        steps = limits + np.arange(len(lengths), -1, -1)
        return int(limits[np.argmin(steps)])

    def __init__(
        self, metric_values: np.ndarray, pair_record: np.ndarray, kinds: list[MetricKind]
    ) -> None:
        self.metric_values = metric_values
        self.pair_record = pair_record
        self.kinds = kinds

    def into(self, windows: WindowColumns, window_of: np.ndarray, pairs: np.ndarray) -> None:
        if not len(pairs):
            return
        added = np.bincount(window_of, minlength=len(windows.key))
        windows.total.count += added
        windows.pending.count += added
        rows = self.pair_record[pairs]
        order = np.argsort(window_of, kind="stable")  # record order within each window
        for column, kind in enumerate(self.kinds):
            values = self.metric_values[rows[order], column]
            has_value = ~np.isnan(values)
            values, targets = values[has_value], window_of[order][has_value]
            if not len(values):
                continue
            starts = np.flatnonzero(np.r_[True, targets[1:] != targets[:-1]])
            lengths = np.diff(np.r_[starts, len(values)])
            short = lengths <= self.short_limit(lengths)
            by_position = _Runs(values, targets, starts[short], lengths[short])
            by_window = _Runs(values, targets, starts[~short], lengths[~short])
            for aggregates in (windows.total, windows.pending):
                by_position.fold_by_position(aggregates, column, kind)
                by_window.fold_by_window(aggregates, column, kind)


@dataclass(frozen=True)
class _Runs:
    """One metric's values to fold, grouped by window (each window's in record order)."""

    values: np.ndarray
    targets: np.ndarray
    """The window of each value."""
    starts: np.ndarray
    lengths: np.ndarray

    def fold_by_position(self, aggregates: AggregateColumns, column: int, kind: MetricKind) -> None:
        combine = _COMBINE[kind]
        for position in range(int(self.lengths.max(initial=0))):
            at = self.starts[self.lengths > position] + position
            window, value = self.targets[at], self.values[at]
            current, seen = aggregates.values[window, column], aggregates.seen[window, column]
            with np.errstate(over="ignore", invalid="ignore"):
                folded = np.where(seen == 0, value, combine(current, value))
            aggregates.values[window, column] = folded
            aggregates.seen[window, column] = seen + 1

    def fold_by_window(self, aggregates: AggregateColumns, column: int, kind: MetricKind) -> None:
        for start, length in zip(self.starts.tolist(), self.lengths.tolist(), strict=True):
            window = int(self.targets[start])
            run = self.values[start : start + length]
            current = float(aggregates.values[window, column])
            if aggregates.seen[window, column] == 0:
                current, run = float(run[0]), run[1:]
            if kind is MetricKind.MIN:
                # The builtins keep the first of equal values (0.0 before -0.0), as `min` does.
                current = min([current, *run.tolist()])
            elif kind is MetricKind.MAX:
                current = max([current, *run.tolist()])
            elif len(run):
                # A cumulative sum adds in order, one value at a time, like the reference; a
                # plain sum adds pairwise and can differ in the last bit.
                with np.errstate(over="ignore", invalid="ignore"):
                    current = float(np.cumsum(np.concatenate(([current], run)))[-1])
            aggregates.values[window, column] = current
            aggregates.seen[window, column] += length


def _smaller(current: np.ndarray, value: np.ndarray) -> np.ndarray:
    return np.where(value < current, value, current)  # `min(current, value)` keeps current on ties


def _larger(current: np.ndarray, value: np.ndarray) -> np.ndarray:
    return np.where(value > current, value, current)


_COMBINE: dict[MetricKind, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    MetricKind.MIN: _smaller,
    MetricKind.MAX: _larger,
    MetricKind.SUM: np.add,
    MetricKind.MEAN: np.add,
    MetricKind.COUNT: np.add,
}


class _Panes:
    """Panes cut from windows, in the order they are cut (`KeyBatch.cut_pane`)."""

    def __init__(self, windows: WindowColumns, accumulating: bool, kinds: list[MetricKind]) -> None:
        self.windows = windows
        self.accumulating = accumulating
        self.kinds = kinds
        self.window: list[np.ndarray] = []
        self.pane_index: list[np.ndarray] = []
        self.late: list[np.ndarray] = []
        self.shown: list[AggregateColumns] = []

    def cut(self, which: np.ndarray, late: bool) -> None:
        """Cut a pane of each window where `which` holds: what it shows, its index, timing."""
        rows = np.flatnonzero(which)
        windows = self.windows
        self.window.append(rows)
        self.pane_index.append(windows.next_pane_index[rows])
        self.late.append(np.full(len(rows), late))
        self.shown.append((windows.total if self.accumulating else windows.pending).take(rows))
        windows.next_pane_index[rows] += 1
        windows.pending.clear(rows)

    def every_pane(self, closed: np.ndarray) -> PaneColumns:
        """Every pane cut; the last one of a window that closed is final."""
        window = np.concatenate(self.window)
        last_cut = np.zeros(len(window), bool)
        _, from_end = np.unique(window[::-1], return_index=True)
        last_cut[len(window) - 1 - from_end] = True
        shown = _concat_aggregates(self.shown, self.windows.total.values.shape[1])
        return self._columns(
            window,
            np.concatenate(self.pane_index),
            np.concatenate(self.late),
            last_cut & closed[window],
            shown,
        )

    def final_only(self, closed: np.ndarray) -> PaneColumns:
        """A closed window's only pane: its totals as pane 0, LATE if any record was late."""
        window = np.flatnonzero(closed)
        return self._columns(
            window,
            np.zeros(len(window), np.int64),
            self.windows.had_late_records[window],
            np.ones(len(window), bool),
            self.windows.total.take(window),
        )

    def _columns(
        self,
        window: np.ndarray,
        pane_index: np.ndarray,
        late: np.ndarray,
        is_final: np.ndarray,
        shown: AggregateColumns,
    ) -> PaneColumns:
        windows = self.windows
        order = np.lexsort(
            (pane_index, windows.end_ms[window], windows.start_ms[window], windows.key[window])
        )
        window = window[order]
        values, present = shown.results(self.kinds)
        return PaneColumns(
            windows.key[window],
            windows.start_ms[window],
            windows.end_ms[window],
            pane_index[order],
            late[order],
            is_final[order],
            shown.count[order],
            values[order],
            present[order],
            np.zeros(len(window), np.int64),  # W at the batch's end, set by the caller
        )


def _concat_aggregates(parts: list[AggregateColumns], metrics: int) -> AggregateColumns:
    if not parts:
        return AggregateColumns.zeros(0, metrics)
    return AggregateColumns(
        np.concatenate([part.count for part in parts]),
        np.concatenate([part.values for part in parts]),
        np.concatenate([part.seen for part in parts]),
    )


def _after_batch(
    keys: KeyColumns,
    records: RecordColumns,
    firsts: np.ndarray,
    final_watermark_ms: np.ndarray,
    windows: WindowColumns,
    rules: WindowRules,
    processing_time_ms: int,
) -> KeyColumns:
    with_records = records.key[firsts]
    max_event_time_ms = keys.max_event_time_ms.copy()
    if len(firsts):
        newest_ms = np.maximum.reduceat(records.event_time_ms, firsts)
        max_event_time_ms[with_records] = np.maximum(max_event_time_ms[with_records], newest_ms)
    last_record_processing_ms = keys.last_record_processing_ms.copy()
    last_record_processing_ms[with_records] = processing_time_ms
    watermark_at_last_record_ms = keys.watermark_at_last_record_ms.copy()
    watermark_at_last_record_ms[with_records] = final_watermark_ms[with_records]
    # Call the key again when it has been idle that long, to advance its watermark.
    has_windows = np.bincount(windows.key, minlength=len(keys.tenant)) > 0
    idle_deadline_ms = np.full(len(keys.tenant), NO_TIME, np.int64)
    if rules.idle_timeout_ms is not None:
        idle_deadline_ms[has_windows] = processing_time_ms + rules.idle_timeout_ms
    return replace(
        keys,
        watermark_ms=final_watermark_ms,
        max_event_time_ms=max_event_time_ms,
        last_record_processing_ms=last_record_processing_ms,
        watermark_at_last_record_ms=watermark_at_last_record_ms,
        idle_deadline_ms=idle_deadline_ms,
        windows=windows,
    )
