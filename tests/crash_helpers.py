"""Crash a real `tenant-windows run` with the SIGKILL fault hook, restart it, compare the tables.

Shared by the crash tests on a local lake and on S3 (SeaweedFS).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import pandas as pd

from storage.lake.tables import ALL_TABLES
from tests.harness import Pipeline

ROOT = Path(__file__).resolve().parents[1]
# Batch timestamps of the batches after a crash differ from the clean run's: not comparable.
WALL_CLOCK_COLUMNS = {"processing_time", "last_record_processing_time"}
RUN_TIMEOUT_S = 240


def snapshot(pipeline: Pipeline) -> dict[str, pd.DataFrame]:
    """Every table as a multiset of rows, without wall-clock columns."""
    tables = {}
    for spec in ALL_TABLES:
        frame = pipeline.table(spec.name)
        frame = frame.drop(columns=[c for c in frame.columns if c in WALL_CLOCK_COLUMNS])
        # A multiset of rows: sort by every column, as text so maps and lists compare too.
        as_text = frame.astype(str)
        tables[spec.name] = as_text.sort_values(list(as_text.columns)).reset_index(drop=True)
    return tables


def table_versions(pipeline: Pipeline) -> dict[str, int]:
    lake = pipeline.lake
    return {spec.name: lake.open(spec).version() for spec in ALL_TABLES}


def assert_every_record_landed_once(pipeline: Pipeline) -> None:
    """Each produced (partition, offset) is in exactly one row of events, late_events or
    quarantine (the sample config's windows are tumbling: one window per record)."""
    landed: Counter[tuple[int, int]] = Counter()
    for name in ("events", "late_events", "quarantine"):
        frame = pipeline.table(name)
        landed.update(zip(frame["partition"].astype(int), frame["offset"].astype(int), strict=True))
    duplicated = {coordinates: n for coordinates, n in landed.items() if n > 1}
    assert not duplicated, f"records landed more than once: {sorted(duplicated)[:10]}"
    assert set(landed) == pipeline.produced_coordinates()


def assert_same_tables(actual: dict[str, pd.DataFrame], expected: dict[str, pd.DataFrame]) -> None:
    for name, frame in expected.items():
        pd.testing.assert_frame_equal(actual[name], frame, obj=f"table {name}")


def wait_for_commit_log(
    pipeline: Pipeline, batch_id: int, process: subprocess.Popen[bytes], deadline_s: float
) -> None:
    """Until Spark logged `batch_id` as done, i.e. after all of its Delta commits."""
    marker = pipeline.workdir / "checkpoint" / "commits" / str(batch_id)
    deadline = time.monotonic() + deadline_s
    while not marker.exists():
        assert process.poll() is None, "the stream ended before it committed its first batches"
        assert time.monotonic() < deadline, f"batch {batch_id} not committed in {deadline_s}s"
        time.sleep(0.2)


def start_process(
    pipeline: Pipeline,
    log: IO[bytes],
    environ: dict[str, str] | None = None,
    available_now: bool = True,
    fault: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start `tenant-windows run` in its own process group, output to `log`; `fault` installs
    a fault hook (see `Pipeline.cli_run`)."""
    extra = ["--available-now"] if available_now else []
    return subprocess.Popen(
        pipeline.cli_run(*extra, fault=fault),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        # The pipeline's own TW_* settings (e.g. S3 keys) reach the process by environment.
        env=pipeline.process_environ(**(environ or {})),
        start_new_session=True,  # its own process group: the fault hook kills just that
    )


def wait_or_kill(process: subprocess.Popen[bytes], timeout_s: float) -> int:
    """The exit code; past `timeout_s` the process group is killed and TimeoutExpired raised."""
    try:
        return process.wait(timeout=timeout_s)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def run_process(
    pipeline: Pipeline,
    log_path: Path,
    environ: dict[str, str] | None = None,
    timeout_s: float = RUN_TIMEOUT_S,
    fault: Sequence[str] = (),
) -> int:
    """Run `tenant-windows run --available-now` to its end; its exit code (-9: SIGKILL)."""
    with log_path.open("wb") as log:
        return wait_or_kill(start_process(pipeline, log, environ, fault=fault), timeout_s)


def crash_and_recover(
    pipeline: Pipeline,
    spark: Any,
    crash_at: str,
    before_restart: Callable[[Pipeline], None] | None = None,
) -> dict[str, pd.DataFrame]:
    """Run until the fault hook kills the run at `crash_at`, restart in `spark`, snapshot."""
    log_path = pipeline.workdir / "crashed-run.log"
    code = run_process(pipeline, log_path, fault=["--crash-at", crash_at])
    assert code == -signal.SIGKILL, (
        f"expected a SIGKILL at {crash_at}, got exit code {code}:\n" + log_path.read_text()[-3000:]
    )
    if before_restart is not None:
        before_restart(pipeline)
    pipeline.run_available_now(spark)
    return snapshot(pipeline)
