"""Sliding windows: overlapping windows of `size`, one starting every `slide`, aligned to the
UTC epoch like Spark SQL's `window()`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from streaming.windowing.key_state import RecordInput
from streaming.windowing.kinds.base import Placement, Windower
from tenants.models import SlidingWindow, WindowSpec


@dataclass(frozen=True)
class SlidingWindower(Windower):
    size_ms: int
    slide_ms: int

    @classmethod
    def of(cls, spec: WindowSpec) -> Self:
        assert isinstance(spec, SlidingWindow)
        return cls(spec.size_ms, spec.slide_ms)

    @property
    def fixed_grid(self) -> tuple[int, int]:
        return self.size_ms, self.slide_ms

    def windows_of(self, event_time_ms: int) -> list[tuple[int, int]]:
        """Every [start, end) containing the event time, by start."""
        last_start = event_time_ms - event_time_ms % self.slide_ms
        starts = range(last_start, event_time_ms - self.size_ms, -self.slide_ms)
        return [(start, start + self.size_ms) for start in sorted(starts)]

    def place(
        self,
        placement: Placement,
        record_index: int,
        record: RecordInput,
        watermark_before: int | None,
    ) -> None:
        for start_ms, end_ms in self.windows_of(record.event_time_ms):
            placement.place_in_fixed(record_index, record, watermark_before, start_ms, end_ms)
