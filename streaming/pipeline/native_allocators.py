"""How the stream's long-lived processes allocate native memory: Arrow from the system's
allocator, and glibc's allocator with two arenas.

The processes live for days, so what an allocator keeps after a peak is kept for good:

- **Arrow's pool.** The largest allocations are the Python workers': a compaction task holds
  thousands of staged files' rows. Arrow's own pool (mimalloc) kept what a task freed for reuse,
  so each worker kept its largest task's peak; on glibc's allocator a worker returns it
  (`storage.upkeep.worker_memory`). Same speed: 20,776-22,358 records/s steady with mimalloc,
  21,636-23,566 with the system's (`scale --tenants 10 --stages product`, paired runs). Arrow's
  C++ code picks its pool once, at a process's first allocation, from
  `ARROW_DEFAULT_MEMORY_POOL`; `pyarrow.set_memory_pool` later changes only what pyarrow's
  Python functions default to, not the pool Parquet, IPC, datasets and group-bys allocate from.
- **glibc's arenas.** glibc gives a new thread that allocates an arena of its own, up to eight
  per core, and an arena keeps its high-water mark. A compaction starts dozens of short-lived
  threads in the driver (40-50 of delta-rs's) and in the JVM, and their memory climbed in
  steps at every merge. With two arenas, a merge a minute at 2,000 records/s, minute
  1 to 7: the driver +15 MiB and the JVM +17 (+36 and +74 with glibc's default), one run each.

With both, and the driver giving back what each checkpoint of a table's log freed
(`DeltaLake.checkpoint_log`), an hour at 500 records/s held 1.47-1.54 GB from minute 10 on
(`continuous --tenants 12 --rate 500 --seconds 3600`, docs/sizing.md).

Both are read as a process starts, so `use_long_lived_allocators` runs where the command line
starts, before anything allocates (importing `streaming.app` does); every process started from
there (the JVM, its Python workers) inherits the variables, and a cluster's executors are
given them (`spark_session`).

Standard library only: the command line imports it before pyarrow.
"""

from __future__ import annotations

import ctypes
import os

MALLOC_ARENAS = 2
ALLOCATOR_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": str(MALLOC_ARENAS)}
"""Each set unless the operator set it."""

_M_ARENA_MAX = -8  # glibc's malloc.h


def use_long_lived_allocators() -> None:
    """Make this process, and every process it starts, allocate as a long-lived process should.
    Call before pyarrow first allocates, and before the process starts threads."""
    for name, value in ALLOCATOR_ENV.items():
        os.environ.setdefault(name, value)
    _cap_this_process_arenas(int(os.environ["MALLOC_ARENA_MAX"]))


def _cap_this_process_arenas(arenas: int) -> None:
    """glibc read `MALLOC_ARENA_MAX` when this process started, before the line above set it;
    `mallopt` sets the same limit for the arenas still to come. Elsewhere (musl, macOS) there
    is no such limit to set."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt(_M_ARENA_MAX, arenas)
