"""A benchmark's view of a running stream's processes: what each kind of them costs.

`tenant-windows run` is a tree of processes: the driver's Python, its JVM, and Python workers
Spark starts per kind of work (the executors' daemon and the workers it forks, the driver-side
Data Source planners, the streaming source's runner). A kind is named from the command line,
so a start's CPU seconds and a minute's memory can be split by it.

Only reads /proc and asks the stream's own JVM (`jcmd`, by PID) for its heap.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from infra.dev.local_process import (
    cpu_seconds,
    descendants,
    parent_pid,
    pss_mib,
    thread_cpu_seconds,
)

JCMD_TIMEOUT_S = 30
# `jcmd` is a JVM of its own, 0.3 CPU s a call on this machine: at the lowest priority and with
# the quick JIT (0.2 s) it takes what the stream leaves, so that sampling a stream each minute
# does not slow the batch it falls beside.
_JCMD = ("nice", "-n", "19", "jcmd", "-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC")
UNCOMMIT_POLL_S = 0.1
UNCOMMIT_LIMIT_S = 5.0
_HEAP_USED = re.compile(r"garbage-first heap\s+total (\d+)K, used (\d+)K")


SPAWNING = "spawning"
"""A JVM's child between its start and its `exec`: Java starts a command (Hadoop's `chmod` and
`readlink` on a local checkpoint, several a second) in a child that shares the JVM's memory
until it runs the command, so its PSS is the JVM's whole, counted a second time. One minute's
look in an hour-long run caught one and saw the JVM's memory doubled."""


def _same_command_as_parent(pid: int, arguments: list[bytes]) -> bool:
    try:
        return Path(f"/proc/{parent_pid(pid)}/cmdline").read_bytes().split(b"\0") == arguments
    except OSError:
        return False


def kind_of(pid: int, root: int) -> str:
    """`driver`, `jvm`, the Python module a Spark worker runs (e.g. `worker`,
    `plan_data_source_read`), or another program's name (the launcher's `bash`, the shell
    commands Hadoop runs); `gone` if the process has exited."""
    if pid == root:
        return "driver"
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    words = [word.decode(errors="replace") for word in arguments if word]
    program = Path(words[0]).name if words else "gone"
    if program == "java":
        return SPAWNING if _same_command_as_parent(pid, arguments) else "jvm"
    if not program.startswith("python"):
        return program
    # `python -m pyspark.daemon pyspark.sql.worker.X`, `python -m streaming...worker_daemon
    # pyspark.worker`: the module the worker runs is the last word.
    modules = [word for word in words[1:] if not word.startswith("-")]
    return modules[-1].rsplit(".", 1)[-1] if modules else "python"


@dataclass
class TreeSample:
    """One look at the tree: each live process's kind and CPU seconds so far."""

    kinds: dict[int, str] = field(default_factory=dict)
    cpu_s: dict[int, float] = field(default_factory=dict)


class ProcessTree:
    """The processes under `root`, followed while a start runs: when each kind first showed
    up, and the CPU seconds each kind used (a process that exits between looks loses only
    its last interval)."""

    def __init__(self, root: int, count_from_now: bool = False) -> None:
        """`count_from_now`: leave out the CPU seconds the tree has used so far."""
        self.root = root
        self.first_seen_s: dict[str, float] = {}
        self._kinds: dict[int, str] = {}
        self._cpu_s: dict[int, float] = {}
        self._before_s: dict[int, float] = {}
        if count_from_now:
            self.look(0.0)
            self._before_s = dict(self._cpu_s)
            self.first_seen_s.clear()

    def look(self, since_start_s: float) -> None:
        for pid in [self.root, *descendants(self.root)]:
            # Looked up each time: the launcher's shell becomes the JVM by exec, same PID.
            kind = kind_of(pid, self.root)
            if kind == "gone":
                continue
            self._kinds[pid] = kind
            self.first_seen_s.setdefault(kind, round(since_start_s, 2))
            try:
                self._cpu_s[pid] = cpu_seconds(pid)
            except OSError:
                continue

    def cpu_s_by_kind(self) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for pid, seconds in self._cpu_s.items():
            totals[self._kinds[pid]] += seconds - self._before_s.get(pid, 0.0)
        return {kind: round(seconds, 2) for kind, seconds in sorted(totals.items())}


def jvm_cpu_s_by_thread_kind(pid: int) -> dict[str, float]:
    """A JVM's CPU seconds so far by what its threads do: the JIT compilers (`jit C1`, `jit C2`),
    the garbage collector (`gc`), and everything else (`work`: Spark's own threads, tasks
    included). A start's JVM CPU is mostly one of these, and each has its own remedy."""
    totals: dict[str, float] = defaultdict(float)
    for name, seconds in thread_cpu_seconds(pid):
        totals[_thread_kind(name)] += seconds
    return {kind: round(seconds, 2) for kind, seconds in sorted(totals.items())}


def _thread_kind(name: str) -> str:
    if name.startswith("C2 Compiler"):
        return "jit C2"
    if name.startswith("C1 Compiler"):
        return "jit C1"
    if name.startswith(("GC Thread", "G1 ", "VM Thread")):
        return "gc"
    return "work"


def pss_mib_by_kind(root: int) -> dict[str, float]:
    """The tree's memory (PSS) by kind of process, MiB."""
    return summed_by_kind(pss_mib_by_process(root))


def summed_by_kind(by_process: dict[str, list[float]]) -> dict[str, float]:
    """`pss_mib_by_process`'s lists as each kind's total."""
    return {kind: round(sum(each), 1) for kind, each in by_process.items()}


def pss_mib_by_process(root: int) -> dict[str, list[float]]:
    """Each process's memory (PSS) by kind, MiB, largest first: how many workers a kind has,
    and which of them grows; a JVM's child before its `exec` is the JVM's own memory
    (`SPAWNING`), so it is left out."""
    each: dict[str, list[float]] = defaultdict(list)
    for pid in [root, *descendants(root)]:
        kind = kind_of(pid, root)
        if kind not in ("gone", SPAWNING):
            each[kind].append(round(pss_mib(pid), 1))
    return {kind: sorted(values, reverse=True) for kind, values in sorted(each.items())}


def jvm_pid(root: int) -> int | None:
    return next((pid for pid in descendants(root) if kind_of(pid, root) == "jvm"), None)


def jvm_heap_after_gc_mib(pid: int) -> tuple[float, float] | None:
    """(used, committed) MiB of the JVM's heap after a full collection it was asked for
    (`jcmd GC.run`), once the heap it shrank is given back; None if the JVM did not answer.

    Java 17's G1 returns the pages a shrinking collection freed in a background thread, after
    `GC.run` has returned: a JVM whose heap had grown to 560 MiB still held them for 0.1-0.3 s,
    and an hour's run sampled two minutes in that window and read them as 160 MiB more memory.
    """
    try:
        subprocess.run(
            [*_JCMD, str(pid), "GC.run"], capture_output=True, timeout=JCMD_TIMEOUT_S, check=True
        )
        settled(lambda: pss_mib(pid))
        info = subprocess.run(
            [*_JCMD, str(pid), "GC.heap_info"],
            capture_output=True,
            text=True,
            timeout=JCMD_TIMEOUT_S,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    found = _HEAP_USED.search(info)
    if found is None:
        return None
    committed_kib, used_kib = (int(value) for value in found.groups())
    return round(used_kib / 1024, 1), round(committed_kib / 1024, 1)


def settled(
    read: Callable[[], float],
    tolerance: float = 1.0,
    poll_s: float = UNCOMMIT_POLL_S,
    limit_s: float = UNCOMMIT_LIMIT_S,
) -> float:
    """`read()` once two readings `poll_s` apart differ by at most `tolerance`, or the last
    reading after `limit_s`."""
    deadline = time.monotonic() + limit_s
    previous = read()
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        current = read()
        if abs(current - previous) <= tolerance:
            return current
        previous = current
    return previous


def folder_files(path: Path) -> tuple[int, int]:
    """(files, bytes) under `path`; (0, 0) if it does not exist. The stream removes files and
    folders while they are counted (a cleanup, a settled deferral, a vacuum): those are left
    out, not an error (`os.walk` skips a folder it cannot list)."""
    count = size = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                size += os.stat(os.path.join(folder, name)).st_size
            except OSError:
                continue
            count += 1
    return count, size
