"""A continuous stream's compaction runs beside its batches (`streaming.pipeline.
compaction_schedule`), on the real query, broker and Delta tables:

- while a compaction is held before its commit, new records still become readable, batch after
  batch, and once it commits every record is in exactly one row;
- a stream killed during a compaction that runs beside its batches restarts and settles every
  row, each exactly once;
- the stream's vacuum, after its compactions, deletes what older versions needed while batches
  and compactions go on, and every record is still in exactly one row.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.dev.load_generator import LoadSpec
from storage.lake.tables import ALL_TABLES, EVENTS
from streaming.app import StreamApp
from streaming.fault_points import FaultPoint, NoFaults
from tests.support.datasets import sample_records
from tests.support.pipeline_harness import Pipeline, assert_no_query_error
from tests.support.stream_process import start_process, wait_or_kill
from tests.support.table_snapshots import assert_every_record_landed_once
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

HOLD_LIMIT_S = 120
"""The held compaction's own bound: it goes on by itself if the test never releases it."""


@dataclass(frozen=True)
class HoldCompaction:
    """Holds the first compaction before its commit until `release` exists."""

    held: Path
    release: Path

    def __reduce__(self) -> tuple[type[NoFaults], tuple[()]]:
        # Pickled to the executors with the stages that call a hook: its point is the driver's,
        # so they get the hook that does nothing (and need not import this module).
        return NoFaults, ()

    def reached(self, point: FaultPoint, first: int, last: int | None = None) -> None:
        if point is not FaultPoint.BEFORE_COMPACTION_COMMIT or self.held.exists():
            return
        self.held.touch()
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not self.release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def _continuous(
    kafka: Any, workdir: Path, conf_dir: Path, compact_interval: str, **environ: str
) -> Pipeline:
    return Pipeline.create(
        kafka,
        workdir,
        conf_dir,
        trigger_interval="500ms",
        environ={"TW_STREAM__COMPACT_INTERVAL": compact_interval, **environ},
    )


def _landed(pipeline: Pipeline) -> int:
    return sum(len(pipeline.table(name)) for name in ("events", "late_events", "quarantine"))


def _settled(pipeline: Pipeline, records: int) -> bool:
    staged = any(pipeline.lake.staged_files(spec) for spec in ALL_TABLES if spec.staged)
    return not staged and _landed(pipeline) >= records


def _records(pipeline: Pipeline, count: int, seed: int) -> list[Any]:
    spec = LoadSpec(count=count, late_share=0.0, malformed_share=0.0, jitter=1_000, seed=seed)
    return list(sample_records(pipeline.registry(), spec))


def test_batches_commit_while_a_compaction_is_held_and_every_record_lands_once(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    pipeline = _continuous(kafka, tmp_path, conf_dir, compact_interval="0s")  # every batch
    hook = HoldCompaction(tmp_path / "held", tmp_path / "release")
    first, later = _records(pipeline, 60, seed=1), _records(pipeline, 60, seed=2)
    pipeline.produce_samples(first)
    stream = StreamApp(pipeline.settings, pipeline.lake, fault_hook=hook).start(spark)
    try:
        alive = lambda: assert_no_query_error(stream)  # noqa: E731
        wait_until(hook.held.exists, 120, "a compaction to reach its commit", alive=alive)
        before = _landed(pipeline)
        pipeline.produce_samples(later)
        # Batches commit the later records beside the held compaction.
        wait_until(
            lambda: _landed(pipeline) >= before + len(later),
            60,
            "the later records to be readable while the compaction is held",
            alive=alive,
        )
        assert not hook.release.exists()
        hook.release.touch()
        wait_until(
            lambda: _settled(pipeline, len(first) + len(later)),
            120,
            "every row to settle",
            alive=alive,
        )
    finally:
        hook.release.touch()
        stream.stop()
    assert_every_record_landed_once(pipeline)


def test_a_stream_killed_during_a_compaction_beside_its_batches_restarts_and_settles_all(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    pipeline = _continuous(kafka, tmp_path, conf_dir, compact_interval="2s")
    first = _records(pipeline, 80, seed=3)
    pipeline.produce_samples(first)
    with (tmp_path / "killed-run.log").open("wb") as log:
        process = start_process(
            pipeline,
            log,
            available_now=False,
            fault=["--crash-at", FaultPoint.BEFORE_COMPACTION_COMMIT.value],
        )
        code = wait_or_kill(process, 180)
    assert code == -signal.SIGKILL, (tmp_path / "killed-run.log").read_text()[-3000:]
    assert any(pipeline.lake.staged_files(spec) for spec in ALL_TABLES if spec.staged)

    later = _records(pipeline, 20, seed=4)
    pipeline.produce_samples(later)
    stream = StreamApp(pipeline.settings, pipeline.lake).start(spark)
    try:
        wait_until(
            lambda: _settled(pipeline, len(first) + len(later)),
            120,
            "the restarted stream to settle every row",
            alive=lambda: assert_no_query_error(stream),
        )
    finally:
        stream.stop()
    assert_every_record_landed_once(pipeline)


def test_the_stream_vacuums_beside_its_batches_and_every_record_lands_once(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    pipeline = _continuous(
        kafka,
        tmp_path,
        conf_dir,
        compact_interval="0s",  # every batch's staged files are removed by the next compaction
        TW_STREAM__VACUUM_INTERVAL="1s",
        TW_LAKE__VACUUM_RETENTION="0s",
    )
    records = _records(pipeline, 120, seed=5)
    vacuums = lambda: [  # noqa: E731
        entry
        for entry in pipeline.lake.open(EVENTS).history()
        if entry["operation"] == "VACUUM END"
    ]
    stream = StreamApp(pipeline.settings, pipeline.lake).start(spark)
    try:
        for part in range(4):  # several batches, each compacted, with vacuums between
            pipeline.produce_samples(records[part * 30 : (part + 1) * 30])
            time.sleep(1)
        # Only the log is read while the stream runs: with no retention, a reader of an older
        # version may find its files gone, which is what `vacuum_retention` is for.
        wait_until(
            lambda: len(vacuums()) >= 2 and not pipeline.lake.staged_files(EVENTS),
            120,
            "vacuums beside the batches, and every row settled",
            alive=lambda: assert_no_query_error(stream),
        )
    finally:
        stream.stop()
    deleted = sum(int(entry["operationMetrics"]["numDeletedFiles"]) for entry in vacuums())
    assert deleted > 0
    assert_every_record_landed_once(pipeline)
