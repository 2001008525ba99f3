"""How long a micro-batch waits, after its trigger's tick, before it takes its end offsets.

Spark fires a processing-time trigger on whole multiples of its interval since the epoch, and
event-time windows end on the same whole seconds and minutes. A producer stamping events with
its own clock sends the record that closes a window just after such an instant: just after the
batch of that tick has taken its end offsets. Without a phase, that record, and the window's
final pane with it, waits a whole trigger interval for the next batch.

Taking the end offsets `phase_ms` after the tick instead lets that batch include it. A record
sent at any other moment waits as long as before on average (the cut-off only moves), so
freshness is unchanged and final panes gain most of an interval.
"""

from __future__ import annotations


def phase_wait_ms(now_ms: int, interval_ms: int, phase_ms: int) -> int:
    """How long a batch starting at `now_ms` waits before it takes its end offsets.

    Only a batch that starts within `phase_ms` of its tick waits, until the tick plus
    `phase_ms`. One that starts later, as a stream falling behind does, waits nothing: its
    cut-off is already past the phase.
    """
    if interval_ms <= 0 or phase_ms <= 0:
        return 0
    since_tick_ms = now_ms % interval_ms
    return phase_ms - since_tick_ms if since_tick_ms < phase_ms else 0
