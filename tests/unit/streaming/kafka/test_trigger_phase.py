"""When a micro-batch takes its end offsets, relative to its trigger's tick."""

from __future__ import annotations

import pytest

from streaming.kafka.trigger_phase import phase_wait_ms


@pytest.mark.parametrize(
    ("now_ms", "wait_ms"),
    [
        (5_000, 250),  # on the tick: the whole phase
        (5_010, 240),  # Spark's call arrives a little after the tick
        (5_249, 1),
        (5_250, 0),  # the phase has passed
        (5_900, 0),  # a batch of a stream falling behind, mid-interval
        (6_000, 250),  # the next tick
    ],
)
def test_a_batch_near_its_tick_waits_until_the_phase(now_ms: int, wait_ms: int) -> None:
    assert phase_wait_ms(now_ms, interval_ms=1_000, phase_ms=250) == wait_ms


def test_the_wait_ends_on_the_same_instant_wherever_it_starts() -> None:
    for now_ms in range(60_000, 60_250):
        assert now_ms + phase_wait_ms(now_ms, 1_000, 250) == 60_250


@pytest.mark.parametrize(("interval_ms", "phase_ms"), [(1_000, 0), (0, 250)])
def test_no_phase_or_no_interval_waits_nothing(interval_ms: int, phase_ms: int) -> None:
    assert phase_wait_ms(12_000, interval_ms, phase_ms) == 0
