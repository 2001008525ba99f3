"""What every window kind answers, and what a key's batch offers it to place a record."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol, Self

from streaming.windowing.key_state import RecordInput
from tenants.models import WindowSpec


class Placement(Protocol):
    """A key's micro-batch as a windower sees it (`key_windows.KeyBatch`): it places a record in
    a fixed window or in a session, and keeps the watermark, lateness and panes."""

    def place_in_fixed(
        self,
        record_index: int,
        record: RecordInput,
        watermark_before: int | None,
        start_ms: int,
        end_ms: int,
    ) -> None: ...

    def place_in_session(
        self, record_index: int, record: RecordInput, watermark_before: int | None, gap_ms: int
    ) -> None: ...


class Windower(ABC):
    """One kind of window: which windows a record belongs to, and how it is placed in them."""

    @classmethod
    @abstractmethod
    def of(cls, spec: WindowSpec) -> Self:
        """This kind's windower for a rule's window spec."""

    @property
    @abstractmethod
    def fixed_grid(self) -> tuple[int, int] | None:
        """(size, slide) in ms when every window is a fixed [start, end) on a grid aligned to the
        epoch, which the columnar engine computes for many keys at once; None when windows
        depend on the records (sessions)."""

    @abstractmethod
    def place(
        self,
        placement: Placement,
        record_index: int,
        record: RecordInput,
        watermark_before: int | None,
    ) -> None:
        """Place one record of a key's batch in its window(s)."""
