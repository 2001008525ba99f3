"""Crash anywhere, restart, same output: SIGKILL the stream at named points, then compare.

The crashed run is a real `tenant-windows run --available-now` process killed by the fault
hook; a restart that is to crash at the next point is such a process too, and the last restart
runs the same query from its checkpoint in the test's Spark. Every table must then hold exactly
the rows of a run without the crash, compared as multisets without wall-clock columns.
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from infra.dev.load_generator import LoadSpec
from streaming.fault_points import DELIVERY_POINTS, REPROCESS_POINTS, FaultPoint
from tests.support.datasets import clean_run, produce_dataset, replay_pipeline
from tests.support.pipeline_harness import Pipeline
from tests.support.stream_process import (
    crash_and_recover,
    run_process,
    start_process,
    wait_for_commit_log,
    wait_or_kill,
)
from tests.support.table_snapshots import assert_same_tables

pytestmark = pytest.mark.integration

BATCH_SIZE = 150
RECORDS = 600  # four batches
RANDOM_CRASHES = int(os.environ.get("TENANT_WINDOWS_RANDOM_CRASHES", "3"))
LAST_DATA_BATCH = RECORDS // BATCH_SIZE - 1
# Batches the continuous restart runs after the data, without records; they fire timeouts.
EMPTY_BATCHES = 3
# Longer than a batch takes here, so that the graceful stop at the end finds Spark waiting for
# its next trigger. A trigger shorter than a batch makes Spark plan the next batch at once, and
# a stop that interrupts that planning makes Spark itself log an ERROR (TorrentBroadcast).
RESTART_TRIGGER_INTERVAL = "5s"
RESTART_TIMEOUT_S = 300
PROGRESS_LOGGER = "tenant_windows.progress"
# Staged rows settle after every batch, so every crash point meets a compaction too, and the
# tables compared include where each row is (staged or settled).
COMPACT_EVERY_BATCH = {"TW_STREAM__COMPACT_INTERVAL": "0s"}
# Compaction after every batch that settles each table in slices of a few files: a crash
# between two slices' commits restarts to the same tables as a run that settles in one commit.
SLICED_EVERY_BATCH = {**COMPACT_EVERY_BATCH, "TW_STREAM__SETTLE_SLICE_FILES": "2"}
# Compaction after every batch that only merges (the age limit is a day away): about half the
# keys have enough rows in a batch to settle, the others wait in runs until the run's end.
MERGE_EVERY_BATCH = {
    "TW_STREAM__COMPACT_INTERVAL": "1d",
    "TW_STREAM__MERGE_INTERVAL": "1ms",
    "TW_STREAM__SETTLE_ROWS": "25",
}


# Module-scoped: the module's tests then run on one worker (tests/conftest.py), which builds the
# topic and the clean run once. Session-scoped, each worker that drew one of its tests built them
# again, and spreading the tests gains nothing on a suite that keeps both cores busy.
@pytest.fixture(scope="module")
def dataset(kafka: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One topic every run reads from the start, so runs differ only by their crash."""
    spec = LoadSpec(count=RECORDS, late_share=0.1, malformed_share=0.05, jitter=30_000, seed=3)
    return produce_dataset(kafka, conf_dir, tmp_path_factory.mktemp("topic"), spec)


@pytest.fixture(scope="module")
def clean_tables(
    kafka: Any, spark: Any, conf_dir: Path, dataset: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, pd.DataFrame]:
    workdir = tmp_path_factory.mktemp("clean")
    return clean_run(
        kafka, spark, conf_dir, workdir, dataset, BATCH_SIZE, environ=dict(COMPACT_EVERY_BATCH)
    )


def _crash_and_recover(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    topic: str,
    workdir: Path,
    crash_points: list[str],
    before_restart: dict[str, Callable[[Pipeline], None]] | None = None,
    environ: dict[str, str] = COMPACT_EVERY_BATCH,
) -> dict[str, pd.DataFrame]:
    pipeline = replay_pipeline(kafka, conf_dir, workdir, topic, BATCH_SIZE, environ=dict(environ))
    return crash_and_recover(pipeline, spark, crash_points, before_restart)


# Each stream below is killed at every named point of its compaction mode in turn: the restart
# after one crash is itself killed at the next point, so each point is met by a stream that
# recovers from the crash before it, and the last restart runs to the end. Points are listed in
# the order a stream reaches them (offset 85 of a partition is read in batch 1: a batch's 150
# records are shared by the two partitions in proportion to their lag, about 300 each).
# Where a row ends is its key's partition however it got there (settled after every batch, by
# size in a merge, or from a run at the end), so one clean run is the reference for all three.
@pytest.mark.parametrize(
    ("crash_points", "environ"),
    [
        pytest.param(
            [
                f"{FaultPoint.KAFKA_READ}@{BATCH_SIZE // 2 + 10}",
                f"{FaultPoint.STATE_FUNCTION}@{BATCH_SIZE // 2 + 10}",
                f"{FaultPoint.BATCH_START}@1",
                f"{FaultPoint.BETWEEN_TABLE_COMMITS}@1",
                f"{FaultPoint.BEFORE_COMPACTION_COMMIT}@1",
                f"{FaultPoint.AFTER_DELTA_COMMITS}@2",
                f"{FaultPoint.AFTER_COMPACTION_COMMIT}@2",
            ],
            COMPACT_EVERY_BATCH,
            id="settled-after-every-batch",
        ),
        pytest.param(
            [
                f"{FaultPoint.BEFORE_COMPACTION_COMMIT}@1",
                f"{FaultPoint.BETWEEN_SETTLE_SLICES}@1",
                f"{FaultPoint.BETWEEN_SETTLE_SLICES}@3",
            ],
            SLICED_EVERY_BATCH,
            id="settled-in-slices",
        ),
        pytest.param(
            [
                f"{FaultPoint.BEFORE_COMPACTION_COMMIT}@1",
                f"{FaultPoint.AFTER_COMPACTION_COMMIT}@2",
            ],
            MERGE_EVERY_BATCH,
            id="merging",
        ),
    ],
)
# A crashed process takes half a minute on a busy 2-CPU machine; seven of them, then the restart.
@pytest.mark.timeout(900)
def test_crashes_at_each_named_point_in_turn_leave_the_same_output_after_restart(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    dataset: str,
    clean_tables: dict[str, pd.DataFrame],
    tmp_path: Path,
    crash_points: list[str],
    environ: dict[str, str],
) -> None:
    recovered = _crash_and_recover(
        kafka, spark, conf_dir, dataset, tmp_path, crash_points, environ=environ
    )
    assert_same_tables(recovered, clean_tables)


def test_a_half_written_checkpoint_file_is_ignored_on_restart(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    dataset: str,
    clean_tables: dict[str, pd.DataFrame],
    tmp_path: Path,
) -> None:
    # Spark writes checkpoint files to a temp name and renames; a crash during the write
    # leaves only the temp file behind.
    def leave_half_written_offsets(pipeline: Pipeline) -> None:
        offsets = pipeline.workdir / "checkpoint" / "offsets"
        (offsets / ".2.5f0c3e1a-dead-beef-0000-000000000000.tmp").write_bytes(b'v1\n{"batchW')

    recovered = _crash_and_recover(
        kafka,
        spark,
        conf_dir,
        dataset,
        tmp_path,
        [f"{FaultPoint.AFTER_DELTA_COMMITS}@1"],
        before_restart={f"{FaultPoint.AFTER_DELTA_COMMITS}@1": leave_half_written_offsets},
    )
    assert_same_tables(recovered, clean_tables)


@pytest.mark.crash_matrix
# Each crash-and-restart takes about a minute on a loaded 2-CPU machine.
@pytest.mark.timeout(300 + 120 * RANDOM_CRASHES)
def test_random_crashes_leave_the_same_output_after_restart(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    dataset: str,
    clean_tables: dict[str, pd.DataFrame],
    tmp_path: Path,
) -> None:
    """`TENANT_WINDOWS_RANDOM_CRASHES` runs (CI: 3; the full matrix: 20), each at a random point."""
    batches = RECORDS // BATCH_SIZE
    rng = random.Random(int(os.environ.get("TENANT_WINDOWS_RANDOM_CRASH_SEED", "20261122")))
    for run in range(RANDOM_CRASHES):
        # Points this stream never reaches: the sample config has no `notify` (delivery points
        # are tests/integration/notify/test_notify_stream.py's), and reprocess points are
        # tests/integration/lake/test_reprocess.py's; a settle in slices is the sliced params'.
        elsewhere = DELIVERY_POINTS | REPROCESS_POINTS | {FaultPoint.BETWEEN_SETTLE_SLICES}
        point = rng.choice([point for point in FaultPoint if point not in elsewhere])
        if point in (FaultPoint.KAFKA_READ, FaultPoint.AFTER_DEFERRAL, FaultPoint.STATE_FUNCTION):
            position = rng.randrange(0, RECORDS // 2)  # an offset in one of two partitions
        else:
            position = rng.randrange(0, batches)
        crash_at = f"{point}@{position}"
        recovered = _crash_and_recover(
            kafka, spark, conf_dir, dataset, tmp_path / f"run-{run}", [crash_at]
        )
        try:
            assert_same_tables(recovered, clean_tables)
        except AssertionError as error:
            raise AssertionError(f"after a crash at {crash_at}: {error}") from error


def test_every_batch_is_reported_once_across_crashes_and_restarts_with_no_error_logged(
    kafka: Any, conf_dir: Path, dataset: str, tmp_path: Path
) -> None:
    """Two SIGKILLs after committed batches, then a continuous restart that also runs batches
    without records, in which timeouts fire (`config_recheck_interval` 1s), and stops on
    SIGTERM: one progress line per batch id over the three runs, and no ERROR line.

    The first batch of each restart re-runs the batch planned before the kill, for which Spark
    reports no latest offset; the last kill comes after the re-run batch's Delta commits, so the
    last restart also re-runs a batch every table already holds.
    """
    pipeline = replay_pipeline(
        kafka, conf_dir, tmp_path, dataset, BATCH_SIZE, trigger_interval=RESTART_TRIGGER_INTERVAL
    )
    logs: list[Path] = []
    # Killed inside the batch after a committed one: the committed one was reported a whole
    # batch's work earlier (Spark posts its progress event before planning the next batch).
    for run, crash_at in enumerate(
        [f"{FaultPoint.BEFORE_DELTA_COMMIT}@1", f"{FaultPoint.AFTER_DELTA_COMMITS}@2"]
    ):
        logs.append(tmp_path / f"killed-{run}.log")
        code = run_process(pipeline, logs[-1], fault=["--crash-at", crash_at])
        assert code == -signal.SIGKILL, logs[-1].read_text()[-3000:]

    logs.append(tmp_path / "restarted.log")
    last_batch = LAST_DATA_BATCH + EMPTY_BATCHES
    with logs[-1].open("wb") as out:
        process = start_process(
            pipeline,
            out,
            environ={"TW_STREAM__CONFIG_RECHECK_INTERVAL": "1s"},
            available_now=False,
        )
        try:
            wait_for_commit_log(pipeline, last_batch, process, RESTART_TIMEOUT_S)
        finally:
            # A graceful stop, so the batch in progress is finished and reported too.
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
            code = wait_or_kill(process, RESTART_TIMEOUT_S)
    output = [line for path in logs for line in path.read_text().splitlines()]
    assert code == 0, "\n".join(output[-50:])

    reported = [
        json.loads(line.split(f" {PROGRESS_LOGGER}: ", 1)[1])["batch_id"]
        for line in output
        if f" INFO {PROGRESS_LOGGER}: " in line
    ]
    committed = max(
        int(p.name) for p in (tmp_path / "checkpoint" / "commits").iterdir() if p.name.isdigit()
    )
    assert committed >= last_batch
    assert sorted(reported) == list(range(committed + 1)), reported
    errors = [line for line in output if " ERROR " in line or line.startswith("Traceback")]
    assert not errors, "\n".join(errors)
