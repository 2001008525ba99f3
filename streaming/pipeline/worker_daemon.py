"""Spark's Python worker daemon, with what every micro-batch's workers import already imported.

Spark starts one daemon per kind of Python work and forks a worker from it per task slot; each
fresh worker then imports pandas, pyarrow and this project on its first task. After a restart
that import, paid by every worker at once on a busy machine, was most of the first batch's
time. Imported here, before the daemon forks, a worker starts with them in memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import logging
import threading
from collections.abc import Iterator

import pyarrow as pa
from pyspark import daemon
from pyspark.sql import SparkSession

PRELOADED = (
    "confluent_kafka",
    "pandas",
    "pyspark.worker",
    "storage.lake.file_writer",
    "storage.upkeep.compaction_tasks",
    # The source imports its reader where it reads (`streaming.kafka.source` says why).
    "streaming.kafka.reader",
    "streaming.kafka.source",
    "streaming.records.routing",
    "streaming.state.bucket_processor",
)
"""What a worker of the stream's query imports: the Kafka reader, the router, the state function
and the file writer, and their pandas and pyarrow."""

log = logging.getLogger(__name__)

# glibc's `mallopt` parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
LARGE_BUFFER_BYTES = 4 << 20
"""A worker's buffers this large are mapped on their own and unmapped as they are freed."""
TRIM_THRESHOLD_BYTES = 64 << 20
"""Free memory at the heap's top a worker keeps for the next batch instead of returning it."""


def start_workers(spark: SparkSession) -> None:
    """Start this session's daemon and a worker with a one-row job, for an instance that has
    the time before its first batch (a standby)."""
    spark.range(1).mapInArrow(_same, "id long").collect()


def start_workers_beside(spark: SparkSession) -> None:
    """`start_workers` in a thread of its own, while the caller starts its query: the daemon's
    start then overlaps the query's, whose planning runs in the JVM and in processes of its
    own, and the first batch finds it running. A failure costs only that head start."""

    def start() -> None:
        try:
            start_workers(spark)
        except Exception as error:  # the first batch starts them, as without this
            log.debug("the Python workers were not started ahead of the first batch: %s", error)

    threading.Thread(target=start, name="python-workers", daemon=True).start()


def _same(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def return_large_buffers() -> None:
    """Make glibc give a worker's large buffers back to the system as they are freed.

    Workers live as long as the stream. glibc raises its mmap threshold to the largest buffer
    freed so far (up to 32 MiB), after which such buffers come from the heap, and a heap keeps
    what its largest task (a compaction's) left there: each worker grew by a compaction's peak,
    again and again, for hours. A fixed threshold keeps large buffers out of the heap; the trim
    threshold keeps the batches' smaller ones from being returned and asked for again every
    batch. Nothing to do under another C library."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt"):
        return
    libc.mallopt(_M_MMAP_THRESHOLD, LARGE_BUFFER_BYTES)
    libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)


if __name__ == "__main__":
    return_large_buffers()
    for module in PRELOADED:
        importlib.import_module(module)
    daemon.manager()
