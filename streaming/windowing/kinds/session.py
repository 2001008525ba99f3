"""Session windows: a window closes after `gap` without records, and a record that bridges two
sessions merges them (the merge itself is `key_windows`': it owns a key's open windows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from streaming.windowing.key_state import RecordInput
from streaming.windowing.kinds.base import Placement, Windower
from tenants.models import SessionWindow, WindowSpec


@dataclass(frozen=True)
class SessionWindower(Windower):
    gap_ms: int

    @classmethod
    def of(cls, spec: WindowSpec) -> Self:
        assert isinstance(spec, SessionWindow)
        return cls(spec.gap_ms)

    @property
    def fixed_grid(self) -> None:
        return None

    def place(
        self,
        placement: Placement,
        record_index: int,
        record: RecordInput,
        watermark_before: int | None,
    ) -> None:
        placement.place_in_session(record_index, record, watermark_before, self.gap_ms)
