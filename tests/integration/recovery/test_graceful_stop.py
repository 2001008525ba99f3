"""SIGTERM finishes the batch in progress, exits 0 without a Java trace, and a restart goes on
where it stopped.

A real `tenant-windows run --available-now` is held mid-batch by the pause hook (after its
first table's Delta commit of batch 1), gets SIGTERM while held, and is let go on. A batch that
outlasts `stream.stop_grace` is cut short instead; its replay on restart loses nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from infra.dev.load_generator import LoadSpec
from infra.dev.local_process import process_state
from storage.lake.tables import ALL_TABLES
from streaming.checkpoint.checkpoint_log import COMMITS_DIR, OFFSETS_DIR, CheckpointLog
from streaming.fault_points import FaultPoint
from tenants.conf_reader import load_registry
from tests.support.datasets import clean_run, sample_records
from tests.support.pipeline_harness import Pipeline, record
from tests.support.stream_process import (
    killed_on_exit,
    start_process,
    wait_for_commit_log,
    wait_or_kill,
)
from tests.support.table_snapshots import (
    assert_every_record_landed_once,
    assert_same_tables,
    snapshot,
)
from tests.support.timestamps import T0_MS
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

BATCH_SIZE = 150
RECORDS = 600  # four batches
PAUSED_BATCH = 1
# This 2-core machine is shared: a batch has taken 40 s here.
WAIT_FOR_PAUSE_S = 300
# State store maintenance every 100 ms (every minute by default), a snapshot at every run of it
# (every 10 versions by default), so that one runs as the session stops: it used to lose that
# race with a 27-line Java trace.
MAINTENANCE_OFTEN = {
    "PYSPARK_SUBMIT_ARGS": (
        "--conf spark.sql.streaming.stateStore.maintenanceInterval=100ms "
        "--conf spark.sql.streaming.stateStore.minDeltasForSnapshot=1 pyspark-shell"
    )
}
STATE_VERSIONS = 12
RUN_TIMEOUT_S = 300
# A stop between batches waits for no batch: what is left is the query's and the session's stop,
# seconds. It once waited out the state store maintenance pool's shutdown timeout (300 s).
STOPPED_BETWEEN_BATCHES_WITHIN_S = 90


def test_sigterm_mid_batch_commits_that_batch_exits_0_and_a_restart_matches_a_clean_run(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    stopped = _producing_pipeline(kafka, conf_dir, tmp_path)

    code, output = _sigterm_while_paused(stopped, tmp_path / "stopped-run.log", hold_s=0)

    assert code == 0, output[-3000:]
    assert "stopping between batches" in output, output[-3000:]
    assert f"batch {PAUSED_BATCH}: " in output, "the paused batch's commits were not finished"
    # Nothing half done: the last batch Spark planned is committed, in the checkpoint and in
    # every table; the stop came before the topic was drained.
    checkpoint = CheckpointLog(stopped.settings.stream.checkpoint_dir)
    committed = checkpoint.latest_batch(COMMITS_DIR)
    assert committed is not None and PAUSED_BATCH <= committed < RECORDS // BATCH_SIZE - 1
    # Spark may have planned the next batch in the moment before the query stopped; then it
    # wrote nothing of it (the table check below), and the restart runs it.
    assert checkpoint.latest_batch(OFFSETS_DIR) in (committed, committed + 1)
    lake = stopped.lake
    assert {spec.name: lake.committed_batch(spec, stopped.stream_name) for spec in ALL_TABLES} == {
        spec.name: committed for spec in ALL_TABLES
    }
    _assert_a_restart_matches_a_clean_run(stopped, kafka, spark, conf_dir, tmp_path)


def test_a_batch_outlasting_the_grace_period_is_cut_short_and_a_restart_matches_a_clean_run(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    stopped = _producing_pipeline(
        kafka, conf_dir, tmp_path, environ={"TW_STREAM__STOP_GRACE": "1s"}
    )

    # Each table commit of the batch is held longer than the whole grace period.
    code, output = _sigterm_while_paused(stopped, tmp_path / "stopped-run.log", hold_s=3)

    assert code == 0, output[-3000:]
    assert f"batch {PAUSED_BATCH} did not finish within the grace period" in output, output[-3000:]
    _assert_a_restart_matches_a_clean_run(stopped, kafka, spark, conf_dir, tmp_path)


def test_a_stop_past_the_grace_period_interrupts_a_spark_job_without_a_trace(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    stopped = _producing_pipeline(
        kafka, conf_dir, tmp_path, environ={"TW_STREAM__STOP_GRACE": "1s"}
    )
    log_path = tmp_path / "stopped-run.log"
    # The state function's Python workers stop: the driver waits in the batch's Spark job.
    fault = ["--pause-at", FaultPoint.STATE_FUNCTION]
    with (
        log_path.open("wb") as log,
        killed_on_exit(start_process(stopped, log, fault=fault)) as process,
    ):
        _wait_for_output(process, log_path, f"SIGSTOP at {FaultPoint.STATE_FUNCTION}")
        process.send_signal(signal.SIGTERM)
        code = wait_or_kill(process, RUN_TIMEOUT_S)
    output = log_path.read_text(errors="replace")

    assert code == 0, output[-3000:]
    assert "batch 0 did not finish within the grace period" in output, output[-3000:]
    assert "batch 0 had begun as the stream stopped" in output, output[-3000:]
    _assert_no_trace(output)
    _assert_a_restart_matches_a_clean_run(stopped, kafka, spark, conf_dir, tmp_path)


def test_sigterm_of_a_running_stream_exits_0_without_a_java_trace(
    kafka: Any, conf_dir: Path, tmp_path: Path
) -> None:
    pipeline = Pipeline.create(kafka, tmp_path / "running", conf_dir, trigger_interval="500ms")
    log_path = tmp_path / "running.log"
    with (
        log_path.open("wb") as log,  # the stream's stdout and stderr
        killed_on_exit(
            start_process(pipeline, log, MAINTENANCE_OFTEN, available_now=False)
        ) as process,
    ):
        # More state versions than a snapshot waits for: maintenance writes snapshots.
        for batch_id in range(STATE_VERSIONS):
            pipeline.produce([record("acme", "web", T0_MS + batch_id * 1_000)])
            wait_for_commit_log(pipeline, batch_id, process, WAIT_FOR_PAUSE_S)
        process.send_signal(signal.SIGTERM)
        code = wait_or_kill(process, STOPPED_BETWEEN_BATCHES_WITHIN_S)
    output = log_path.read_text(errors="replace")

    assert code == 0, output[-3000:]
    assert "stopping between batches" in output, output[-3000:]
    _assert_no_trace(output)
    assert "Exception" not in output, output[-5000:]
    events = pipeline.table("events")
    assert not events.duplicated(["partition", "offset"]).any(), "a record landed twice"


def _producing_pipeline(
    kafka: Any, conf_dir: Path, tmp_path: Path, environ: dict[str, str] | None = None
) -> Pipeline:
    registry = load_registry(conf_dir)
    spec = LoadSpec(count=RECORDS, late_share=0.1, malformed_share=0.05, jitter=30_000, seed=3)
    samples = sample_records(registry, spec)
    pipeline = Pipeline.create(
        kafka,
        tmp_path / "stopped",
        conf_dir,
        partitions=2,
        max_offsets_per_trigger=BATCH_SIZE,
        environ=dict(environ or {}),
    )
    pipeline.produce_samples(samples)
    return pipeline


def _sigterm_while_paused(pipeline: Pipeline, log_path: Path, hold_s: float) -> tuple[int, str]:
    """Run the stream held at each table commit of `PAUSED_BATCH` (`hold_s` each time), send
    SIGTERM at the first hold; the exit code and the output."""
    fault = ["--pause-at", f"{FaultPoint.BETWEEN_TABLE_COMMITS}@{PAUSED_BATCH}"]
    with (
        log_path.open("wb") as log,
        killed_on_exit(start_process(pipeline, log, fault=fault)) as process,
    ):
        _wait_until_paused(process.pid, log_path)
        # Delivered when the driver runs again: mid-way through the batch's commits.
        os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while process.poll() is None and time.monotonic() < deadline:
            if process_state(process.pid) == "T":
                time.sleep(hold_s)
                os.kill(process.pid, signal.SIGCONT)
            time.sleep(0.2)
        code = wait_or_kill(process, timeout_s=1)
    return code, log_path.read_text()


def _assert_a_restart_matches_a_clean_run(
    stopped: Pipeline, kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    stopped.run_available_now(spark)
    clean = clean_run(kafka, spark, conf_dir, tmp_path / "clean", stopped.topic, BATCH_SIZE)
    assert_same_tables(snapshot(stopped), clean)
    assert_every_record_landed_once(stopped)


def _assert_no_trace(output: str) -> None:
    lines = output.splitlines()
    frames = [number for number, line in enumerate(lines) if line.lstrip().startswith("at ")]
    trace = "\n".join(lines[frames[0] - 3 : frames[0] + 5]) if frames else ""
    assert not frames, f"a Java trace on stopping:\n{trace}"
    assert "Traceback" not in output, output[-5000:]


def _wait_for_output(process: subprocess.Popen[bytes], log_path: Path, text: str) -> None:
    """Until the stream's output holds `text`, bounded; fails at once if the stream exits."""

    def holds_it() -> bool:
        output = log_path.read_text(errors="replace")
        assert text in output, f"no {text!r} in the stream's output:\n{output[-3000:]}"
        return True

    def running() -> None:
        assert process.poll() is None, f"the stream exited:\n{log_path.read_text()[-3000:]}"

    wait_until(
        holds_it,
        WAIT_FOR_PAUSE_S,
        repr(text),
        alive=running,
        retry_on_assertion=True,
        interval_s=0.2,
    )


def _wait_until_paused(pid: int, log_path: Path) -> None:
    """Until the pause hook has SIGSTOPped the driver (state T), bounded."""
    deadline = time.monotonic() + WAIT_FOR_PAUSE_S
    while time.monotonic() < deadline:
        state = process_state(pid)
        if state == "T":
            return
        if state == "Z":
            pytest.fail(f"the stream exited before the pause:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"the stream did not reach the pause point:\n{log_path.read_text()[-3000:]}")
