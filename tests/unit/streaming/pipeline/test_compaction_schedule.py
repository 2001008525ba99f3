"""When a stream starts a compaction (`compaction_due`) and its vacuum (`vacuum_due`), and how
one runs beside the batches (`beside_batches`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from storage.upkeep.compaction import Compaction
from streaming.pipeline.compaction_schedule import beside_batches, compaction_due, vacuum_due

MINUTE_MS = 60_000
NOW_MS = 1_795_000_200_000  # a whole ten minutes since the epoch


def test_a_compaction_is_due_once_per_interval_whenever_the_batches_cross_into_it() -> None:
    interval_ms = 10 * MINUTE_MS
    assert compaction_due(NOW_MS, None, interval_ms)
    assert not compaction_due(NOW_MS + interval_ms - 1, NOW_MS, interval_ms)
    assert compaction_due(NOW_MS + interval_ms, NOW_MS + interval_ms - 1, interval_ms)
    # A compaction that ran past the interval's end: the first batch after it starts the next.
    assert compaction_due(NOW_MS + 3 * interval_ms + 5, NOW_MS + 1, interval_ms)


def test_with_no_interval_every_batch_starts_one() -> None:
    assert compaction_due(NOW_MS, NOW_MS, 0)


def test_a_vacuum_follows_the_first_compaction_of_each_interval_and_none_with_no_interval() -> None:
    hour_ms = 60 * MINUTE_MS
    hour_start_ms = NOW_MS - NOW_MS % hour_ms
    assert not vacuum_due(hour_start_ms + hour_ms - 1, hour_start_ms, hour_ms)  # the same hour
    assert vacuum_due(hour_start_ms + hour_ms, hour_start_ms, hour_ms)
    assert not vacuum_due(hour_start_ms + 10 * hour_ms, hour_start_ms, 0)


def test_beside_the_batches_a_compaction_takes_half_the_cores_and_yields_the_cpu() -> None:
    spark = cast(
        Any, SimpleNamespace(sparkContext=SimpleNamespace(master="local[2]", defaultParallelism=2))
    )
    compaction = Compaction(lake=cast(Any, None), stream="orders", writer_epoch=1, tasks=4)
    assert not compaction.yields_cpu  # between batches, and a run's final settle

    beside = beside_batches(compaction, spark, yields_cpu=True)
    assert (beside.tasks, beside.yields_cpu) == (1, True)
    assert not beside_batches(compaction, spark, yields_cpu=False).yields_cpu
