"""A deliberately simple reference model of per-key event-time windowing (contract §2, §3, §4).

It is written from docs/contract.md alone, not from `streaming/windowing/key_windows.py`, so that
the property tests compare two independent readings of the contract. It handles one key's records
in arrival order in a single pass: no micro-batches, no panes, no state serialisation. It only
answers what contract §4 says must not depend on batch boundaries: how each record is
classified per window, which records each window holds, and each window's final totals. Clarity
beats speed here; the quadratic scans are fine for the few dozen records a property test feeds
it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from tenants.models import MetricKind, MetricSpec, SessionWindow, SlidingWindow, WindowRules

MetricValues = dict[str, float | None]
# The metrics the property tests' rules pick from: a filtered count and every numeric aggregate.
METRIC_CATALOG: dict[str, dict[str, object]] = {
    "errors": {"kind": "count", "field": "level", "equals": "ERROR"},
    "records": {"kind": "count"},
    "amount_sum": {"kind": "sum", "field": "amount"},
    "amount_min": {"kind": "min", "field": "amount"},
    "amount_max": {"kind": "max", "field": "amount"},
    "amount_mean": {"kind": "mean", "field": "amount"},
}


class RefTiming(StrEnum):
    ON_TIME = "ON_TIME"
    LATE = "LATE"
    TOO_LATE = "TOO_LATE"


@dataclass(frozen=True)
class RefRecord:
    """One input record: its event time and the raw fields metrics are read from."""

    event_time_ms: int
    fields: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Classification:
    """One record x one window it falls in (for a too-late session record: its proto window)."""

    record_index: int
    # None only for a too-late session record: it never becomes a session, so it has no id.
    window_id: str | None
    window_start_ms: int
    window_end_ms: int
    timing: RefTiming
    watermark_before_ms: int | None
    # Only for TOO_LATE: W at arrival - window end (contract §4).
    lateness_ms: int | None = None


@dataclass
class RefWindow:
    """A window with at least one accepted record; sessions with their final (merged) bounds."""

    window_id: str
    start_ms: int
    end_ms: int
    record_indexes: list[int] = field(default_factory=list)
    # Index of the record after which W >= end + allowed_lateness (the window's final pane is
    # due in the batch holding that record); None while the window is still open.
    closed_by: int | None = None
    count: int = 0
    metrics: MetricValues = field(default_factory=dict)


@dataclass
class RefResult:
    classifications: list[Classification]
    # W after each record; None while no record has been seen (W = -inf).
    watermarks_after: list[int | None]
    # Every window that accepted a record, keyed by id. Sessions absorbed by a merge are not
    # here; they appear in `merges` as (absorbed id, surviving id), in the order they happened.
    windows: dict[str, RefWindow]
    merges: list[tuple[str, str]]

    def for_record(self, index: int) -> list[Classification]:
        return [c for c in self.classifications if c.record_index == index]


def fixed_window_id(start_ms: int, end_ms: int) -> str:
    return f"{start_ms}-{end_ms}"


def session_id(created_by_event_time_ms: int) -> str:
    return f"session-{created_by_event_time_ms}"


def lookup(fields: Mapping[str, object], path: str) -> object:
    """Follow a dot path into nested mappings; a missing step reads as None (a SQL null)."""
    value: object = fields
    for step in path.split("."):
        if not isinstance(value, Mapping) or step not in value:
            return None
        value = value[step]
    return value


def metric_input(fields: Mapping[str, object], spec: MetricSpec) -> float | None:
    """What one record contributes to a metric: 1.0/0.0 for a count, else its number or None."""
    if spec.kind is MetricKind.COUNT:
        if spec.field is None:
            return 1.0
        return 1.0 if lookup(fields, spec.field) == spec.equals else 0.0
    assert spec.field is not None
    value = lookup(fields, spec.field)
    # bool is an int subclass in Python, but `true` is not a number in the JSON sense.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def aggregate(
    records: Sequence[RefRecord], metrics: Mapping[str, MetricSpec]
) -> tuple[int, MetricValues]:
    """The count and every metric over `records`, skipping missing numbers like SQL nulls."""
    values: MetricValues = {}
    for name, spec in metrics.items():
        inputs = [metric_input(record.fields, spec) for record in records]
        numbers = [value for value in inputs if value is not None]
        if spec.kind is MetricKind.COUNT:
            values[name] = float(sum(numbers))
        elif not numbers:
            values[name] = None
        elif spec.kind is MetricKind.SUM:
            values[name] = float(sum(numbers))
        elif spec.kind is MetricKind.MIN:
            values[name] = min(numbers)
        elif spec.kind is MetricKind.MAX:
            values[name] = max(numbers)
        else:
            values[name] = sum(numbers) / len(numbers)
    return len(records), values


def fixed_windows_of(event_time_ms: int, size_ms: int, slide_ms: int) -> list[tuple[int, int]]:
    """Every epoch-aligned [start, start + size) containing the time, earliest start first."""
    # Python's % is a floor modulo, so this aligns negative times the same way as positive ones.
    last_start = event_time_ms - event_time_ms % slide_ms
    starts = range(last_start - size_ms + slide_ms, last_start + 1, slide_ms)
    return [(start, start + size_ms) for start in starts]


def _next_watermark(watermark: int | None, event_time_ms: int, rules: WindowRules) -> int:
    candidate = event_time_ms - rules.out_of_orderness_ms
    # W never decreases: a record behind the newest one leaves it where it is.
    return candidate if watermark is None else max(watermark, candidate)


def _reached(watermark: int | None, boundary_ms: int) -> bool:
    """W >= boundary, where a key that has seen nothing has W = -inf."""
    return watermark is not None and watermark >= boundary_ms


def run_reference(records: Sequence[RefRecord], rules: WindowRules) -> RefResult:
    """Window one key's records, given in arrival order."""
    if isinstance(rules.window, SessionWindow):
        result = _run_sessions(records, rules, rules.window.gap_ms)
    else:
        size = rules.window.size_ms
        slide = rules.window.slide_ms if isinstance(rules.window, SlidingWindow) else size
        result = _run_fixed(records, rules, size, slide)
    for window in result.windows.values():
        members = [records[index] for index in window.record_indexes]
        window.count, window.metrics = aggregate(members, rules.metrics)
    return result


def _run_fixed(
    records: Sequence[RefRecord], rules: WindowRules, size_ms: int, slide_ms: int
) -> RefResult:
    lateness = rules.allowed_lateness_ms
    result = RefResult([], [], {}, [])
    watermark: int | None = None
    for index, record in enumerate(records):
        for start, end in fixed_windows_of(record.event_time_ms, size_ms, slide_ms):
            window_id = fixed_window_id(start, end)
            if _reached(watermark, end + lateness):
                assert watermark is not None
                result.classifications.append(
                    Classification(
                        index,
                        window_id,
                        start,
                        end,
                        RefTiming.TOO_LATE,
                        watermark,
                        lateness_ms=watermark - end,
                    )
                )
                continue
            timing = RefTiming.LATE if _reached(watermark, end) else RefTiming.ON_TIME
            result.classifications.append(
                Classification(index, window_id, start, end, timing, watermark)
            )
            window = result.windows.setdefault(window_id, RefWindow(window_id, start, end))
            # A window closed earlier can never take a record: W only grows.
            assert window.closed_by is None
            window.record_indexes.append(index)
        watermark = _next_watermark(watermark, record.event_time_ms, rules)
        result.watermarks_after.append(watermark)
        for window in result.windows.values():
            if window.closed_by is None and _reached(watermark, window.end_ms + lateness):
                window.closed_by = index
    return result


def _run_sessions(records: Sequence[RefRecord], rules: WindowRules, gap_ms: int) -> RefResult:
    lateness = rules.allowed_lateness_ms
    result = RefResult([], [], {}, [])
    # Sessions that may still take records (W < end + lateness). They never overlap each
    # other: a record touching several merges them all into one.
    open_sessions: list[RefWindow] = []
    watermark: int | None = None
    for index, record in enumerate(records):
        t = record.event_time_ms
        proto_start, proto_end = t, t + gap_ms
        touching = [s for s in open_sessions if s.start_ms < proto_end and t < s.end_ms]
        if not touching and _reached(watermark, proto_end + lateness):
            assert watermark is not None
            result.classifications.append(
                Classification(
                    index,
                    None,
                    proto_start,
                    proto_end,
                    RefTiming.TOO_LATE,
                    watermark,
                    lateness_ms=watermark - proto_end,
                )
            )
        else:
            if touching:
                # The earliest session survives the merge; the others are absorbed into it.
                touching.sort(key=lambda s: s.start_ms)
                session = touching[0]
                for absorbed in touching[1:]:
                    session.record_indexes.extend(absorbed.record_indexes)
                    session.end_ms = max(session.end_ms, absorbed.end_ms)
                    open_sessions.remove(absorbed)
                    del result.windows[absorbed.window_id]
                    result.merges.append((absorbed.window_id, session.window_id))
                session.start_ms = min(session.start_ms, proto_start)
                session.end_ms = max(session.end_ms, proto_end)
            else:
                session = RefWindow(session_id(t), proto_start, proto_end)
                # Ids cannot repeat: a later record at the same time joins this session or,
                # once it closed, is too late for it.
                assert session.window_id not in result.windows
                open_sessions.append(session)
                result.windows[session.window_id] = session
            session.record_indexes.append(index)
            session.record_indexes.sort()
            timing = RefTiming.LATE if _reached(watermark, session.end_ms) else RefTiming.ON_TIME
            result.classifications.append(
                Classification(
                    index, session.window_id, session.start_ms, session.end_ms, timing, watermark
                )
            )
        watermark = _next_watermark(watermark, t, rules)
        result.watermarks_after.append(watermark)
        for session in list(open_sessions):
            if _reached(watermark, session.end_ms + lateness):
                session.closed_by = index
                open_sessions.remove(session)
    return result
