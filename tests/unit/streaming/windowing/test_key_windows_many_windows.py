"""One key with many open windows: about 20k session records under a day of allowed lateness.

The semantics at small sizes are compared with the reference in the property tests; this checks
that a key holding thousands of open sessions is still windowed right, merges included, with
the state round-tripped through JSON now and then the way Spark keeps it. How fast it runs is
shown by `infra/dev/benchmarks/windowing_cost.py`, not asserted here.
"""

from __future__ import annotations

import json

from streaming.windowing.key_state import KeyState, RecordInput, Timing
from streaming.windowing.key_windows import Merge, Pane, advance
from tenants.models import WindowRules

UNITS = 7_000
UNIT_MS = 6_000
GAP_MS = 2_000
BRIDGE_DELAY_UNITS = 50  # how many units later the record bridging a unit's two sessions comes


def unit_start_ms(unit: int) -> int:
    return unit * UNIT_MS


def arrival_order() -> list[int]:
    """Per unit u at a = 6 s * u: sessions [a, a+2s) and [a+3s, a+5s), bridged by a record at
    a+1.5s that arrives 50 units later, when W is past the first session's end, so it is late;
    except in the last unit, whose merged session ends after W and so waits for W again."""
    times: list[int] = []
    for unit in range(UNITS + BRIDGE_DELAY_UNITS):
        if unit < UNITS:
            times += [unit_start_ms(unit), unit_start_ms(unit) + 3_000]
        if unit >= BRIDGE_DELAY_UNITS:
            times.append(unit_start_ms(unit - BRIDGE_DELAY_UNITS) + 1_500)
    return times


def test_twenty_thousand_session_records_in_one_key_merge_and_close_right() -> None:
    rules = WindowRules.model_validate(
        {
            "window": {"kind": "session", "gap": GAP_MS},
            "out_of_orderness": "0s",
            "allowed_lateness": "1d",
        }
    )
    times = arrival_order()
    assert len(times) == 3 * UNITS == 21_000
    state = KeyState()
    panes: list[Pane] = []
    merges: list[Merge] = []
    for batch_number, first in enumerate(range(0, len(times), 250)):
        if batch_number % 10 == 9:
            state = KeyState.from_json_dict(json.loads(json.dumps(state.to_json_dict())))
        result = advance(state, [RecordInput(t) for t in times[first : first + 250]], rules)
        panes += result.panes
        merges += result.merges
        assert result.too_late == []

    # A day of lateness keeps every merged session open.
    assert len(state.windows) == UNITS
    assert (state.on_time_records, state.late_records) == (2 * UNITS + 1, UNITS - 1)
    assert merges == [
        Merge(f"session-{unit_start_ms(u) + 3_000}", f"session-{unit_start_ms(u)}")
        for u in range(UNITS)
    ]
    assert not any(pane.is_final for pane in panes)

    far_ahead_ms = unit_start_ms(UNITS) + 2 * 86_400_000
    closing = advance(state, [RecordInput(far_ahead_ms)], rules)
    finals = {pane.window_id: pane for pane in closing.panes if pane.is_final}
    assert {
        window_id: (p.window_start_ms, p.window_end_ms, p.count, p.timing, p.merged_window_ids)
        for window_id, p in finals.items()
    } == {
        f"session-{unit_start_ms(u)}": (
            unit_start_ms(u),
            unit_start_ms(u) + 5_000,
            3,
            Timing.LATE if u < UNITS - 1 else Timing.ON_TIME,
            (f"session-{unit_start_ms(u) + 3_000}",),
        )
        for u in range(UNITS)
    }
    assert list(state.windows) == [f"session-{far_ahead_ms}"]
