"""Peak resident memory of groups of this run's processes (this driver, its JVM, its Python
workers), sampled while a benchmark's stage runs."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from infra.dev.local_process import descendants, rss_mib

_SAMPLE_EVERY_S = 0.2


@contextmanager
def peak_rss(groups: Mapping[str, Callable[[], list[int]]]) -> Iterator[dict[str, float]]:
    """Per group, the peak of its processes' summed RSS in MiB, sampled every 0.2 s until the
    block ends. A group's processes are asked for at every sample: workers come and go."""
    peaks = dict.fromkeys(groups, 0.0)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(_SAMPLE_EVERY_S):  # ends with the block
            for name, processes in groups.items():
                peaks[name] = max(peaks[name], sum(map(rss_mib, processes())))

    sampler = threading.Thread(target=sample, name="rss-sampler", daemon=True)
    sampler.start()
    try:
        yield peaks
    finally:
        stop.set()
        sampler.join()


def this_process() -> list[int]:
    return [os.getpid()]


def driver_jvm() -> list[int]:
    """The JVM this process started (in local mode the driver's, with the executors in it)."""
    return [pid for pid in descendants(os.getpid()) if _program(pid).endswith(b"java")]


def driver_and_jvm() -> list[int]:
    return [*this_process(), *driver_jvm()]


def python_workers() -> list[int]:
    """This run's Python workers: the descendants of this process (through the JVM)."""
    return [pid for pid in descendants(os.getpid()) if _is_python_worker(pid)]


def _program(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return b""


def _is_python_worker(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"pyspark.daemon" in command or b"pyspark.worker" in command
