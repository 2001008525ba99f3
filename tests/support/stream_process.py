"""Run a real `tenant-windows run` as a process of its own: start it, wait for its commits, kill
it with the SIGKILL fault hook (once or at several points in turn), restart it in the test's
Spark session.

Shared by the crash, stop, hang and outage tests on a local lake and on S3.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pandas as pd

from infra.dev.benchmarks.stream_processes import kind_of
from infra.dev.local_process import descendants
from tests.support.paths import ROOT
from tests.support.pipeline_harness import Pipeline
from tests.support.table_snapshots import snapshot
from tests.support.waiting import wait_until

RUN_TIMEOUT_S = 240


def wait_for_commit_log(
    pipeline: Pipeline, batch_id: int, process: subprocess.Popen[bytes], deadline_s: float
) -> None:
    """Until Spark logged `batch_id` as done, i.e. after all of its Delta commits."""
    marker = pipeline.workdir / "checkpoint" / "commits" / str(batch_id)

    def running() -> None:
        assert process.poll() is None, "the stream ended before it committed its first batches"

    wait_until(
        marker.exists, deadline_s, f"batch {batch_id} committed", alive=running, interval_s=0.2
    )


def start_process(
    pipeline: Pipeline,
    log: IO[bytes],
    environ: dict[str, str] | None = None,
    available_now: bool = True,
    fault: Sequence[str] = (),
    flags: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start `tenant-windows run` in its own process group, output to `log`; `fault` installs
    a fault hook (see `Pipeline.cli_run`); `flags` are more of `run`'s flags."""
    extra = ["--available-now"] if available_now else []
    return subprocess.Popen(
        pipeline.cli_run(*extra, *flags, fault=fault),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        # The pipeline's own TW_* settings (e.g. S3 keys) reach the process by environment.
        env=pipeline.process_environ(**(environ or {})),
        start_new_session=True,  # its own process group: the fault hook kills just that
    )


def wait_or_kill(process: subprocess.Popen[bytes], timeout_s: float) -> int:
    """The exit code; past `timeout_s` the process group is killed and TimeoutExpired raised,
    with the threads of its JVMs that wait on or hold a lock (`lock_holding_java_threads`)."""
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired as timeout:
        timeout.add_note(lock_holding_java_threads(process))
        raise
    finally:
        kill_group(process)


def lock_holding_java_threads(process: subprocess.Popen[bytes]) -> str:
    """The stacks of the threads that hold or wait for a monitor in each JVM `process` started:
    what a hung stop is stuck on (the whole dump is thousands of lines)."""
    found = []
    for pid in descendants(process.pid):
        if kind_of(pid, process.pid) != "jvm":
            continue
        try:
            # The JDK's own jstack, beside the java binary that runs the JVM.
            jstack = Path(os.readlink(f"/proc/{pid}/exe")).with_name("jstack")
        except OSError:
            continue  # it ended meanwhile
        if not jstack.exists():
            found.append(f"JVM {pid}: no jstack beside {jstack.parent}/java")
            continue
        dump = subprocess.run(
            [jstack, str(pid)], capture_output=True, text=True, timeout=60, check=False
        ).stdout
        threads = [
            thread
            for thread in dump.split("\n\n")
            if "- locked" in thread or "waiting to lock" in thread
        ]
        found.append(f"JVM {pid}, threads holding or waiting for a lock:\n" + "\n\n".join(threads))
    return "\n".join(found) or "no JVM in the process group"


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """If `process` still runs: SIGKILL its process group (the driver, its JVM and workers, as
    `start_process` makes it), and reap it."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


@contextmanager
def killed_on_exit(process: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """`process`, its group killed on the way out if it still runs (a wait in the block failed)."""
    try:
        yield process
    finally:
        kill_group(process)


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


def crash_in_turn(
    pipeline: Pipeline,
    crash_points: Sequence[str],
    before_restart: Mapping[str, Callable[[Pipeline], None]] | None = None,
) -> None:
    """Run the stream as a process until the fault hook kills it at the first of `crash_points`,
    restart it as a process killed at the next one, and so on.

    Each point must be one the restart before it reaches: its batch is the one the crash before
    cut short, or a later one. `before_restart` maps a point to what to do with the lake after
    the crash there (look at it, damage it), before the next restart.
    """
    for number, crash_at in enumerate(crash_points):
        log_path = pipeline.workdir / f"crashed-run-{number}.log"
        code = run_process(pipeline, log_path, fault=["--crash-at", crash_at])
        assert code == -signal.SIGKILL, (
            f"expected a SIGKILL at {crash_at} (after crashes at {list(crash_points[:number])}),"
            f" got exit code {code}:\n" + log_path.read_text()[-3000:]
        )
        if before_restart is not None and crash_at in before_restart:
            before_restart[crash_at](pipeline)


def crash_and_recover(
    pipeline: Pipeline,
    spark: Any,
    crash_points: Sequence[str],
    before_restart: Mapping[str, Callable[[Pipeline], None]] | None = None,
) -> dict[str, pd.DataFrame]:
    """`crash_in_turn`, then restart the stream in `spark`, run it to its end and snapshot the
    tables."""
    crash_in_turn(pipeline, crash_points, before_restart)
    pipeline.run_available_now(spark)
    return snapshot(pipeline)
