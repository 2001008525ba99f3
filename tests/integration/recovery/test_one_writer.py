"""One writer per stream, with the real stream: a second instance, a standby and a zombie.

Each instance is a real `tenant-windows run` process. The zombie is paused with SIGSTOP by the
fault hook just before a Delta commit, as a long GC pause or a frozen VM would, and resumed
after a newer instance has taken the stream over and finished.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from infra.dev.load_generator import LoadSpec
from infra.dev.local_process import process_state
from storage.lake.writer_lease import LEASE_TABLE
from streaming.fault_points import FaultPoint
from tests.support.datasets import sample_records
from tests.support.paths import ROOT
from tests.support.pipeline_harness import Pipeline, record
from tests.support.stream_process import killed_on_exit, start_process
from tests.support.table_snapshots import assert_every_record_landed_once, table_versions
from tests.support.timestamps import T0_MS
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

LEASE_TTL = {"TW_STREAM__LEASE_TTL": "3s"}


@contextmanager
def _instance(
    pipeline: Pipeline, available_now: bool, fault: Sequence[str] = (), flags: Sequence[str] = ()
) -> Iterator[Popen[bytes]]:
    """A `tenant-windows run` process, killed on the way out if it is still running."""
    log_path = pipeline.workdir / f"instance-{time.monotonic_ns()}.log"
    with log_path.open("wb") as log:
        process = start_process(
            pipeline, log, available_now=available_now, fault=fault, flags=flags
        )
        process.log_path = log_path  # type: ignore[attr-defined]
        with killed_on_exit(process):
            yield process


def _log(process: Popen[bytes]) -> str:
    path: Path = process.log_path  # type: ignore[attr-defined]
    return path.read_text(errors="replace")


def _wait_while_alive(
    what: str, done: Callable[[], bool], process: Popen[bytes], timeout_s: float
) -> None:
    def running() -> None:
        if process.poll() is not None:
            raise AssertionError(
                f"the instance exited ({process.returncode}):\n{_log(process)[-3000:]}"
            )

    wait_until(done, timeout_s, what, alive=running, interval_s=0.3)


def _wait_for_events(pipeline: Pipeline, rows: int, process: Popen[bytes]) -> None:
    """Until `events` holds `rows` rows, while `process` runs (at most 180 s)."""

    def holds_them() -> bool:
        try:
            return len(pipeline.table("events")) == rows
        except TableNotFoundError:  # not created yet, or its first commit is being written
            return False

    _wait_while_alive(f"{rows} rows in events", holds_them, process, timeout_s=180)


@contextmanager
def _running_stream(
    kafka: Any, conf_dir: Path, tmp_path: Path, records: int
) -> Iterator[tuple[Pipeline, Popen[bytes]]]:
    """A continuous `tenant-windows run` (500 ms trigger) that has windowed `records` records of
    one key; killed on the way out if it still runs."""
    pipeline = Pipeline.create(kafka, tmp_path, conf_dir, trigger_interval="500ms")
    pipeline.produce([record("acme", "web", T0_MS + i * 1_000) for i in range(records)])
    with _instance(pipeline, available_now=False) as process:
        _wait_for_events(pipeline, records, process)
        yield pipeline, process


def _wait_standing_by(standby: Popen[bytes]) -> None:
    """Until a `run --standby` is ready and waits for the lease: a JVM's start and the standby's
    rehearsal (a batch, then up to 30 s for records), each a minute in a busy CI."""
    _wait_while_alive("a standby", lambda: "ready, waiting" in _log(standby), standby, 400)


def _produce_until_rehearsed(pipeline: Pipeline, standby: Popen[bytes]) -> int:
    """Send a record of `acme` every 0.5 s until `standby` says its rehearsal ended (at most
    400 s); how many were sent."""
    for sent in range(800):
        if "rehearsed in" in _log(standby):
            return sent
        if standby.poll() is not None:
            raise AssertionError(f"the standby exited ({standby.returncode}): {_log(standby)}")
        pipeline.produce([record("acme", "web", T0_MS + 20_000 + sent * 10)])
        time.sleep(0.5)
    raise AssertionError(f"the standby did not rehearse within 400 s: {_log(standby)[-3000:]}")


def _claimed_by(tmp_path: Path) -> list[int]:
    """The PIDs that claimed the stream, by epoch."""
    claims = DeltaTable(str(tmp_path / "lake" / LEASE_TABLE)).to_pandas()
    return list(claims.sort_values("epoch")["pid"])


def test_a_second_instance_of_a_running_stream_fails_fast_and_writes_nothing(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    produced = 20
    with _running_stream(kafka, conf_dir, tmp_path, produced) as (pipeline, first):
        second_checkpoint = tmp_path / "second-checkpoint"
        second = subprocess.run(
            pipeline.cli_run("--checkpoint-dir", str(second_checkpoint)),
            cwd=ROOT,
            capture_output=True,
            env=pipeline.process_environ(),
            timeout=180,
            check=False,
        )
        stderr = second.stderr.decode()
        assert second.returncode == 2, stderr[-3000:]
        assert "stream 'test-stream' is already running" in stderr
        assert f"pid {first.pid}" in stderr
        assert not second_checkpoint.exists(), "the refused instance wrote a checkpoint"
        assert _claimed_by(tmp_path) == [first.pid], "the refused instance recorded a claim"

        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 0, _log(first)[-3000:]

    # A clean stop released the stream: the next instance starts at once and resumes.
    pipeline.produce([record("acme", "web", T0_MS + 60_000)])
    pipeline.run_available_now(spark)
    assert len(pipeline.table("events")) == produced + 1


def test_a_standby_claims_nothing_until_the_running_instance_dies_then_carries_on(
    kafka: Any, conf_dir: Path, tmp_path: Path
) -> None:
    before = 20
    with _running_stream(kafka, conf_dir, tmp_path, before) as (pipeline, active):
        # A standby stopped while it waits leaves without a trace.
        with _instance(pipeline, available_now=False, flags=["--standby"]) as idle:
            _wait_standing_by(idle)
            idle.send_signal(signal.SIGTERM)
            assert idle.wait(timeout=60) == 0, _log(idle)[-3000:]
        assert _claimed_by(tmp_path) == [active.pid]

        with _instance(pipeline, available_now=False, flags=["--standby"]) as standby:
            # Records that come while it rehearses: it windows them on scratch, the stream for
            # real, and they land once.
            during = _produce_until_rehearsed(pipeline, standby)
            _wait_standing_by(standby)
            assert "(a batch with records)" in _log(standby), _log(standby)[-3000:]
            lake_root = Path(pipeline.settings.lake.root)
            scratch_lake = lake_root / "_rehearsal" / pipeline.settings.stream.name
            assert not scratch_lake.exists()
            assert not Path(f"{pipeline.settings.stream.checkpoint_dir}.rehearsal").exists()
            time.sleep(1.5)  # a few of its looks at the lease, while the holder lives
            assert _claimed_by(tmp_path) == [active.pid], "the standby claimed a live stream"

            os.killpg(active.pid, signal.SIGKILL)  # the driver and its JVM
            active.wait(timeout=30)
            after = [record("acme", "web", T0_MS + 30_000 + i * 1_000) for i in range(10)]
            pipeline.produce(after)
            _wait_for_events(pipeline, before + during + len(after), standby)
            assert "taking over from dead" in _log(standby)
            assert _claimed_by(tmp_path) == [active.pid, standby.pid]
            standby.send_signal(signal.SIGTERM)
            assert standby.wait(timeout=120) == 0, _log(standby)[-3000:]
    assert_every_record_landed_once(pipeline)


def test_a_zombie_instance_cannot_commit_after_a_newer_one_took_over(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    pipeline = Pipeline.create(
        kafka, tmp_path, conf_dir, partitions=2, max_offsets_per_trigger=60, environ=LEASE_TTL
    )
    registry = pipeline.registry()
    spec = LoadSpec(count=240, late_share=0.1, malformed_share=0.05, jitter=30_000, seed=11)
    pipeline.produce_samples(sample_records(registry, spec))

    pause_at = ["--pause-at", f"{FaultPoint.BEFORE_DELTA_COMMIT}@1"]
    with _instance(pipeline, available_now=True, fault=pause_at) as zombie:
        _wait_while_alive(
            "the pause before batch 1's commit",
            lambda: process_state(zombie.pid) == "T",
            zombie,
            180,
        )
        time.sleep(3.5)  # silent for longer than the lease TTL: it may be taken over

        pipeline.run_available_now(spark)
        after_takeover = table_versions(pipeline)

        zombie.send_signal(signal.SIGCONT)
        code = zombie.wait(timeout=120)
        zombie_log = _log(zombie)

    assert code == 1, zombie_log[-3000:]
    assert re.search(r"took (the stream|it) over", zombie_log), zombie_log[-3000:]
    assert table_versions(pipeline) == after_takeover, "the zombie committed after the take-over"
    assert_every_record_landed_once(pipeline)
