"""How a compaction task beside the stream's batches takes only the CPU they leave.

Spark never pre-empts a task, and the kernel shares a core evenly between the threads that want
it: a compaction task running beside the batches (`streaming.pipeline.compaction_schedule`) took
its full share of a core from the batches' tasks, the driver and, on a small host, the broker.
At 2,000 records/s on two cores a compaction of 600,000 rows ran 8 s, and the batches beside it
took up to 2.1 s against 1.3 s before. Its work is the least urgent on the host: it can wait
for the cores the batches leave, and a compaction that takes longer delays nothing a reader sees,
as staged rows are readable all along.

So a compaction task does its work in a thread of its own at the lowest scheduling priority
(nice 19): under contention the kernel gives it about 1/70 of a normal thread's share, and all
of any core nothing else wants. Linux alone sets a priority per thread (`setpriority` with a
thread id); elsewhere the task runs as it is.

A priority cannot be raised again without privileges, so it is never lowered on the worker's
own thread, which Spark reuses for every batch after the task: the thread ends with the task.
Threads it starts inherit its priority; a compaction task reads and writes on its own thread
(`use_threads=False`), so Arrow's CPU pool is not started from it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator

import pyarrow as pa

from storage.lake.file_writer import MapInArrow

log = logging.getLogger(__name__)

LOWEST_PRIORITY = 19
"""The highest nice value: the least CPU under contention."""


def at_lowest_priority(task: MapInArrow) -> MapInArrow:
    """`task`, run in a thread of its own at the lowest CPU priority; its output batches are
    handed on once it has finished, so it must yield few (a compaction task yields one row per
    manifest), and what it raises is raised here."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
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
