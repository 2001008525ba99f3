"""The continuous benchmark's view of a stream's processes, on a real process tree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from infra.dev.benchmarks.peak_memory import driver_jvm
from infra.dev.benchmarks.stream_processes import (
    SPAWNING,
    ProcessTree,
    folder_files,
    kind_of,
    pss_mib_by_kind,
    pss_mib_by_process,
    settled,
)
from infra.dev.local_process import descendants

# A parent that starts a Python worker by module, as Spark starts its daemons, and a program
# that is not Python, as Hadoop runs shell commands; then uses half a CPU second.
PARENT = """
import subprocess, sys, time
quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
worker = subprocess.Popen([sys.executable, "-m", "pyspark.daemon", "pyspark.sql.worker.x"], **quiet)
other = subprocess.Popen(["sleep", "30"], **quiet)
while time.process_time() < 0.5:
    pass
print("spun", flush=True)
time.sleep(30)
"""


def test_kinds_are_named_by_program_or_python_module_and_cpu_is_counted_by_kind() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE)
    try:
        tree = ProcessTree(parent.pid)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and {"x", "sleep"} - set(tree.first_seen_s):
            tree.look(0.0)
            time.sleep(0.1)
        assert parent.stdout is not None
        assert parent.stdout.readline() == b"spun\n"  # bounded: the parent spins 0.5 CPU s
        tree.look(1.0)
        assert {"driver", "x", "sleep"} <= set(tree.first_seen_s)
        # The parent spun for half a second: its CPU is the driver's.
        assert tree.cpu_s_by_kind()["driver"] >= 0.3
        assert kind_of(parent.pid, parent.pid) == "driver"
    finally:
        for child in descendants(parent.pid):  # only what this test started
            os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.wait()
    assert kind_of(parent.pid, root=1) == "gone"


# A `java` whose child has not yet run its command: the child still has the parent's command line.
SPAWNING_JVM = """
import os, sys, time
if os.fork() == 0:
    time.sleep(30)
    os._exit(0)
print("forked", flush=True)
time.sleep(30)
"""


def test_a_jvm_s_child_before_its_exec_is_not_counted_as_a_second_jvm(tmp_path: Path) -> None:
    java = tmp_path / "java"
    java.symlink_to(sys.executable)
    root = subprocess.Popen(["sleep", "30"])
    jvm = subprocess.Popen([str(java), "-c", SPAWNING_JVM], stdout=subprocess.PIPE)
    try:
        assert jvm.stdout is not None
        assert jvm.stdout.readline() == b"forked\n"
        (child,) = descendants(jvm.pid)
        assert kind_of(jvm.pid, root.pid) == "jvm"
        assert kind_of(child, root.pid) == SPAWNING
        assert set(pss_mib_by_kind(jvm.pid)) == {"driver"}  # the child is left out
        assert [len(each) for each in pss_mib_by_process(jvm.pid).values()] == [1]
        # The peak-memory sampler's JVM group leaves it out too.
        assert driver_jvm([root.pid, jvm.pid, child]) == [jvm.pid]
    finally:
        for pid in descendants(jvm.pid):  # only what this test started
            os.kill(pid, signal.SIGKILL)
        jvm.kill()
        jvm.wait()
        root.kill()
        root.wait()


def test_folder_files_counts_files_and_bytes(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one").write_bytes(b"12345")
    (tmp_path / "two").write_bytes(b"123")
    assert folder_files(tmp_path) == (2, 8)
    assert folder_files(tmp_path / "missing") == (0, 0)


def test_folder_files_leaves_out_a_folder_removed_while_it_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stream removes a settled deferral's folder between the listing of its parent and its
    # own: the count goes on without it (an hour-long run once died of this).
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "one").write_bytes(b"12345")
    (tmp_path / "gone").mkdir()
    (tmp_path / "gone" / "two").write_bytes(b"123")
    listed = os.scandir

    def removed_before_listed(path: str | os.PathLike[str]) -> Any:
        if Path(path).name == "gone":
            raise FileNotFoundError(path)
        return listed(path)

    monkeypatch.setattr(os, "scandir", removed_before_listed)
    assert folder_files(tmp_path) == (1, 5)


def test_memory_after_a_collection_is_read_once_the_jvm_stops_giving_pages_back() -> None:
    readings = iter([851.0, 597.0, 483.4, 483.0, 300.0])
    assert settled(lambda: next(readings), poll_s=0.0) == 483.0


def test_a_reading_that_never_settles_is_taken_at_the_limit() -> None:
    values = iter(range(0, 10_000, 10))
    last = settled(lambda: float(next(values)), poll_s=0.01, limit_s=0.05)
    assert 10.0 <= last < 1_000.0


# A parent with two Python workers of one kind, as Spark's daemon forks them.
# "started" once both workers say they are up: a worker still starting its interpreter grows
# by megabytes between two reads of its memory.
TWO_WORKERS = """
import subprocess, sys, time
sleeper = [
    sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)", "worker"
]
workers = [subprocess.Popen(sleeper, stdout=subprocess.PIPE) for _ in range(2)]
for worker in workers:
    worker.stdout.readline()
print("started", flush=True)
time.sleep(30)
"""


def test_each_worker_s_memory_is_listed_and_the_kind_s_total_is_their_sum() -> None:
    parent = subprocess.Popen([sys.executable, "-c", TWO_WORKERS], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline() == b"started\n"
        by_process = pss_mib_by_process(parent.pid)
        assert set(by_process) == {"driver", "worker"}
        assert len(by_process["worker"]) == 2
        assert by_process["worker"] == sorted(by_process["worker"], reverse=True)
        assert all(mib > 0 for mib in by_process["worker"])
        total = pss_mib_by_kind(parent.pid)["worker"]
        assert abs(total - sum(by_process["worker"])) < 5  # read again, a moment later
    finally:
        for child in descendants(parent.pid):  # only what this test started
            os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.wait()
