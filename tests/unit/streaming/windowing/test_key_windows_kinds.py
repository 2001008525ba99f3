"""Sliding and session windows, metrics, emit modes, idle keys and rule changes, on their own."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streaming.windowing.key_state import KeyState, RecordInput, Timing
from streaming.windowing.key_windows import Pane, advance
from streaming.windowing.kinds import windower_of
from tenants.models import SlidingWindow, WindowRules

MIN = 60_000


def rules(**fields: Any) -> WindowRules:
    base: dict[str, Any] = {
        "window": {"kind": "tumbling", "size": "1m"},
        "out_of_orderness": "0s",
        "allowed_lateness": "0s",
    }
    return WindowRules.model_validate({**base, **fields})


def at(*event_times_ms: int) -> list[RecordInput]:
    return [RecordInput(t) for t in event_times_ms]


def finals(panes: list[Pane]) -> dict[str, Pane]:
    return {p.window_id: p for p in panes if p.is_final}


def roundtrip(state: KeyState) -> KeyState:
    return KeyState.from_json_dict(json.loads(json.dumps(state.to_json_dict())))


def test_sliding_windows_match_spark_alignment() -> None:
    spec = SlidingWindow(size="3m", slide="1m")
    assert windower_of(spec).windows_of(2 * MIN + 5) == [
        (0, 3 * MIN),
        (MIN, 4 * MIN),
        (2 * MIN, 5 * MIN),
    ]
    assert windower_of(spec).windows_of(3 * MIN) == [
        (MIN, 4 * MIN),
        (2 * MIN, 5 * MIN),
        (3 * MIN, 6 * MIN),
    ]


def test_sliding_record_is_in_every_window_and_each_closes_once() -> None:
    state = KeyState()
    sliding = rules(window={"kind": "sliding", "size": "2m", "slide": "1m"})
    first = advance(state, at(90_000), sliding)
    assert sorted(a.window_id for a in first.assignments) == [f"0-{2 * MIN}", f"{MIN}-{3 * MIN}"]
    closing = advance(state, at(10 * MIN), sliding)
    assert {w: p.count for w, p in finals(closing.panes).items()} == {
        f"0-{2 * MIN}": 1,
        f"{MIN}-{3 * MIN}": 1,
    }


def test_sliding_record_can_be_on_time_for_one_window_and_too_late_for_another() -> None:
    state = KeyState()
    sliding = rules(window={"kind": "sliding", "size": "2m", "slide": "1m"})
    advance(state, at(2 * MIN + 1), sliding)  # W = 2m: window [0, 2m) is final
    result = advance(state, at(MIN + 30_000), sliding)
    assert [(a.window_id, a.timing) for a in result.assignments] == [
        (f"{MIN}-{3 * MIN}", Timing.ON_TIME)
    ]
    assert [(t.window_start_ms, t.lateness_ms) for t in result.too_late] == [(0, 1)]


def test_session_grows_with_records_inside_the_gap_and_closes_after_it() -> None:
    state = KeyState()
    session = rules(window={"kind": "session", "gap": "30s"})
    result = advance(state, at(0, 10_000, 35_000), session)
    assert {a.window_id for a in result.assignments} == {"session-0"}
    assert state.windows["session-0"].end_ms == 65_000
    closed = advance(state, at(200_000), session)
    final = finals(closed.panes)["session-0"]
    assert (final.window_start_ms, final.window_end_ms, final.count) == (0, 65_000, 3)


def test_a_bridging_record_merges_two_sessions_under_the_earlier_identity() -> None:
    state = KeyState()
    session = rules(window={"kind": "session", "gap": "30s"}, out_of_orderness="5m")
    advance(state, at(0, 50_000), session)  # [0s, 30s) and [50s, 80s)
    state = roundtrip(state)
    bridged = advance(state, at(25_000), session)  # [25s, 55s) touches both
    assert [(m.absorbed_window_id, m.into_window_id) for m in bridged.merges] == [
        ("session-50000", "session-0")
    ]
    assert list(state.windows) == ["session-0"]
    closed = advance(state, at(3_600_000), session)
    final = finals(closed.panes)["session-0"]
    assert (final.window_start_ms, final.window_end_ms, final.count) == (0, 80_000, 3)
    assert final.merged_window_ids == ("session-50000",)


def test_merged_discarding_panes_never_count_a_record_twice() -> None:
    state = KeyState()
    session = rules(
        window={"kind": "session", "gap": "30s"},
        accumulation="discarding",
        allowed_lateness="10m",
    )
    emitted: list[Pane] = []
    merges = []
    # Three sessions, each closed on time, then bridged one by one by late records.
    for batch in ([0], [50_000], [100_000], [25_000], [75_000], [3_600_000]):
        result = advance(state, at(*batch), session)
        emitted += result.panes
        merges += result.merges
    assert [m.into_window_id for m in merges] == ["session-0", "session-0"]
    total = sum(p.count for p in emitted if p.window_id != "session-3600000")
    assert total == 5
    [final] = [p for p in emitted if p.is_final and p.window_id == "session-0"]
    assert (final.window_start_ms, final.window_end_ms) == (0, 130_000)
    assert final.merged_window_ids == ("session-50000", "session-100000")


def test_metrics_follow_the_accumulation_mode() -> None:
    metrics = {
        "errors": {"kind": "count", "field": "level", "equals": "ERROR"},
        "revenue": {"kind": "sum", "field": "amount"},
        "low": {"kind": "min", "field": "amount"},
        "high": {"kind": "max", "field": "amount"},
        "avg": {"kind": "mean", "field": "amount"},
    }

    def record(t: int, error: bool, amount: float | None) -> RecordInput:
        values = {"errors": 1.0 if error else 0.0, "revenue": amount, "low": amount}
        return RecordInput(t, {**values, "high": amount, "avg": amount})

    for accumulation, late_pane in (
        ("accumulating", {"errors": 2.0, "revenue": 14.0, "low": 4.0, "high": 10.0, "avg": 7.0}),
        ("discarding", {"errors": 1.0, "revenue": 10.0, "low": 10.0, "high": 10.0, "avg": 10.0}),
    ):
        state = KeyState()
        window_rules = rules(metrics=metrics, allowed_lateness="5m", accumulation=accumulation)
        first = advance(
            state, [record(1, True, 4.0), record(2, False, None), record(MIN + 1, False, 2.0)],
            window_rules,
        )  # fmt: skip
        assert first.panes[0].metrics == {
            "errors": 1.0, "revenue": 4.0, "low": 4.0, "high": 4.0, "avg": 4.0
        }  # fmt: skip
        late = advance(state, [record(3, True, 10.0)], window_rules)
        assert late.panes[0].metrics == pytest.approx(late_pane)


def test_final_only_emits_one_row_per_window_with_its_totals() -> None:
    state = KeyState()
    final_only = rules(emit="final_only", allowed_lateness="2m", accumulation="discarding")
    first = advance(state, at(1, 2, MIN + 1), final_only)
    late = advance(state, at(3), final_only)
    closing = advance(state, at(10 * MIN), final_only)
    assert first.panes == [] and late.panes == []
    [only] = [p for p in closing.panes if p.window_start_ms == 0]
    assert (only.pane_index, only.timing, only.is_final, only.count) == (0, Timing.LATE, True, 3)
    assert {a.pane_index for a in first.assignments + late.assignments} == {0}


def test_an_idle_key_advances_its_watermark_with_processing_time() -> None:
    state = KeyState()
    idle = rules(idle_timeout="30s", out_of_orderness="10s")
    advance(state, at(5_000), idle, processing_time_ms=1_000_000)
    assert state.watermark_ms == -5_000
    too_soon = advance(state, [], idle, processing_time_ms=1_020_000)
    assert too_soon.panes == []
    later = advance(state, [], idle, processing_time_ms=1_070_000)
    assert state.watermark_ms == 65_000  # W at last record + 70 s idle
    assert [(p.window_start_ms, p.is_final) for p in later.panes] == [(0, True)]


def test_idle_timeout_unset_never_moves_the_watermark() -> None:
    state = KeyState()
    advance(state, at(5_000), rules(), processing_time_ms=0)
    advance(state, [], rules(), processing_time_ms=10**9)
    assert state.watermark_ms == 5_000


def test_a_changed_rule_applies_only_to_windows_opened_after_it() -> None:
    state = KeyState()
    one_minute = rules(allowed_lateness="10m")
    advance(state, at(30_000), one_minute)
    five_minutes = rules(window={"kind": "tumbling", "size": "5m"}, allowed_lateness="0s")
    state = roundtrip(state)
    later = advance(state, at(6 * MIN), five_minutes)
    assert [a.window_id for a in later.assignments] == [f"{5 * MIN}-{10 * MIN}"]
    # The old window keeps its 10-minute lateness, although the new rules have none.
    assert f"0-{MIN}" in state.windows
    assert len(state.rules) == 2
    advance(state, at(12 * MIN), five_minutes)
    assert f"0-{MIN}" not in state.windows and len(state.rules) == 1


def test_a_session_reopened_where_a_closing_one_started_gets_its_own_id() -> None:
    """A wider gap after a rule change can accept a record at the start of a session that the
    same batch closes (by idle time); both sessions keep their own id and final pane."""
    state = KeyState()
    short_gap = rules(window={"kind": "session", "gap": "10s"}, idle_timeout="30s")
    advance(state, at(0), short_gap, processing_time_ms=1_000_000)
    wide_gap = rules(window={"kind": "session", "gap": "10m"}, idle_timeout="30s")
    # 60 s idle: W = 60 s, past the end of session-0 ([0, 10 s)); the record at 0 opens
    # [0, 10 min) under the new rules, which W has not reached.
    result = advance(state, at(0), wide_gap, processing_time_ms=1_060_000)

    assert {p.window_id: p.count for p in result.panes if p.is_final} == {"session-0": 1}
    assert [a.window_id for a in result.assignments] == ["session-0-2"]
    assert set(state.windows) == {"session-0-2"}
    assert roundtrip(state) == state
