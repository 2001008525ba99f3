"""`windowing.advance` for a key's batch of records given as columns: the stream's hot path.

`windowing` stays the readable reference, one record at a time; this computes the same result
with NumPy for fixed windows (tumbling and sliding), where each record's windows depend only on
its own event time:

- W before record i is the running maximum of `event time - out_of_orderness` over the records
  before it, and never below W at the start of the batch;
- a record's windows are integer arithmetic on its event time;
- a (record, window) pair is too late when W before the record >= end + allowed lateness, late
  when W before it >= end, on time otherwise. W never falls, so in record order a window's
  on-time pairs come first, then its late ones, then its too-late ones.

What the watermark does to windows (the ON_TIME pane when W passes a window's end, the final
pane past its allowed lateness, LATE panes at the batch's end) is left to `windowing`'s own
batch logic, called once per batch with W's final value: each window's on-time records are
folded in before W rises and its late ones after, as the record-by-record order would.

Sums are folded in record order with a cumulative sum, as the reference adds one record at a
time, so the two agree to the last bit. `tests/test_columnar_windowing.py` checks that they
agree on random keys, rules and batch splits. Sessions, and keys whose open windows were opened
with other rules, go through `advance` (`handles` says which).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streaming.windowing import (
    Aggregates,
    KeyBatch,
    KeyState,
    OpenWindow,
    Pane,
)
from tenants.models import (
    Emit,
    MetricKind,
    MetricSpec,
    SlidingWindow,
    TumblingWindow,
    WindowRules,
)

_NO_WATERMARK = np.iinfo(np.int64).min
"""W before a key's first record: below every event time, so nothing is late."""


@dataclass(frozen=True)
class Placements:
    """Accepted (record, window) pairs in record order, as the reference lists `Assignment`s."""

    record_index: np.ndarray
    window_id: np.ndarray
    window_start_ms: np.ndarray
    window_end_ms: np.ndarray
    pane_index: np.ndarray
    late: np.ndarray


@dataclass(frozen=True)
class Rejections:
    """Too-late (record, window) pairs in record order, as the reference lists `TooLate`s."""

    record_index: np.ndarray
    window_start_ms: np.ndarray
    window_end_ms: np.ndarray
    watermark_ms: np.ndarray


@dataclass(frozen=True)
class ColumnarResult:
    placements: Placements
    rejections: Rejections
    panes: list[Pane]


def handles(state: KeyState, rules: WindowRules, current_rules_id: str) -> bool:
    """Fixed windows, and every open window of the key opened with the current rules."""
    return isinstance(rules.window, TumblingWindow | SlidingWindow) and all(
        window.rules_id == current_rules_id for window in state.windows.values()
    )


def advance_columns(
    state: KeyState,
    event_times_ms: np.ndarray,
    metric_values: np.ndarray,
    rules: WindowRules,
    processing_time_ms: int | None,
    current_rules_id: str,
) -> ColumnarResult:
    """`advance` for a key `handles` accepts. `metric_values` has a row per record and a column
    per metric of `rules`, in its order: the input, NaN where the record has none."""
    batch = KeyBatch(state, rules, current_rules_id)
    if processing_time_ms is not None:
        batch.advance_idle_watermark(processing_time_ms)
    start_watermark_ms = _NO_WATERMARK if state.watermark_ms is None else state.watermark_ms
    running_max_ms = np.maximum.accumulate(event_times_ms - rules.out_of_orderness_ms)
    watermark_before_ms = np.maximum(
        np.concatenate(([start_watermark_ms], running_max_ms[:-1])), start_watermark_ms
    )
    pairs = _Pairs.of(event_times_ms, watermark_before_ms, rules)
    state.on_time_records += int(pairs.on_time.sum())
    state.late_records += int(pairs.late.sum())
    state.too_late_records += int(pairs.too_late.sum())

    folder = _Folder(metric_values, rules.metrics)
    segments = pairs.segments()
    windows = [_open(batch, pairs, segment) for segment in segments]
    pane_of_on_time = [window.next_pane_index for window in windows]
    for window, segment in zip(windows, segments, strict=True):
        folder.fold(window, pairs.record_index[segment.on_time])
        batch.to_finish[window.window_id] = None
    if len(event_times_ms):
        latest_ms = int(event_times_ms.max())
        state.max_event_time_ms = (
            latest_ms
            if state.max_event_time_ms is None
            else max(state.max_event_time_ms, latest_ms)
        )
        batch.raise_watermark(int(running_max_ms[-1]))
        if processing_time_ms is not None:
            state.last_record_processing_ms = processing_time_ms
            state.watermark_at_last_record_ms = state.watermark_ms
    pane_of_late = [window.next_pane_index for window in windows]
    for window, segment in zip(windows, segments, strict=True):
        if len(segment.late):
            window.had_late_records = True
            folder.fold(window, pairs.record_index[segment.late])
    return ColumnarResult(
        pairs.placements(rules, windows, pane_of_on_time, pane_of_late),
        pairs.rejections(),
        batch.finish().panes,
    )


@dataclass(frozen=True)
class _Segment:
    """One window's accepted pairs, as positions in `_Pairs`, in record order."""

    on_time: np.ndarray
    late: np.ndarray


@dataclass(frozen=True)
class _Pairs:
    """Every (record, window) pair of the batch, record by record, windows by start."""

    record_index: np.ndarray
    start_ms: np.ndarray
    end_ms: np.ndarray
    watermark_before_ms: np.ndarray
    too_late: np.ndarray
    late: np.ndarray
    on_time: np.ndarray
    window_of_pair: np.ndarray
    """For accepted pairs, the number of their window among `window_starts_ms`; -1 else."""
    window_starts_ms: np.ndarray
    bounds: np.ndarray
    order: np.ndarray

    @classmethod
    def of(
        cls, event_times_ms: np.ndarray, watermark_before_ms: np.ndarray, rules: WindowRules
    ) -> _Pairs:
        window = rules.window
        assert isinstance(window, TumblingWindow | SlidingWindow)
        slide_ms = window.slide_ms if isinstance(window, SlidingWindow) else window.size_ms
        per_record = window.size_ms // slide_ms
        # A record's windows start at its last slide boundary and the ones before it, earliest
        # first, like `windowing.windows_of`.
        last_start_ms = event_times_ms - event_times_ms % slide_ms
        steps = np.arange(per_record - 1, -1, -1, dtype=np.int64) * slide_ms
        start_ms = (last_start_ms[:, None] - steps[None, :]).ravel()
        record_index = np.repeat(np.arange(len(event_times_ms)), per_record)
        end_ms = start_ms + window.size_ms
        watermark_ms = watermark_before_ms[record_index]
        too_late = watermark_ms >= end_ms + rules.allowed_lateness_ms
        late = ~too_late & (watermark_ms >= end_ms)
        accepted = np.flatnonzero(~too_late)
        window_starts_ms, inverse = np.unique(start_ms[accepted], return_inverse=True)
        window_of_pair = np.full(len(start_ms), -1, dtype=np.int64)
        window_of_pair[accepted] = inverse
        order = accepted[np.argsort(inverse, kind="stable")]
        bounds = np.searchsorted(window_of_pair[order], np.arange(len(window_starts_ms) + 1))
        return cls(
            record_index,
            start_ms,
            end_ms,
            watermark_ms,
            too_late,
            late,
            ~too_late & ~late,
            window_of_pair,
            window_starts_ms,
            bounds,
            order,
        )

    def segments(self) -> list[_Segment]:
        segments = []
        for number in range(len(self.window_starts_ms)):
            positions = self.order[self.bounds[number] : self.bounds[number + 1]]
            on_time = positions[self.on_time[positions]]
            segments.append(_Segment(on_time, positions[len(on_time) :]))
        return segments

    def placements(
        self,
        rules: WindowRules,
        windows: list[OpenWindow],
        pane_of_on_time: list[int],
        pane_of_late: list[int],
    ) -> Placements:
        accepted = np.flatnonzero(~self.too_late)
        windows_of = self.window_of_pair[accepted]
        late = self.late[accepted]
        if rules.emit is Emit.FINAL_ONLY:
            pane_index = np.zeros(len(accepted), dtype=np.int64)
        else:
            pane_index = np.where(
                late,
                np.array(pane_of_late, dtype=np.int64)[windows_of],
                np.array(pane_of_on_time, dtype=np.int64)[windows_of],
            )
        ids = np.array([window.window_id for window in windows], dtype=object)
        return Placements(
            self.record_index[accepted],
            ids[windows_of],
            self.start_ms[accepted],
            self.end_ms[accepted],
            pane_index,
            late,
        )

    def rejections(self) -> Rejections:
        return Rejections(
            self.record_index[self.too_late],
            self.start_ms[self.too_late],
            self.end_ms[self.too_late],
            self.watermark_before_ms[self.too_late],
        )


def _open(batch: KeyBatch, pairs: _Pairs, segment: _Segment) -> OpenWindow:
    """The segment's window, opened by its first accepted record if the key has not got it."""
    first = segment.on_time[0] if len(segment.on_time) else segment.late[0]
    start_ms, end_ms = int(pairs.start_ms[first]), int(pairs.end_ms[first])
    window_id = f"{start_ms}-{end_ms}"
    window = batch.state.windows.get(window_id)
    if window is not None:
        return window
    watermark_ms = int(pairs.watermark_before_ms[first])
    return batch.open_window(
        window_id, start_ms, end_ms, None if watermark_ms == _NO_WATERMARK else watermark_ms
    )


class _Folder:
    """Folds records into a window's totals and pending aggregates, as `Aggregates.add` would
    one record at a time."""

    def __init__(self, metric_values: np.ndarray, metrics: dict[str, MetricSpec]) -> None:
        self.columns = [
            (name, spec, metric_values[:, number])
            for number, (name, spec) in enumerate(metrics.items())
        ]

    def fold(self, window: OpenWindow, records: np.ndarray) -> None:
        if not len(records):
            return
        window.total.count += len(records)
        window.pending.count += len(records)
        for name, spec, column in self.columns:
            values = column[records]
            values = values[~np.isnan(values)]
            if len(values):
                _fold_values(window.total, name, spec, values)
                _fold_values(window.pending, name, spec, values)


def _fold_values(aggregates: Aggregates, name: str, spec: MetricSpec, values: np.ndarray) -> None:
    current = aggregates.metrics.get(name)
    if current is None or current[1] == 0:
        current = aggregates.metrics[name] = [float(values[0]), 1]
        values = values[1:]
        if not len(values):
            return
    if spec.kind is MetricKind.MIN:
        # The builtins keep the first of equal values (0.0 before -0.0), as `min(a, b)` does.
        current[0] = min([current[0], *values.tolist()])
    elif spec.kind is MetricKind.MAX:
        current[0] = max([current[0], *values.tolist()])
    else:
        # A cumulative sum adds in order, one value at a time, like the reference; a plain sum
        # adds pairwise and can differ in the last bit.
        with np.errstate(over="ignore", invalid="ignore"):
            current[0] = float(np.cumsum(np.concatenate(([current[0]], values)))[-1])
    current[1] += len(values)
