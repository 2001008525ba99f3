"""Peak resident memory of groups of this run's processes (this driver, its JVM, its Python
workers), sampled while a benchmark's stage runs."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from infra.dev.benchmarks.stream_processes import kind_of
from infra.dev.local_process import descendants, rss_mib

_SAMPLE_EVERY_S = 0.2

ProcessGroup = Callable[[list[int]], list[int]]
"""A group's PIDs among this run's processes (this one, then its descendants)."""


@contextmanager
def peak_rss(groups: Mapping[str, ProcessGroup]) -> Iterator[dict[str, float]]:
    """Per group, the peak of its processes' summed RSS in MiB, sampled every 0.2 s until the
    block ends. The groups are found again at every sample (workers come and go), from one
    walk of /proc: a walk per group took a tenth of a core from the run it measured."""
    peaks = dict.fromkeys(groups, 0.0)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(_SAMPLE_EVERY_S):  # ends with the block
            run = [os.getpid(), *descendants(os.getpid())]
            for name, members in groups.items():
                peaks[name] = max(peaks[name], sum(map(rss_mib, members(run))))

    sampler = threading.Thread(target=sample, name="rss-sampler", daemon=True)
    sampler.start()
    try:
        yield peaks
    finally:
        stop.set()
        sampler.join()


def this_process(run: list[int]) -> list[int]:
    return run[:1]


def driver_jvm(run: list[int]) -> list[int]:
    """The JVM this process started (in local mode the driver's, with the executors in it); not
    a child it forked to run a command, which until its `exec` is the JVM again
    (`stream_processes.SPAWNING`)."""
    return [pid for pid in run[1:] if kind_of(pid, run[0]) == "jvm"]


def driver_and_jvm(run: list[int]) -> list[int]:
    return [*this_process(run), *driver_jvm(run)]


def python_workers(run: list[int]) -> list[int]:
    """This run's Python workers: descendants of this process (through the JVM)."""
    return [pid for pid in run[1:] if _is_python_worker(pid)]


def _is_python_worker(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"pyspark.daemon" in command or b"pyspark.worker" in command
