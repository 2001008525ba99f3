"""Quotas and deferral on the real stream: a real broker, Spark and Delta tables.

Every tenant gets a small quota, so most records are deferred and windowed batches later. The
records must end in exactly the rows they reach without a quota, and a SIGKILL while records
wait in deferral must change nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from infra.dev.load_generator import LoadSpec
from streaming.app import StreamApp
from streaming.fault_points import FaultPoint
from streaming.observe.batch_progress import BatchProgress
from streaming.observe.stream_status import deferred_section
from tests.support.datasets import produce_dataset, replay_pipeline
from tests.support.pipeline_harness import Pipeline
from tests.support.stream_process import crash_and_recover
from tests.support.table_snapshots import assert_every_record_landed_once, assert_same_tables

pytestmark = pytest.mark.integration

RECORDS = 600
# Above RECORDS: the first batch reads every record, and the quota alone spreads them out.
BATCH_SIZE = 1_000
# Records per tenant and partition are about 100: a quota of 30 a second, 30 at once, defers
# most of them in the first batch and releases them over several.
QUOTA = {
    "TW_STREAM__DEFAULT_QUOTA__RECORDS_PER_SECOND": "30",
    "TW_STREAM__DEFAULT_QUOTA__BURST": "30",
}


@pytest.fixture(scope="module")
def dataset(kafka: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    spec = LoadSpec(count=RECORDS, late_share=0.1, malformed_share=0.05, jitter=30_000, seed=5)
    return produce_dataset(kafka, conf_dir, tmp_path_factory.mktemp("topic"), spec)


def outcomes(pipeline: Pipeline) -> dict[str, pd.DataFrame]:
    """What deferral must not change: each record's window and classification, and every
    window's final pane. (Which batch, and so which intermediate pane, a record arrives in
    does change: that is what deferral is.)"""
    events = pipeline.table("events")[
        ["tenant", "source", "window_start", "partition", "offset", "event_id"]
    ]
    late = pipeline.table("late_events")[["tenant", "source", "partition", "offset", "lateness_ms"]]
    quarantine = pipeline.table("quarantine")[["partition", "offset", "reason"]]
    windows = pipeline.table("windows")
    final = windows[windows["is_final"]]
    accumulating = final[final["source"] == "web"]
    frames = {
        "events": events,
        "late_events": late,
        "quarantine": quarantine,
        "final windows": final[["tenant", "source", "window_start"]],
        "final web counts": accumulating[["tenant", "window_start", "count"]],
    }
    return {
        name: frame.astype(str).sort_values(list(frame.columns)).reset_index(drop=True)
        for name, frame in frames.items()
    }


@pytest.fixture(scope="module")
def unthrottled(
    kafka: Any, spark: Any, conf_dir: Path, dataset: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, pd.DataFrame]:
    workdir = tmp_path_factory.mktemp("free")
    pipeline = replay_pipeline(kafka, conf_dir, workdir, dataset, BATCH_SIZE, environ={})
    pipeline.run_available_now(spark)
    return outcomes(pipeline)


def test_deferred_records_end_in_the_rows_they_reach_without_a_quota(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    dataset: str,
    unthrottled: dict[str, pd.DataFrame],
    tmp_path: Path,
) -> None:
    pipeline = replay_pipeline(kafka, conf_dir, tmp_path, dataset, BATCH_SIZE, environ=QUOTA)
    batches: list[BatchProgress] = []
    stream = StreamApp(pipeline.settings, pipeline.lake, on_batch=batches.append).start(spark, True)
    try:
        assert stream.query.awaitTermination(timeout=240), "the query did not finish"
        assert stream.query.exception() is None, stream.query.exception()
        stream.compact_now(spark)
    finally:
        stream.stop()

    assert_same_tables(outcomes(pipeline), unthrottled, what="{}")
    assert_every_record_landed_once(pipeline)
    # The first batch deferred most records; later ones released them, all of them.
    deferred = sum(batch.deferred for batch in batches)
    assert batches[0].deferred > RECORDS // 2, batches[0]
    assert sum(batch.released for batch in batches) == deferred
    assert sum(batch.records_read for batch in batches) == RECORDS
    assert len(batches) > 3
    # What waits after each batch is what was deferred and not yet released, per tenant too.
    waiting = 0
    for batch in batches:
        waiting += batch.deferred - batch.released
        assert batch.backlog == waiting == sum(batch.tenant_backlog.values()), batch
    assert set(batches[0].tenant_backlog) <= {"acme", "globex", "initech"}
    assert batches[-1].backlog == 0 and batches[-1].tenant_backlog == {}


# Killed at each point in turn: the restart after one kill is killed at the next, the last
# restart runs to the end.
CRASH_POINTS = [
    # Batch 0's reader task wrote the records it defers, before Spark got a row.
    f"{FaultPoint.AFTER_DEFERRAL}@10",
    # Batch 0 committed with records deferred; batch 1 had not started.
    f"{FaultPoint.BATCH_START}@1",
    # Batch 2 releases deferred records, and its tables are half committed.
    f"{FaultPoint.BETWEEN_TABLE_COMMITS}@2",
]


def test_kills_while_records_are_deferred_lose_and_duplicate_nothing(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    dataset: str,
    unthrottled: dict[str, pd.DataFrame],
    tmp_path: Path,
) -> None:
    pipeline = replay_pipeline(kafka, conf_dir, tmp_path, dataset, BATCH_SIZE, environ=QUOTA)
    waiting: list[dict[str, Any]] = []

    def look_at_status(crashed: Pipeline) -> None:
        waiting.extend(deferred_section(crashed.settings, crashed.lake).rows)

    crash_and_recover(
        pipeline, spark, CRASH_POINTS, before_restart={CRASH_POINTS[1]: look_at_status}
    )

    assert_same_tables(outcomes(pipeline), unthrottled, what="{}")
    assert_every_record_landed_once(pipeline)
    # `status` after the kill at batch 1's start: batch 0 is committed, its deferred records wait.
    assert waiting, "status showed no deferred records after batch 0"
    assert all(row["deferred_records"] > 0 and row["over_quota"] for row in waiting), waiting
    assert {row["tenant"] for row in waiting} >= {"acme", "globex"}
