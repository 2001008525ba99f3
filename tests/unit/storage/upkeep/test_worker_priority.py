"""A compaction task runs at the lowest CPU priority (`at_lowest_priority`), on a thread that ends
with it: the worker Spark reuses for the batches keeps its own priority. What the priority buys
the batches is the continuous benchmark's to show (a timed share of a CPU between two threads
failed at 3.6x against 5x under CI's load: the GIL, held by a thread the kernel parks)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest

from storage.upkeep.worker_priority import LOWEST_PRIORITY, at_lowest_priority

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="a priority per thread is Linux's"
)


def _priority_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_the_task_runs_at_the_lowest_priority_and_the_worker_s_thread_keeps_its_own() -> None:
    seen: dict[str, int] = {}

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        seen["priority"] = _priority_of_this_thread()
        rows = sum(batch.num_rows for batch in batches)
        yield pa.record_batch({"rows": [rows]})

    before = _priority_of_this_thread()
    inputs = iter([pa.record_batch({"id": [1, 2]}), pa.record_batch({"id": [3]})])

    output = list(at_lowest_priority(task)(inputs))

    assert seen["priority"] == LOWEST_PRIORITY
    assert [batch.to_pydict() for batch in output] == [{"rows": [3]}]
    assert _priority_of_this_thread() == before


def test_what_the_task_raises_is_raised_on_the_worker_s_thread() -> None:
    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        raise FileNotFoundError("staged file gone")
        yield from batches

    with pytest.raises(FileNotFoundError, match="staged file gone"):
        list(at_lowest_priority(task)(iter([])))
