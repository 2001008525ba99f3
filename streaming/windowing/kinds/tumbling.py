"""Tumbling windows: fixed, non-overlapping windows of `size` aligned to the UTC epoch; a sliding
window whose slide is its size, with one window per record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from streaming.windowing.kinds.sliding import SlidingWindower
from tenants.models import TumblingWindow, WindowSpec


@dataclass(frozen=True)
class TumblingWindower(SlidingWindower):
    @classmethod
    def of(cls, spec: WindowSpec) -> Self:
        assert isinstance(spec, TumblingWindow)
        return cls(spec.size_ms, spec.size_ms)

    def windows_of(self, event_time_ms: int) -> list[tuple[int, int]]:
        start = event_time_ms - event_time_ms % self.size_ms
        return [(start, start + self.size_ms)]
