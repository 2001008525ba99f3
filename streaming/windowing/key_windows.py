"""Event-time windowing of one (tenant, source) key: watermark, panes, lateness (contract §2-§4).

Pure Python and free of Spark, so the semantics can be tested on their own. `KeyState` is the
whole per-key state; `advance` feeds it one micro-batch of the key's records in (partition,
offset) order and returns what that batch emits. State holds aggregates per open window, never
the records.

W is the key's watermark: `max event time seen - out_of_orderness`, never decreasing, updated
after each record, so a record is classified against W as it was before that record.

Each window keeps the rules it was opened with (by `rules_id`), so a changed rule applies only
to windows opened after the change. Sessions that a record bridges merge into the one with the
earliest start; it keeps its `window_id`, the absorbed ones emit nothing more (`Merge` says so).

A key can hold many open windows (small windows, wide lateness), so no step visits all of them:
`OpenWindowIndex` finds the windows a watermark rise seals or closes and the sessions a record
touches, and a batch's end looks only at the windows that took records or closed in it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from streaming.windowing.key_state import (
    Aggregates,
    KeyState,
    OpenWindow,
    OpenWindowIndex,
    RecordInput,
    Timing,
)
from streaming.windowing.kinds import windower_of
from tenants.models import Accumulation, Emit, WindowRules, rules_id


@dataclass(frozen=True)
class Assignment:
    """An accepted record in one of its windows, and the pane it is emitted in."""

    record_index: int
    window_id: str
    window_start_ms: int
    window_end_ms: int
    pane_index: int
    timing: Timing


@dataclass(frozen=True)
class TooLate:
    """A record that arrived after its window's final pane: W at arrival >= end + lateness."""

    record_index: int
    window_start_ms: int
    window_end_ms: int
    lateness_ms: int
    watermark_ms: int


@dataclass(frozen=True)
class Pane:
    window_id: str
    window_start_ms: int
    window_end_ms: int
    pane_index: int
    timing: Timing
    is_final: bool
    count: int
    metrics: dict[str, float | None]
    watermark_ms: int | None
    merged_window_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Merge:
    """A session absorbed into another by a bridging record; it emits nothing more."""

    absorbed_window_id: str
    into_window_id: str


@dataclass
class BatchResult:
    assignments: list[Assignment] = field(default_factory=list)
    too_late: list[TooLate] = field(default_factory=list)
    panes: list[Pane] = field(default_factory=list)
    merges: list[Merge] = field(default_factory=list)


def advance(
    state: KeyState,
    records: Sequence[RecordInput],
    rules: WindowRules,
    processing_time_ms: int | None = None,
    current_rules_id: str | None = None,
) -> BatchResult:
    """Process one micro-batch of a key's records (in order) and return what it emits.

    `processing_time_ms` is the micro-batch's timestamp; with `idle_timeout` set it advances
    the watermark of a key that has been idle, before this batch's records are placed.
    `current_rules_id` is `rules_id(rules)`, if the caller already has it.
    """
    batch = KeyBatch(state, rules, current_rules_id or rules_id(rules))
    if processing_time_ms is not None:
        batch.advance_idle_watermark(processing_time_ms)
    for record_index, record in enumerate(records):
        batch.place(record_index, record)
    if records and processing_time_ms is not None:
        state.last_record_processing_ms = processing_time_ms
        state.watermark_at_last_record_ms = state.watermark_ms
    return batch.finish()


class KeyBatch:
    """The work of one batch of a key: the state, the current rules, and what has fired.

    `advance` places records one by one (`columnar_windows` computes the same for many keys of
    fixed windows at once, on columns).
    """

    def __init__(self, state: KeyState, rules: WindowRules, current_rules_id: str) -> None:
        self.state = state
        self.rules = rules
        self.current_rules_id = current_rules_id
        self.rules_by_id: dict[str, WindowRules] = {self.current_rules_id: rules}
        self.windower = windower_of(rules.window)
        self.result = BatchResult()
        self.fired: dict[str, list[Pane]] = {}
        self.to_finish: dict[str, None] = {}
        """Ids of the windows `finish` must look at (a dict keeps them in a repeatable order)."""
        self.index = self.current_index()

    def current_index(self) -> OpenWindowIndex:
        index = self.state.open_window_index
        if index is not None and index.describes(self.state.windows) and not index.is_bloated():
            return index
        index = OpenWindowIndex(self.state.windows)
        for window in self.state.windows.values():
            index.add(window, self.final_deadline_ms(window))
            is_open = self.is_open(window)
            if not is_open:
                index.close(window)
            # `finish` leaves neither kind behind, but a state made otherwise is finished alike.
            if not is_open or (window.on_time_sealed and window.pending.count > 0):
                self.to_finish[window.window_id] = None
        self.state.open_window_index = index
        return index

    def rules_of(self, window: OpenWindow) -> WindowRules:
        if window.rules_id not in self.rules_by_id:
            stored = self.state.rules[window.rules_id]
            self.rules_by_id[window.rules_id] = WindowRules.model_validate(stored)
        return self.rules_by_id[window.rules_id]

    def final_deadline_ms(self, window: OpenWindow) -> int:
        """W reaching this fires the window's final pane."""
        return window.end_ms + self.rules_of(window).allowed_lateness_ms

    def is_open(self, window: OpenWindow) -> bool:
        """Not past its final pane, even if it is only dropped at the end of the batch."""
        watermark_ms = self.state.watermark_ms
        return watermark_ms is None or watermark_ms < self.final_deadline_ms(window)

    def advance_idle_watermark(self, processing_time_ms: int) -> None:
        state, idle_timeout_ms = self.state, self.rules.idle_timeout_ms
        if (
            idle_timeout_ms is None
            or state.last_record_processing_ms is None
            or state.watermark_at_last_record_ms is None
        ):
            return
        idle_ms = processing_time_ms - state.last_record_processing_ms
        if idle_ms >= idle_timeout_ms:
            self.raise_watermark(state.watermark_at_last_record_ms + idle_ms)

    def place(self, record_index: int, record: RecordInput) -> None:
        watermark_before = self.state.watermark_ms
        self.windower.place(self, record_index, record, watermark_before)
        state = self.state
        if state.max_event_time_ms is None or record.event_time_ms > state.max_event_time_ms:
            state.max_event_time_ms = record.event_time_ms
        self.raise_watermark(record.event_time_ms - self.rules.out_of_orderness_ms)

    def place_in_fixed(
        self,
        record_index: int,
        record: RecordInput,
        watermark_before: int | None,
        start_ms: int,
        end_ms: int,
    ) -> None:
        window_id = f"{start_ms}-{end_ms}"
        window = self.state.windows.get(window_id)
        lateness_ms = (
            self.rules_of(window) if window is not None else self.rules
        ).allowed_lateness_ms
        if watermark_before is not None and watermark_before >= end_ms + lateness_ms:
            self.reject(record_index, start_ms, end_ms, watermark_before)
            return
        if window is None:
            window = self.open_window(window_id, start_ms, end_ms, watermark_before)
        self.accept(record_index, record, window)

    def place_in_session(
        self,
        record_index: int,
        record: RecordInput,
        watermark_before: int | None,
        gap_ms: int,
    ) -> None:
        start_ms, end_ms = record.event_time_ms, record.event_time_ms + gap_ms
        touching = self.index.sessions_touching(start_ms, end_ms)
        if not touching:
            too_late_at = end_ms + self.rules.allowed_lateness_ms
            if watermark_before is not None and watermark_before >= too_late_at:
                self.reject(record_index, start_ms, end_ms, watermark_before)
                return
            window = self.open_window(
                self.new_session_id(start_ms), start_ms, end_ms, watermark_before
            )
        else:
            window, *absorbed = touching
            old_start_ms, was_sealed = window.start_ms, window.on_time_sealed
            for other in absorbed:
                specs = self.rules_of(window).metrics
                window.total.merge(other.total, specs)
                window.pending.merge(other.pending, specs)
                window.end_ms = max(window.end_ms, other.end_ms)
                window.had_late_records |= other.had_late_records
                window.merged_window_ids += [other.window_id, *other.merged_window_ids]
                del self.state.windows[other.window_id]
                self.index.drop(other)
                self.result.merges.append(Merge(other.window_id, window.window_id))
            window.start_ms = min(window.start_ms, start_ms)
            window.end_ms = max(window.end_ms, end_ms)
            # A session stretched past W is waiting for W again: its next pane is on time.
            window.on_time_sealed = (
                watermark_before is not None and watermark_before >= window.end_ms
            )
            self.index.reshape_session(window, old_start_ms, was_sealed)
        self.accept(record_index, record, window)

    def new_session_id(self, start_ms: int) -> str:
        """`session-<start>`, unless a session with that start closed in this batch and is only
        dropped at its end (a rule change can widen the gap or the lateness so that a record
        at its start is accepted again): then `session-<start>-<n>`, so each keeps its panes."""
        window_id = f"session-{start_ms}"
        taken = self.state.windows
        if window_id not in taken:
            return window_id
        return next(
            f"{window_id}-{n}" for n in itertools.count(2) if f"{window_id}-{n}" not in taken
        )

    def open_window(
        self, window_id: str, start_ms: int, end_ms: int, watermark_before: int | None
    ) -> OpenWindow:
        window = OpenWindow(window_id, start_ms, end_ms, self.current_rules_id)
        # A window whose first record is already late never has an ON_TIME pane.
        window.on_time_sealed = watermark_before is not None and watermark_before >= end_ms
        self.state.windows[window_id] = window
        self.index.add(window, self.final_deadline_ms(window))
        if self.current_rules_id not in self.state.rules:
            self.state.rules[self.current_rules_id] = self.rules.model_dump(mode="json")
        return window

    def accept(self, record_index: int, record: RecordInput, window: OpenWindow) -> None:
        window_rules = self.rules_of(window)
        window.total.add(record, window_rules.metrics)
        window.pending.add(record, window_rules.metrics)
        self.to_finish[window.window_id] = None
        timing = Timing.LATE if window.on_time_sealed else Timing.ON_TIME
        if timing is Timing.LATE:
            window.had_late_records = True
            self.state.late_records += 1
        else:
            self.state.on_time_records += 1
        pane_index = 0 if window_rules.emit is Emit.FINAL_ONLY else window.next_pane_index
        self.result.assignments.append(
            Assignment(
                record_index, window.window_id, window.start_ms, window.end_ms, pane_index, timing
            )
        )

    def reject(self, record_index: int, start_ms: int, end_ms: int, watermark_ms: int) -> None:
        self.state.too_late_records += 1
        self.result.too_late.append(
            TooLate(record_index, start_ms, end_ms, watermark_ms - end_ms, watermark_ms)
        )

    def raise_watermark(self, candidate_ms: int) -> None:
        """Move W forward (never back), cut the ON_TIME pane of every window it reached, and
        close the windows it took past their final deadline."""
        if self.state.watermark_ms is not None and candidate_ms <= self.state.watermark_ms:
            return
        self.state.watermark_ms = candidate_ms
        for window in self.index.pop_ended(candidate_ms):
            if window.on_time_sealed:
                continue
            if window.end_ms > candidate_ms:
                self.index.push_end(window)  # a session that grew since it was pushed
                continue
            window.on_time_sealed = True
            if window.pending.count > 0:
                self.cut_pane(window, Timing.ON_TIME)
        for window in self.index.pop_past_final(candidate_ms):
            if self.is_open(window):
                self.index.push_final_deadline(window, self.final_deadline_ms(window))
            else:
                self.index.close(window)
                self.to_finish[window.window_id] = None

    def cut_pane(self, window: OpenWindow, timing: Timing) -> None:
        window_rules = self.rules_of(window)
        accumulating = window_rules.accumulation is Accumulation.ACCUMULATING
        shown = window.total if accumulating else window.pending
        if window_rules.emit is Emit.EVERY_PANE:
            self.fired.setdefault(window.window_id, []).append(
                Pane(
                    window_id=window.window_id,
                    window_start_ms=window.start_ms,
                    window_end_ms=window.end_ms,
                    pane_index=window.next_pane_index,
                    timing=timing,
                    is_final=False,
                    count=shown.count,
                    metrics=shown.results(window_rules.metrics),
                    watermark_ms=None,
                    merged_window_ids=tuple(window.merged_window_ids),
                )
            )
        window.next_pane_index += 1
        window.pending = Aggregates()

    def finish(self) -> BatchResult:
        """Fire pending LATE panes, mark final panes, and drop windows past end + lateness.

        Only windows that took records in this batch can have pending LATE records (every
        batch's end fires them), and only those W took past their final deadline close, so no
        other window is visited.
        """
        state = self.state
        changed = [
            window
            for window_id in self.to_finish
            if (window := state.windows.get(window_id)) is not None
        ]
        for window in sorted(changed, key=lambda w: (w.start_ms, w.end_ms)):
            window_rules = self.rules_of(window)
            if window.on_time_sealed and window.pending.count > 0:
                self.cut_pane(window, Timing.LATE)
            if self.is_open(window):
                continue
            if window_rules.emit is Emit.FINAL_ONLY:
                self.fired[window.window_id] = [self.only_pane(window, window_rules)]
            else:
                panes = self.fired.setdefault(window.window_id, [])
                if not panes:
                    self.cut_pane(window, Timing.LATE)  # the final pane may hold no new records
                panes[-1] = replace(panes[-1], is_final=True)
            del state.windows[window.window_id]
            self.index.drop(window)
        self.forget_unused_rules()
        self.result.panes = sorted(
            (
                replace(pane, watermark_ms=state.watermark_ms)
                for panes in self.fired.values()
                for pane in panes
            ),
            key=lambda pane: (pane.window_start_ms, pane.window_end_ms, pane.pane_index),
        )
        return self.result

    def only_pane(self, window: OpenWindow, window_rules: WindowRules) -> Pane:
        """With `final_only`, the one row a window gets: its totals, as pane 0."""
        return Pane(
            window_id=window.window_id,
            window_start_ms=window.start_ms,
            window_end_ms=window.end_ms,
            pane_index=0,
            timing=Timing.LATE if window.had_late_records else Timing.ON_TIME,
            is_final=True,
            count=window.total.count,
            metrics=window.total.results(window_rules.metrics),
            watermark_ms=None,
            merged_window_ids=tuple(window.merged_window_ids),
        )

    def forget_unused_rules(self) -> None:
        for stale in set(self.state.rules) - set(self.index.windows_per_rules):
            del self.state.rules[stale]
