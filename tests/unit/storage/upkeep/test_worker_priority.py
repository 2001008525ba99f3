"""A compaction task runs at the lowest CPU priority (`at_lowest_priority`), on a thread that ends
with it: the batches beside it keep the CPU, and the worker Spark reuses for them keeps its own
priority."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
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


# Two busy threads pinned to one CPU for a second: a batch's, at normal priority, and a
# compaction task's; the script prints the CPU seconds each got.
_CONTENTION = textwrap.dedent(
    """
    import json, os, threading, time
    from storage.upkeep.worker_priority import at_lowest_priority

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # threads started after share it
    deadline = time.monotonic() + 1.0
    cpu = {}

    def spin(name):
        started = time.thread_time()
        while time.monotonic() < deadline:
            sum(range(1000))
        cpu[name] = time.thread_time() - started

    def compaction_task(batches):
        spin("compaction")
        yield from batches

    batch = threading.Thread(target=spin, args=("batch",))
    batch.start()
    list(at_lowest_priority(compaction_task)(iter([])))
    batch.join()
    print(json.dumps(cpu))
    """
)


def test_a_batch_beside_a_compaction_task_keeps_most_of_the_cpu() -> None:
    cpu = json.loads(
        subprocess.run(
            [sys.executable, "-c", _CONTENTION], capture_output=True, text=True, check=True
        ).stdout
    )
    # The kernel's weights for nice 0 and 19 are 1024 and 15; a busy host shifts both alike.
    assert cpu["batch"] > 5 * cpu["compaction"], cpu
