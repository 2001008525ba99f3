"""Python workers warmed while the query starts, so a start's first batch does not wait for them.

Spark forks a Python worker for each Python stage a task runs (the Kafka reader, routing, the
state function, the writer) and keeps it for the next task. A fresh worker first imports pandas,
pyarrow and this project's modules: about a second of CPU each, paid by the first batch after
every start, when two tasks need four workers at once on two cores. The first batch after a
restart took 6-7 s of Spark's `addBatch`, against 0.5 s in steady state.

So the driver runs, beside the query's own start (the Data Source, the plan), a small job whose
tasks each hold two Python stages, importing what the batches will import; the workers go back
to Spark's pool and serve the first batch. It is an optimisation only: a failure is logged and
changes nothing else.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

BATCH_MODULES = (
    "pandas",
    "streaming.kafka.reader",
    "streaming.records.routing",
    "streaming.state.bucket_processor",
    "storage.lake.data_files",
)
"""What a batch's Python stages import (`stream_plan`, `batch_sink`)."""
STAGES_PER_TASK = 2
"""A task of a batch runs two Python stages at once (reader and routing; state and writer)."""


def _import_batch_modules(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for module in BATCH_MODULES:
        importlib.import_module(module)
    yield from batches


def warm_python_workers(spark: SparkSession) -> threading.Thread:
    """Start warming, in a thread of its own, as many workers as the batches' tasks hold at
    once; join the thread to wait for it."""

    def warm() -> None:
        started = time.monotonic()
        tasks = spark.sparkContext.defaultParallelism
        frame = spark.range(tasks, numPartitions=tasks)
        for _ in range(STAGES_PER_TASK):
            frame = frame.mapInArrow(_import_batch_modules, frame.schema)
        try:
            frame.collect()
        except Exception as error:  # a stopped session, a failed worker: only slower
            log.info("warming the Python workers failed: %s", error)
            return
        log.info(
            "%d Python workers warmed in %.1fs", tasks * STAGES_PER_TASK, time.monotonic() - started
        )

    thread = threading.Thread(target=warm, name="warm-python-workers", daemon=True)
    thread.start()
    return thread
