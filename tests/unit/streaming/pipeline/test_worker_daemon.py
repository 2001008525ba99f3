"""A Python worker forked from the stream's daemon shares the daemon's modules: the worker's
tasks import none of their own, and its garbage collections leave the daemon's pages shared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# The daemon's preparation, then a fork: the child collects all its garbage, as a long-lived
# worker eventually does, and the parent reads how much of its memory became the child's own.
_FORK_THEN_COLLECT = """
import gc
import json
import os
import sys

from streaming.pipeline.worker_daemon import prepare_to_fork

def private_dirty_mib(pid):
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) / 1024

prepare_to_fork()
if sys.argv[1] == "unfrozen":
    gc.unfreeze()  # the same daemon, its objects tracked again
child_reads, parent_writes = os.pipe()
parent_reads, child_writes = os.pipe()
child = os.fork()
if child == 0:
    os.read(child_reads, 1)
    gc.collect()
    os.write(child_writes, b"x")
    os.read(child_reads, 1)
    os._exit(0)
before = private_dirty_mib(child)
os.write(parent_writes, b"x")
os.read(parent_reads, 1)
after = private_dirty_mib(child)
os.write(parent_writes, b"x")
os.waitpid(child, 0)
print(json.dumps({"grown_mib": after - before}))
"""


# The daemon's preparation, then a worker's tasks: a batch's write task, a compaction's task over
# its files (listed in a manifest, as the stream runs it), pandas frames in and out of Arrow, as
# Spark's state function's serializer does, and a key's state saved, as the state function does.
# Prints the modules they imported.
_RUN_TASKS = """
import json
import sys
import tempfile
from dataclasses import replace

from streaming.pipeline.worker_daemon import prepare_to_fork

prepare_to_fork()
before = set(sys.modules)

import pyarrow as pa
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from storage.lake.file_names import BatchFiles, SettledFiles
from storage.lake.file_writer import write_task_files
from storage.lake.packed_rows import packed_table
from storage.lake.tables import WINDOWS
from storage.upkeep.compaction_manifests import Manifests
from storage.upkeep.compaction_tasks import compact_write_tasks, write_settled_files
from streaming.state.state_layouts import LAYOUTS, TEXT_LAYOUT
from streaming.state.union_rows import union_table

root = tempfile.mkdtemp()
count = 40
starts = [1_700_000_000_000 + 60_000 * (index % 4) for index in range(count)]
union = union_table(
    {
        "kind": [WINDOWS.name] * count,
        "tenant": [f"t{index % 5}" for index in range(count)],
        "source": ["web"] * count,
        "window_id": [f"w{index}" for index in range(count)],
        "window_start_ms": starts,
        "window_end_ms": [start + 60_000 for start in starts],
        "pane_index": [0] * count,
        "timing": ["ON_TIME"] * count,
        "is_final": [True] * count,
        "count": [1] * count,
        "metrics": [[] for _ in range(count)],
        "merged_window_ids": [[] for _ in range(count)],
        "watermark_ms": starts,
    },
    count,
)
batch = BatchFiles(root, None, "s", 1, 3, (WINDOWS.name,))
written = write_task_files(batch, lambda: 0)(iter(packed_table(union).to_batches()))
paths = [row["path"] for written_batch in written for row in written_batch.to_pylist()]
settled = SettledFiles(root, None, "s", 1, "0123456789abcdef", WINDOWS.name)
tasks = compact_write_tasks(
    root,
    None,
    WINDOWS.name,
    {0: paths},
    1,
    lambda task: write_settled_files(replace(settled, write_task=task)),
)
listing = Manifests(root, None, "_manifests/settled").listing(tasks, task_partition=lambda: 0)
assert list(listing(iter([pa.record_batch({"id": [0]})])))
frame = pa.table({"tenant": ["t0", "t1"], "count": [1, 2]}).to_pandas()
pa.Table.from_pandas(frame, preserve_index=False)
state = GroupState(
    None, 0, 0, GroupStateTimeout.ProcessingTimeTimeout, False, False, False, False, False, -1,
    b"", LAYOUTS[TEXT_LAYOUT].schema,
)
state.update(LAYOUTS[TEXT_LAYOUT].stored(b"state"))
print(json.dumps(sorted(set(sys.modules) - before)))
"""

_OURS = ("numpy", "pandas", "pyarrow", "pyspark", "storage", "streaming", "tenants", "unittest")


def _printed(script: str, *arguments: str) -> object:
    """What `script`, run in a Python of its own from the project's root, printed last (JSON)."""
    completed = subprocess.run(
        [sys.executable, "-c", script, *arguments],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[4],
        timeout=120,
    )
    return json.loads(completed.stdout.splitlines()[-1])


def test_a_workers_tasks_import_nothing_the_daemon_did_not() -> None:
    imported = _printed(_RUN_TASKS)
    assert isinstance(imported, list)

    # Imported by a worker, a module is that worker's alone: 7 MiB of pyarrow's dataset
    # modules, in each worker that ever ran a compaction's task.
    assert [name for name in imported if name.split(".")[0] in _OURS] == []


def _grown_mib(preparation: str) -> float:
    printed = _printed(_FORK_THEN_COLLECT, preparation)
    assert isinstance(printed, dict)
    return float(printed["grown_mib"])


def test_a_workers_full_collection_keeps_the_daemons_modules_shared() -> None:
    unfrozen = _grown_mib("unfrozen")
    prepared = _grown_mib("prepared")

    # Without the freeze the collection writes to every module object's header (29 MiB here).
    assert unfrozen > 8
    assert prepared < 2
