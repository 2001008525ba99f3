"""Spark's Python worker daemon, with what every micro-batch's workers import already imported.

Spark starts one daemon per kind of Python work and forks a worker from it per task slot; each
fresh worker then imports pandas, pyarrow and this project on its first task. After a restart
that import, paid by every worker at once on a busy machine, was most of the first batch's
time. Imported here, before the daemon forks, a worker starts with them in memory.

Those modules' objects are then frozen out of the garbage collector. A worker shares their
pages with the daemon until it writes to one, and a full collection writes to every object it
tracks: without the freeze, a worker's first full collection, which can come at any minute of a
long run, made 29 MiB of the daemon's pages its own (with these modules), in every worker.
"""

from __future__ import annotations

import gc
import importlib
import logging
import threading
from collections.abc import Iterator

import pyarrow as pa
from pyspark import daemon
from pyspark.sql import SparkSession

from storage.upkeep.worker_memory import return_large_buffers

PRELOADED = (
    "confluent_kafka",
    "pandas",
    # What pyarrow imports on first use: frames in and out of pandas (every batch), datasets
    # and Acero (a compaction's group-bys). Imported by a worker, each was that worker's alone.
    "pyarrow.acero",
    "pyarrow.dataset",
    "pyarrow.pandas_compat",
    # `GroupState.update` imports it, and `unittest`, in the call that saves a worker's first
    # state: in every fresh worker at once, in the first batch's stateful stage.
    "pyspark.testing.utils",
    "pyspark.worker",
    "storage.lake.file_writer",
    "storage.upkeep.compaction_manifests",
    "storage.upkeep.compaction_tasks",
    # The source imports its reader where it reads (`streaming.kafka.source` says why).
    "streaming.kafka.reader",
    "streaming.kafka.source",
    "streaming.records.routing",
    "streaming.state.bucket_processor",
)
"""What a worker of the stream's query imports: the Kafka reader, the router, the state function,
the file writer and the compaction's tasks, and their pandas and pyarrow."""

log = logging.getLogger(__name__)


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


def prepare_to_fork() -> None:
    """What the daemon does before it forks its first worker."""
    return_large_buffers()
    for module in PRELOADED:
        importlib.import_module(module)
    gc.freeze()


if __name__ == "__main__":
    prepare_to_fork()
    daemon.manager()
