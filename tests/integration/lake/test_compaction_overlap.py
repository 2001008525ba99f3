"""A compaction's tables commit one after the other, but the executors write the next table's
files while the driver commits this one's (`storage.upkeep.compaction`): at many tenants a
table's commits take seconds, and the cores would wait for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from infra.dev.benchmarks.settle_keys import STREAM, stage_keys
from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import EVENTS, STAGED, WINDOWS
from storage.lake.writer_lease import WriterLease
from storage.upkeep.compaction import MANIFESTS_FOLDER, Compaction
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


KEYS = 300
TASKS = 4


def test_the_next_tables_files_are_written_while_this_tables_commit_waits(
    spark: Any, tmp_path: Path
) -> None:
    lake = DeltaLake(str(tmp_path / "lake"))
    lake.ensure_tables()
    epoch = WriterLease(lake, STREAM, ttl_ms=3_600_000).acquire()
    records = stage_keys(lake, epoch, KEYS, records_per_key=2, batches=2, tasks=TASKS)
    windows_manifests = tmp_path / "lake" / MANIFESTS_FOLDER / STREAM / f"epoch-{epoch}" / "windows"
    commits: list[str] = []

    def before_commit() -> None:
        if not commits:
            # Held in `events`' commit: `windows`' tasks must list their files meanwhile.
            wait_until(
                lambda: any(windows_manifests.rglob("task-*.parquet")),
                timeout_s=120,
                what="windows' files written while events' commit waits",
            )
        commits.append("commit")

    # In slices, with a log checkpoint at the end: the sliced path's commits and checkpoint go
    # through the table it keeps up to date.
    compaction = Compaction(
        lake, STREAM, epoch, tasks=TASKS, slice_files=100, log_checkpoint_files=1
    )
    done = compaction.run(spark, version=1, before_commit=before_commit)

    assert [(table.table, table.settled_files, table.slices > 1) for table in done] == [
        (EVENTS.name, KEYS, True),
        (WINDOWS.name, KEYS, True),
    ]
    for spec, row_id in ((EVENTS, "offset"), (WINDOWS, "window_id")):
        rows = lake.open(spec).to_pyarrow_table(columns=[row_id, spec.partition_by[0]])
        assert rows.num_rows == records
        assert pc.count_distinct(rows[row_id]).as_py() == records
        assert STAGED not in rows[spec.partition_by[0]].to_pylist()
        version = lake.open(spec).version()
        assert (
            tmp_path / "lake" / spec.name / "_delta_log" / f"{version:020d}.checkpoint.parquet"
        ).exists()
    assert not any(windows_manifests.rglob("*.parquet"))
