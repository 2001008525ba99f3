"""One (tenant, source) key's windowing state: its watermark, open windows and counters.

`KeyState` is the whole per-key state and all that survives a micro-batch; `key_windows.advance`
changes it. It holds aggregates per open window, never the records, and is stored as JSON in
Spark's state (`to_json_dict`, `from_json_dict`). `OpenWindowIndex` is derived from it, never
stored: it finds the windows a watermark rise seals or closes without visiting them all.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sortedcontainers import SortedList

from tenants.models import MetricKind, MetricSpec


class Timing(StrEnum):
    ON_TIME = "ON_TIME"
    LATE = "LATE"


@dataclass(frozen=True)
class RecordInput:
    event_time_ms: int
    metric_inputs: Mapping[str, float | None] = field(default_factory=dict)
    """Per metric: 1.0/0.0 for a count (matches its filter or not); the value, or None, else."""


@dataclass
class Aggregates:
    """Count and metric accumulators; each accumulator is `[value, number of values]`."""

    count: int = 0
    metrics: dict[str, list[float]] = field(default_factory=dict)

    def add(self, record: RecordInput, specs: Mapping[str, MetricSpec]) -> None:
        self.count += 1
        for name, spec in specs.items():
            value = record.metric_inputs.get(name)
            if value is not None:
                self._fold(name, spec, value, 1)

    def merge(self, other: Aggregates, specs: Mapping[str, MetricSpec]) -> None:
        self.count += other.count
        for name, spec in specs.items():
            if name in other.metrics:
                value, seen = other.metrics[name]
                self._fold(name, spec, value, int(seen))

    def results(self, specs: Mapping[str, MetricSpec]) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for name, spec in specs.items():
            value, seen = self.metrics.get(name, [0.0, 0])
            if spec.kind is MetricKind.COUNT:
                out[name] = value
            elif seen == 0:
                out[name] = None  # like SQL: an aggregate of no values is null
            else:
                out[name] = value / seen if spec.kind is MetricKind.MEAN else value
        return out

    def _fold(self, name: str, spec: MetricSpec, value: float, seen: int) -> None:
        if name not in self.metrics or self.metrics[name][1] == 0:
            self.metrics[name] = [value, seen]
            return
        current = self.metrics[name]
        if spec.kind is MetricKind.MIN:
            current[0] = min(current[0], value)
        elif spec.kind is MetricKind.MAX:
            current[0] = max(current[0], value)
        else:
            current[0] += value
        current[1] += seen


@dataclass
class OpenWindow:
    """A window that has records and has not had its final pane yet."""

    window_id: str
    start_ms: int
    end_ms: int
    rules_id: str
    total: Aggregates = field(default_factory=Aggregates)
    pending: Aggregates = field(default_factory=Aggregates)
    """Records not yet emitted in any pane."""
    next_pane_index: int = 0
    on_time_sealed: bool = False
    """True once W reached the window's end: records from then on go to LATE panes."""
    had_late_records: bool = False
    merged_window_ids: list[str] = field(default_factory=list)
    """Sessions absorbed into this one, so `events` rows of theirs can be joined to it."""


@dataclass
class KeyState:
    watermark_ms: int | None = None
    max_event_time_ms: int | None = None
    windows: dict[str, OpenWindow] = field(default_factory=dict)
    rules: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The rules (as JSON) each open window was opened with, by rules id."""
    last_record_processing_ms: int | None = None
    watermark_at_last_record_ms: int | None = None
    on_time_records: int = 0
    late_records: int = 0
    too_late_records: int = 0
    open_window_index: OpenWindowIndex | None = field(default=None, compare=False, repr=False)
    """Derived from `windows`, kept in step with it by `advance`, so change `windows` only through
    `advance`. Not serialized: the first `advance` after a load rebuilds it, in O(open windows)
    like the load itself."""

    def to_json_dict(self) -> dict[str, Any]:
        # Written out rather than `dataclasses.asdict`, which deep-copies recursively and was
        # most of the cost of saving a key's state each batch.
        return {
            "watermark_ms": self.watermark_ms,
            "max_event_time_ms": self.max_event_time_ms,
            "windows": {window_id: _window_json(w) for window_id, w in self.windows.items()},
            "rules": self.rules,
            "last_record_processing_ms": self.last_record_processing_ms,
            "watermark_at_last_record_ms": self.watermark_at_last_record_ms,
            "on_time_records": self.on_time_records,
            "late_records": self.late_records,
            "too_late_records": self.too_late_records,
        }

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> KeyState:
        windows = {
            window_id: OpenWindow(
                **{
                    **body,
                    "total": _aggregates_from_json(body["total"]),
                    "pending": _aggregates_from_json(body["pending"]),
                }
            )
            for window_id, body in data["windows"].items()
        }
        return cls(**{**data, "windows": windows})


def _window_json(window: OpenWindow) -> dict[str, Any]:
    return {
        "window_id": window.window_id,
        "start_ms": window.start_ms,
        "end_ms": window.end_ms,
        "rules_id": window.rules_id,
        "total": _aggregates_json(window.total),
        "pending": _aggregates_json(window.pending),
        "next_pane_index": window.next_pane_index,
        "on_time_sealed": window.on_time_sealed,
        "had_late_records": window.had_late_records,
        "merged_window_ids": list(window.merged_window_ids),
    }


def _aggregates_json(aggregates: Aggregates) -> dict[str, Any]:
    return {
        "count": aggregates.count,
        "metrics": {
            # A sum can overflow to infinity, which JSON has no number for: it is kept as text.
            name: [value if math.isfinite(value) else str(value), seen]
            for name, (value, seen) in aggregates.metrics.items()
        },
    }


def _aggregates_from_json(data: dict[str, Any]) -> Aggregates:
    return Aggregates(
        count=data["count"],
        metrics={
            name: [float(value) if isinstance(value, str) else value, seen]
            for name, (value, seen) in data["metrics"].items()
        },
    )


class OpenWindowIndex:
    """`KeyState.windows` by end, by final deadline and (open sessions) by start.

    The heaps are lazy. A window's entry is a lower bound of its end (or final deadline): a
    session that grows keeps its entry, and whoever pops an entry checks the window as it is
    now and pushes it again if it is not there yet. Entries of absorbed or replaced windows are
    skipped when popped. Open sessions never overlap (a record touching several merges them),
    so ordered by start they are ordered by end too, and the ones a record touches are
    neighbours.
    """

    def __init__(self, windows: dict[str, OpenWindow]) -> None:
        self.windows = windows
        self.unsealed_by_end: list[tuple[int, str]] = []
        """(end, window id) of every window not yet on-time sealed: W reaching end seals it."""
        self.by_final_deadline: list[tuple[int, str]] = []
        """(end + the window's own allowed lateness, window id) of every open window."""
        self.open_sessions = SortedList()
        """(start, window id) of the session windows that can still take records."""
        self.windows_per_rules: Counter[str] = Counter()

    def describes(self, windows: dict[str, OpenWindow]) -> bool:
        return self.windows is windows and self.windows_per_rules.total() == len(windows)

    def is_bloated(self) -> bool:
        """Stale entries outnumber live ones: rebuilding now keeps the heaps O(open windows)."""
        limit = 2 * len(self.windows) + 64
        return len(self.unsealed_by_end) > limit or len(self.by_final_deadline) > limit

    def add(self, window: OpenWindow, final_deadline_ms: int) -> None:
        """A window that entered `windows`, open."""
        self.windows_per_rules[window.rules_id] += 1
        if not window.on_time_sealed:
            self.push_end(window)
        self.push_final_deadline(window, final_deadline_ms)
        if is_session(window):
            self.open_sessions.add((window.start_ms, window.window_id))

    def reshape_session(self, session: OpenWindow, old_start_ms: int, was_sealed: bool) -> None:
        """An open session that grew; growing past W lifts its on-time seal."""
        if session.start_ms != old_start_ms:
            self.open_sessions.discard((old_start_ms, session.window_id))
            self.open_sessions.add((session.start_ms, session.window_id))
        if was_sealed and not session.on_time_sealed:
            self.push_end(session)

    def push_end(self, window: OpenWindow) -> None:
        heapq.heappush(self.unsealed_by_end, (window.end_ms, window.window_id))

    def push_final_deadline(self, window: OpenWindow, final_deadline_ms: int) -> None:
        heapq.heappush(self.by_final_deadline, (final_deadline_ms, window.window_id))

    def close(self, window: OpenWindow) -> None:
        """The window takes no more records (it may still be in `windows` until the batch ends)."""
        self.open_sessions.discard((window.start_ms, window.window_id))

    def drop(self, window: OpenWindow) -> None:
        self.close(window)
        self.windows_per_rules[window.rules_id] -= 1
        if self.windows_per_rules[window.rules_id] == 0:
            del self.windows_per_rules[window.rules_id]

    def pop_ended(self, watermark_ms: int) -> list[OpenWindow]:
        """Windows whose end W may have reached since the last call (check `end_ms`)."""
        return self._pop_until(self.unsealed_by_end, watermark_ms)

    def pop_past_final(self, watermark_ms: int) -> list[OpenWindow]:
        """Windows whose final deadline W may have reached since the last call."""
        return self._pop_until(self.by_final_deadline, watermark_ms)

    def _pop_until(self, heap: list[tuple[int, str]], reached_ms: int) -> list[OpenWindow]:
        popped: list[OpenWindow] = []
        while heap and heap[0][0] <= reached_ms:
            window = self.windows.get(heapq.heappop(heap)[1])
            if window is not None:
                popped.append(window)
        return popped

    def sessions_touching(self, start_ms: int, end_ms: int) -> list[OpenWindow]:
        """The open sessions overlapping [start, end), by start."""
        touching: list[OpenWindow] = []
        before_end = self.open_sessions.irange(
            maximum=(end_ms, ""), inclusive=(True, False), reverse=True
        )
        for _, window_id in before_end:
            window = self.windows[window_id]
            if window.end_ms <= start_ms:
                break
            touching.append(window)
        touching.reverse()
        return touching


def is_session(window: OpenWindow) -> bool:
    return window.window_id.startswith("session-")
