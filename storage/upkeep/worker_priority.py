"""How a compaction task beside the stream's batches takes only the CPU they leave.

Spark never pre-empts a task, and the kernel shares a core evenly between the threads that want
it: a compaction task running beside the batches (`streaming.pipeline.compaction_schedule`) took
its full share of a core from the batches' tasks, the driver and, on a small host, the broker:
at 2,000 records/s on two cores, the batches beside a compaction took 28 % longer than the
others, and 7 % at the lowest priority (the compaction itself up to 40 % longer). Its work is
the least urgent on the host: a compaction that takes longer delays nothing a reader sees, as
staged rows are readable all along.

So a compaction task does its work in a thread of its own at the lowest scheduling priority
(nice 19): under contention the kernel gives it about 1/70 of a normal thread's share, and all
of any core nothing else wants. Linux alone sets a priority per thread (`setpriority` with a
thread id); elsewhere the task runs as it is.

A priority cannot be raised again without privileges, so it is never lowered on the worker's
own thread, which Spark reuses for every batch after the task: the thread ends with the task.
Threads started from it inherit its priority, and some a process keeps: a compaction task reads
and writes on its own threads (`use_threads=False`), so Arrow's CPU pool is not started from
it; on S3 it uploads on them too (`storage.lake.lake_filesystem`), not on Arrow's IO threads;
and the S3 client is started before it (`warm`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator

import pyarrow as pa

from storage.lake.file_writer import MapInArrow

log = logging.getLogger(__name__)

LOWEST_PRIORITY = 19
"""The highest nice value: the least CPU under contention."""


def at_lowest_priority(task: MapInArrow, warm: Callable[[], object] = lambda: None) -> MapInArrow:
    """`task`, run in a thread of its own at the lowest CPU priority; its output batches are
    handed on once it has finished, so it must yield few (a compaction task yields one row per
    manifest), and what it raises is raised here. `warm` runs first, on the worker's thread:
    what it starts that the process keeps (an S3 client's event loop thread, which every later
    request of the worker goes through) keeps the worker's priority."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        warm()
        output: list[pa.RecordBatch] = []
        failure: list[BaseException] = []

        def work() -> None:
            lower_this_thread()
            try:
                output.extend(task(batches))
            except BaseException as error:  # handed to the worker's thread, which raises it
                failure.append(error)

        # Not a daemon: a worker that exits waits for its task, as it would without the thread.
        thread = threading.Thread(target=work, name="compaction-task")
        thread.start()
        thread.join()
        if failure:
            raise failure[0]
        yield from output

    return run


def lower_this_thread() -> None:
    """Give the calling thread the lowest CPU priority, for the rest of its life (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)
    except OSError as error:  # a seccomp profile may refuse it: the task then runs as it is
        log.warning("a compaction task runs at normal priority: %s", error)
