"""CPU seconds that groups of this run's processes (this driver, its JVM, its Python workers)
spend while a benchmark's stage runs.

On a shared machine a stage's wall time moves between runs of the same code for reasons of the
host's; the CPU a stage takes tells what its code costs apart from that, and where: a settle's
files are written by the workers, committed by the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from infra.dev.local_process import cpu_seconds


@contextmanager
def cpu_used(groups: Mapping[str, Callable[[], list[int]]]) -> Iterator[dict[str, float]]:
    """Per group, the CPU seconds (user and system, reaped children included) its processes
    spent from the block's start to its end; filled in when the block ends. A process that
    started meanwhile counts whole; one that ended meanwhile is lost unless its parent, in the
    group, reaped it (a Python worker's daemon does)."""
    at_start = {pid: _cpu_or_none(pid) for group in groups.values() for pid in group()}
    used = dict.fromkeys(groups, 0.0)
    try:
        yield used
    finally:
        for name, group in groups.items():
            for pid in group():
                now = _cpu_or_none(pid)
                if now is not None:
                    used[name] += now - (at_start.get(pid) or 0.0)


def _cpu_or_none(pid: int) -> float | None:
    try:
        return cpu_seconds(pid)
    except OSError:
        return None
