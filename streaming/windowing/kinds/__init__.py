"""Window kinds: one `Windower` per kind of window a source's rules name, in a module each, and
the one place that maps a rule to its kind (`windower_of`). Both engines ask the windower, never
the rule's type: the per-record reference (`key_windows`) places a record through it, and the
columnar engine (`columnar_windows`) takes the keys whose windows lie on a fixed grid."""

from __future__ import annotations

from streaming.windowing.kinds.base import Placement, Windower
from streaming.windowing.kinds.session import SessionWindower
from streaming.windowing.kinds.sliding import SlidingWindower
from streaming.windowing.kinds.tumbling import TumblingWindower
from tenants.models import SessionWindow, SlidingWindow, TumblingWindow, WindowSpec

__all__ = ["Placement", "Windower", "windower_of"]


_KINDS: dict[type, type[Windower]] = {
    TumblingWindow: TumblingWindower,
    SlidingWindow: SlidingWindower,
    SessionWindow: SessionWindower,
}


def windower_of(spec: WindowSpec) -> Windower:
    """The windower of a rule's window (a small frozen value: callers take it once per batch)."""
    return _KINDS[type(spec)].of(spec)
