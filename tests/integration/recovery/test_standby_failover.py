"""A ready standby takes over from a running instance killed mid-batch, and a standby takes over
from that one killed in turn, and the tables end as a clean run's: each record once, each final
pane once.

Each instance is a real `tenant-windows run` process (a continuous stream: a standby is one).
The running one is held by the pause hook between two table commits of a batch (half of that
batch committed), a `run --standby` beside it gets ready, and then the held instance's whole
process group is SIGKILLed, as a lost machine would be. The standby claims the stream, replays
the half-done batch and goes on, until it is held and killed in turn, with the next standby
beside it. The last one runs until every record landed, and stops on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from subprocess import Popen
from typing import IO, Any

import pandas as pd
import pytest

from infra.dev.load_generator import LoadSpec
from infra.dev.local_process import process_state
from streaming.fault_points import FaultPoint
from tenants.conf_reader import load_registry
from tests.support.datasets import clean_run, sample_records
from tests.support.pipeline_harness import Pipeline
from tests.support.stream_process import kill_group, start_process, wait_or_kill
from tests.support.table_snapshots import (
    assert_every_record_landed_once,
    assert_same_tables,
    snapshot,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

BATCH_SIZE = 100
RECORDS = 800  # eight batches
# Each instance is held, and killed, mid-way through the commits of one of these batches; the
# standby beside it replays that batch. The last standby runs to the end of the topic. Two kills
# prove what a third did: the first standby takes over from the instance that started the
# stream, the second from a standby that had itself taken over (a third was the second again,
# for another minute of two Spark starts on this machine).
KILLED_IN_BATCHES = (1, 3)
# This 2-core machine is shared: a start and a batch have each taken minutes here.
READY_S = 400
RUN_TIMEOUT_S = 400
# Columns that depend on where a continuous stream's batches fall, not on the records: batches
# without data take batch ids, and close windows at their own watermark; and where a row lies,
# staged or settled (a continuous stream settles on its merge interval, a clean run at its end).
BATCH_COLUMNS = ["batch_id", "watermark", "lateness_ms"]
LAYOUT_PREFIX = "layout_"
READY_LINE = "ready, waiting for its lease"


# Three starts and a clean run: minutes on a quiet machine, far more on a busy one.
@pytest.mark.timeout(1800)
def test_standbys_take_over_from_two_kills_mid_batch_and_the_tables_match_a_clean_run(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    pipeline = Pipeline.create(
        kafka,
        tmp_path / "failover",
        conf_dir,
        partitions=2,
        max_offsets_per_trigger=BATCH_SIZE,
        trigger_interval="500ms",
        # Only the kill lets a standby in: a held instance is not taken over for its silence
        # while the next standby starts, however long that takes here.
        environ={"TW_STREAM__LEASE_TTL": "1h"},
    )
    spec = LoadSpec(count=RECORDS, late_share=0.1, malformed_share=0.05, jitter=30_000, seed=5)
    pipeline.produce_samples(sample_records(load_registry(conf_dir), spec))

    logs: list[IO[bytes]] = []
    instances: list[Popen[bytes]] = []
    try:
        running = _instance(pipeline, tmp_path, logs, instances, [], KILLED_IN_BATCHES[0])
        for number, batch_id in enumerate(KILLED_IN_BATCHES):
            _wait_until_held(running, batch_id)
            following = KILLED_IN_BATCHES[number + 1 : number + 2]
            standby = _instance(pipeline, tmp_path, logs, instances, ["--standby"], *following)
            _wait_for_line(standby, READY_LINE)
            os.killpg(running.pid, signal.SIGKILL)  # mid-batch: the driver, its JVM, workers
            running.wait(timeout=30)
            running = standby
        wait_until(
            lambda: _landed(pipeline) >= RECORDS,
            RUN_TIMEOUT_S,
            "every record landed",
            alive=lambda: _alive(running),
            interval_s=1,
        )
        running.send_signal(signal.SIGTERM)
        code = wait_or_kill(running, RUN_TIMEOUT_S)
        assert code == 0, _output(running)[-3000:]
    finally:
        for process in instances:
            kill_group(process)
        for log in logs:
            log.close()

    # Every instance after the first took the stream over from a dead one.
    for standby in instances[1:]:
        assert "taking over from dead" in _output(standby), _output(standby)[-3000:]
    assert_every_record_landed_once(pipeline)
    failed_over = _without_batch_columns(snapshot(pipeline))
    final = failed_over["windows"][failed_over["windows"]["is_final"] == "True"]
    panes = Counter(zip(final["tenant"], final["source"], final["window_id"], strict=True))
    assert not [pane for pane, count in panes.items() if count > 1], "a final pane twice"
    clean = clean_run(kafka, spark, conf_dir, tmp_path / "clean", pipeline.topic, BATCH_SIZE)
    assert_same_tables(failed_over, _without_batch_columns(clean))


def _without_batch_columns(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The records' tables and the final panes, without `BATCH_COLUMNS` and layout columns, in
    one order."""
    compared = {}
    for name in ("events", "late_events", "quarantine", "windows"):
        frame = tables[name]
        if name == "windows":
            frame = frame[frame["is_final"] == "True"]
        frame = frame.drop(
            columns=[
                column
                for column in frame.columns
                if column in BATCH_COLUMNS or column.startswith(LAYOUT_PREFIX)
            ]
        )
        compared[name] = frame.sort_values(list(frame.columns)).reset_index(drop=True)
    return compared


def _landed(pipeline: Pipeline) -> int:
    try:
        return sum(len(pipeline.table(name)) for name in ("events", "late_events", "quarantine"))
    except Exception:  # a table not created yet, or being committed
        return 0


def _alive(process: Popen[bytes]) -> None:
    assert process.poll() is None, f"it exited:\n{_output(process)[-3000:]}"


def _instance(
    pipeline: Pipeline,
    tmp_path: Path,
    logs: list[IO[bytes]],
    instances: list[Popen[bytes]],
    flags: Sequence[str],
    *held_in_batch: int,
) -> Popen[bytes]:
    """Start an instance (held between table commits of `held_in_batch`, if given)."""
    log_path = tmp_path / f"instance-{len(instances)}.log"
    log = log_path.open("wb")
    logs.append(log)
    fault = [
        argument
        for batch_id in held_in_batch
        for argument in ("--pause-at", f"{FaultPoint.BETWEEN_TABLE_COMMITS}@{batch_id}")
    ]
    process = start_process(pipeline, log, available_now=False, fault=fault, flags=flags)
    process.log_path = log_path  # type: ignore[attr-defined]
    instances.append(process)
    return process


def _output(process: Popen[bytes]) -> str:
    path: Path = process.log_path  # type: ignore[attr-defined]
    return path.read_text(errors="replace")


def _own_output(process: Popen[bytes]) -> str:
    """What the instance logged of the stream's own batches: a standby's after it was ready,
    as its rehearsal's batches (on scratch) are numbered from 0 too."""
    output = _output(process)
    ready = output.rfind(READY_LINE)
    return output if ready < 0 else output[ready:]


def _wait_until_held(process: Popen[bytes], batch_id: int) -> None:
    """Until the pause hook stopped the driver (state T) mid-way through `batch_id`."""
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        state = process_state(process.pid)
        if state == "T":
            assert f"batch {batch_id}: " not in _own_output(process), "the batch was finished"
            return
        if state == "Z" or process.poll() is not None:
            pytest.fail(f"it exited before batch {batch_id}:\n{_output(process)[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"not held in batch {batch_id}:\n{_output(process)[-3000:]}")


def _wait_for_line(process: Popen[bytes], line: str) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if line in _output(process):
            return
        if process.poll() is not None:
            pytest.fail(f"it exited ({process.returncode}):\n{_output(process)[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"no {line!r} in:\n{_output(process)[-3000:]}")
