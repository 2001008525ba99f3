"""The windowing semantics on their own: contract §4 pane rules and the contract §7 worked
example."""

from __future__ import annotations

import json

import pytest

from streaming.windowing.key_state import KeyState, RecordInput, Timing
from streaming.windowing.key_windows import BatchResult, Pane
from streaming.windowing.key_windows import advance as advance_records
from streaming.windowing.kinds import windower_of
from tenants.models import Accumulation, TumblingWindow, WindowRules


def mmss(text: str) -> int:
    minutes, seconds = text.split(":")
    return (int(minutes) * 60 + int(seconds)) * 1000


def rules(lateness: str = "1m", accumulation: str = "accumulating") -> WindowRules:
    return WindowRules.model_validate(
        {
            "window": {"kind": "tumbling", "size": "1m"},
            "out_of_orderness": "10s",
            "allowed_lateness": lateness,
            "accumulation": accumulation,
        }
    )


def advance(state: KeyState, event_times_ms: list[int], rules: WindowRules) -> BatchResult:
    return advance_records(state, [RecordInput(t) for t in event_times_ms], rules)


def pane_tuples(panes: list[Pane]) -> list[tuple[int, int, Timing, bool, int]]:
    return [(p.window_start_ms, p.pane_index, p.timing, p.is_final, p.count) for p in panes]


def test_spec_worked_example_one_record_per_batch() -> None:
    state = KeyState()
    acme = rules()

    first = advance(state, [mmss("00:05")], acme)
    assert [a.timing for a in first.assignments] == [Timing.ON_TIME]
    assert first.panes == [] and state.watermark_ms == mmss("00:05") - 10_000

    second = advance(state, [mmss("01:20")], acme)
    assert second.assignments[0].window_start_ms == mmss("01:00")
    assert state.watermark_ms == mmss("01:10")
    assert pane_tuples(second.panes) == [(0, 0, Timing.ON_TIME, False, 1)]

    third = advance(state, [mmss("00:30")], acme)
    assert [(a.timing, a.pane_index) for a in third.assignments] == [(Timing.LATE, 1)]
    assert pane_tuples(third.panes) == [(0, 1, Timing.LATE, False, 2)]

    fourth = advance(state, [mmss("02:15")], acme)
    assert state.watermark_ms == mmss("02:05")
    assert pane_tuples(fourth.panes) == [
        (0, 2, Timing.LATE, True, 2),
        (mmss("01:00"), 0, Timing.ON_TIME, False, 1),
    ]
    assert f"0-{mmss('01:00')}" not in state.windows

    fifth = advance(state, [mmss("00:50")], acme)
    assert fifth.assignments == [] and fifth.panes == []
    [too_late] = fifth.too_late
    assert (too_late.window_start_ms, too_late.lateness_ms) == (0, 65_000)


def test_spec_worked_example_records_three_and_four_in_one_batch() -> None:
    state = KeyState()
    advance(state, [mmss("00:05")], rules())
    advance(state, [mmss("01:20")], rules())
    batch = advance(state, [mmss("00:30"), mmss("02:15")], rules())
    # Pane 1 is then the final one, with the same final total.
    assert pane_tuples(batch.panes) == [
        (0, 1, Timing.LATE, True, 2),
        (mmss("01:00"), 0, Timing.ON_TIME, False, 1),
    ]


def test_other_key_is_not_affected_by_a_key_far_ahead() -> None:
    acme, globex = KeyState(), KeyState()
    advance(acme, [mmss("59:00")], rules())
    result = advance(globex, [mmss("00:10")], rules())
    assert [a.timing for a in result.assignments] == [Timing.ON_TIME]


def test_late_record_in_the_batch_that_fires_on_time_goes_to_the_next_pane() -> None:
    state = KeyState()
    batch = advance(state, [mmss("00:05"), mmss("01:20"), mmss("00:30")], rules())
    assert [(a.timing, a.pane_index) for a in batch.assignments] == [
        (Timing.ON_TIME, 0),
        (Timing.ON_TIME, 0),
        (Timing.LATE, 1),
    ]
    assert pane_tuples(batch.panes) == [
        (0, 0, Timing.ON_TIME, False, 1),
        (0, 1, Timing.LATE, False, 2),
    ]


def test_window_whose_first_record_is_late_has_a_late_pane_zero() -> None:
    state = KeyState()
    advance(state, [mmss("01:20")], rules())
    batch = advance(state, [mmss("00:59")], rules())
    assert pane_tuples(batch.panes) == [(0, 0, Timing.LATE, False, 1)]


def test_zero_lateness_makes_the_on_time_pane_final_and_later_records_too_late() -> None:
    state = KeyState()
    first = advance(state, [mmss("00:05"), mmss("01:10")], rules(lateness="0s"))
    assert pane_tuples(first.panes) == [(0, 0, Timing.ON_TIME, True, 1)]
    second = advance(state, [mmss("00:30")], rules(lateness="0s"))
    assert second.assignments == [] and second.too_late[0].lateness_ms == 0


def test_discarding_panes_carry_only_their_new_records() -> None:
    state = KeyState()
    discarding = rules(accumulation=Accumulation.DISCARDING.value)
    advance(state, [mmss("00:05"), mmss("00:06"), mmss("01:20")], discarding)
    late = advance(state, [mmss("00:30")], discarding)
    final = advance(state, [mmss("02:15")], discarding)
    assert pane_tuples(late.panes) == [(0, 1, Timing.LATE, False, 1)]
    assert pane_tuples(final.panes)[0] == (0, 2, Timing.LATE, True, 0)


def test_every_window_gets_exactly_one_final_pane_and_state_is_dropped() -> None:
    state = KeyState()
    times = [mmss(f"{minute:02d}:{second:02d}") for minute in range(5) for second in (1, 31)]
    result = advance(state, [*times, mmss("59:00")], rules())
    finals = [p.window_start_ms for p in result.panes if p.is_final]
    assert finals == [mmss(f"{minute:02d}:00") for minute in range(5)]
    assert sorted(state.windows) == [f"{mmss('59:00')}-{mmss('60:00')}"]


def test_watermark_never_decreases() -> None:
    state = KeyState()
    advance(state, [mmss("05:00"), mmss("01:00")], rules())
    assert state.watermark_ms == mmss("04:50")


def test_state_round_trips_through_json() -> None:
    state = KeyState()
    advance(state, [mmss("00:05"), mmss("01:20"), mmss("00:30")], rules())
    restored = KeyState.from_json_dict(json.loads(json.dumps(state.to_json_dict())))
    assert restored == state


@pytest.mark.parametrize(
    ("event_time_ms", "expected_start"),
    [(0, 0), (59_999, 0), (60_000, 60_000), (1_700_000_012_345, 1_699_999_980_000)],
)
def test_tumbling_windows_align_to_the_epoch(event_time_ms: int, expected_start: int) -> None:
    assert windower_of(TumblingWindow(size="1m")).windows_of(event_time_ms) == [
        (expected_start, expected_start + 60_000)
    ]
