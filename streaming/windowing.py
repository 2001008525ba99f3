"""Event-time windowing of one (tenant, source) key: watermark, panes, lateness (SPEC §2-§4).

Pure Python and free of Spark, so the semantics can be tested on their own. `KeyState` is the
whole per-key state; `advance` feeds it one micro-batch of records in (partition, offset) order
and returns what that batch emits. State holds counters per open window, never the records.

Terms: W is the key's watermark, `max event time seen - out_of_orderness`, never decreasing.
A record is classified against W as it was before that record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum

from tenants.models import Accumulation, TumblingWindow, WindowRules, WindowSpec


class Timing(StrEnum):
    ON_TIME = "ON_TIME"
    LATE = "LATE"


@dataclass
class OpenWindow:
    """Counters of one window that has records and has not had its final pane yet."""

    start_ms: int
    end_ms: int
    count: int = 0
    pending_count: int = 0
    """Records not yet emitted in any pane."""
    next_pane_index: int = 0
    on_time_sealed: bool = False
    """True once W reached the window's end: later records go to LATE panes."""


@dataclass
class KeyState:
    watermark_ms: int | None = None
    max_event_time_ms: int | None = None
    windows: dict[int, OpenWindow] = field(default_factory=dict)
    """Open windows by start; at most one window per start for one key's rules."""
    on_time_records: int = 0
    late_records: int = 0
    too_late_records: int = 0

    def to_json_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json_dict(cls, data: dict[str, object]) -> KeyState:
        raw_windows = data.pop("windows")
        assert isinstance(raw_windows, dict)
        state = cls(**data)  # type: ignore[arg-type]
        state.windows = {int(start): OpenWindow(**body) for start, body in raw_windows.items()}
        return state


@dataclass(frozen=True)
class Assignment:
    """An accepted record in one of its windows, and the pane it is emitted in."""

    record_index: int
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
    window_start_ms: int
    window_end_ms: int
    pane_index: int
    timing: Timing
    is_final: bool
    count: int
    watermark_ms: int | None


@dataclass
class BatchResult:
    assignments: list[Assignment] = field(default_factory=list)
    too_late: list[TooLate] = field(default_factory=list)
    panes: list[Pane] = field(default_factory=list)


def windows_of(event_time_ms: int, spec: WindowSpec) -> list[tuple[int, int]]:
    """Every [start, end) containing the event time, aligned to the UTC epoch like Spark's."""
    if isinstance(spec, TumblingWindow):
        start = event_time_ms - event_time_ms % spec.size_ms
        return [(start, start + spec.size_ms)]
    raise NotImplementedError(f"window kind {spec.kind!r}")


def advance(state: KeyState, event_times_ms: Sequence[int], rules: WindowRules) -> BatchResult:
    """Process one micro-batch of a key's records (in order) and return what it emits."""
    result = BatchResult()
    fired: dict[int, list[Pane]] = {}
    for record_index, event_time_ms in enumerate(event_times_ms):
        watermark_before = state.watermark_ms
        for start_ms, end_ms in windows_of(event_time_ms, rules.window):
            _accept_or_reject(
                state, result, rules, record_index, start_ms, end_ms, watermark_before
            )
        if state.max_event_time_ms is None or event_time_ms > state.max_event_time_ms:
            state.max_event_time_ms = event_time_ms
        candidate = event_time_ms - rules.out_of_orderness_ms
        if watermark_before is None or candidate > watermark_before:
            state.watermark_ms = candidate
            _seal_on_time_panes(state, rules, fired)
    _fire_batch_end_panes(state, rules, fired)
    result.panes = [pane for start in sorted(fired) for pane in fired[start]]
    return result


def _accept_or_reject(
    state: KeyState,
    result: BatchResult,
    rules: WindowRules,
    record_index: int,
    start_ms: int,
    end_ms: int,
    watermark_before: int | None,
) -> None:
    if watermark_before is not None and watermark_before >= end_ms + rules.allowed_lateness_ms:
        state.too_late_records += 1
        result.too_late.append(
            TooLate(record_index, start_ms, end_ms, watermark_before - end_ms, watermark_before)
        )
        return
    window = state.windows.get(start_ms)
    if window is None:
        window = OpenWindow(start_ms, end_ms)
        # A window whose first record is already late never has an ON_TIME pane.
        window.on_time_sealed = watermark_before is not None and watermark_before >= end_ms
        state.windows[start_ms] = window
    window.count += 1
    window.pending_count += 1
    timing = Timing.LATE if window.on_time_sealed else Timing.ON_TIME
    if timing is Timing.LATE:
        state.late_records += 1
    else:
        state.on_time_records += 1
    result.assignments.append(
        Assignment(record_index, start_ms, end_ms, window.next_pane_index, timing)
    )


def _seal_on_time_panes(state: KeyState, rules: WindowRules, fired: dict[int, list[Pane]]) -> None:
    """Cut the ON_TIME pane of every window W has just reached: it fires at batch end."""
    watermark_ms = state.watermark_ms
    assert watermark_ms is not None
    for window in state.windows.values():
        if not window.on_time_sealed and window.end_ms <= watermark_ms:
            window.on_time_sealed = True
            fired.setdefault(window.start_ms, []).append(_cut_pane(window, rules, Timing.ON_TIME))


def _fire_batch_end_panes(
    state: KeyState, rules: WindowRules, fired: dict[int, list[Pane]]
) -> None:
    """Fire pending LATE panes, mark final panes, and drop windows past end + lateness."""
    watermark_ms = state.watermark_ms
    for start_ms in sorted(state.windows):
        window = state.windows[start_ms]
        panes = fired.setdefault(start_ms, [])
        if window.on_time_sealed and window.pending_count > 0:
            panes.append(_cut_pane(window, rules, Timing.LATE))
        reached_final = (
            watermark_ms is not None and watermark_ms >= window.end_ms + rules.allowed_lateness_ms
        )
        if reached_final:
            if not panes:
                panes.append(_cut_pane(window, rules, Timing.LATE))
            panes[-1] = replace(panes[-1], is_final=True)
            del state.windows[start_ms]
        if not panes:
            del fired[start_ms]
    # W at emit is the batch's final W, for every pane fired in the batch.
    for start_ms, panes in fired.items():
        fired[start_ms] = [replace(pane, watermark_ms=watermark_ms) for pane in panes]


def _cut_pane(window: OpenWindow, rules: WindowRules, timing: Timing) -> Pane:
    count = (
        window.count if rules.accumulation is Accumulation.ACCUMULATING else window.pending_count
    )
    pane = Pane(
        window_start_ms=window.start_ms,
        window_end_ms=window.end_ms,
        pane_index=window.next_pane_index,
        timing=timing,
        is_final=False,
        count=count,
        watermark_ms=None,
    )
    window.next_pane_index += 1
    window.pending_count = 0
    return pane
