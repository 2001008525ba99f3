"""How a Spark Python worker, alive as long as the stream, gives memory back to the system.

Spark reuses a worker for every task it runs, so a worker's memory is the most any task left
behind. glibc raises its mmap threshold to the largest buffer freed so far (up to 32 MiB), after
which large buffers come from the heap, and a heap keeps what it once held: a worker that ran a
compaction task (a write task's staged rows for a whole `merge_interval`, 160 MiB of Arrow
buffers at 500 records/s) kept tens of MiB of it, and more after each further one. Under another
C library nothing here changes anything.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pyarrow as pa

# glibc's `mallopt` parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
BATCH_BUFFER_BYTES = 4 << 20
"""Between compactions, a worker's buffers this large are mapped on their own and unmapped as
they are freed; a batch's smaller ones are reused from the heap."""
TASK_BUFFER_BYTES = 64 << 10
"""During a compaction task, buffers this large are mapped on their own: almost all its rows."""
TRIM_THRESHOLD_BYTES = 64 << 20
"""Free memory at the heap's top a worker keeps for the next batch instead of returning it and
asking for it again every batch."""


def _mallopt() -> Callable[[int, int], int] | None:
    # The process's own symbols: glibc's when it is the C library, without a library search.
    return getattr(ctypes.CDLL(None), "mallopt", None)


def return_large_buffers() -> None:
    """Fix the thresholds for the life of the worker (its daemon calls this before forking)."""
    mallopt = _mallopt()
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, BATCH_BUFFER_BYTES)
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)


@contextmanager
def returning_what_it_takes() -> Iterator[None]:
    """A task whose memory is given back when it ends: its large buffers mapped on their own,
    and what Arrow's pool freed returned (`malloc_trim` on glibc, mimalloc's own collection
    otherwise)."""
    mallopt = _mallopt()
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, TASK_BUFFER_BYTES)
    try:
        yield
    finally:
        if mallopt is not None:
            mallopt(_M_MMAP_THRESHOLD, BATCH_BUFFER_BYTES)
        pa.default_memory_pool().release_unused()
