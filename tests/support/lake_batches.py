"""A micro-batch's commit, as the driver makes it, without Spark: one quarantine row written by the
executors' code, then committed by `DeltaLake.commit_files`."""

from __future__ import annotations

from collections.abc import Callable

from storage.lake.delta_lake import DeltaLake
from storage.lake.file_names import BatchFiles
from storage.lake.file_writer import write_task_files
from storage.lake.log_head import LogHeads
from storage.lake.packed_rows import packed_table
from storage.lake.tables import QUARANTINE
from storage.lake.written_files import WrittenFile
from streaming.state.union_rows import union_table


def commit_quarantine_row(
    lake: DeltaLake,
    stream: str,
    batch_id: int,
    writer_epoch: int,
    before_commit: Callable[[], None] = lambda: None,
    heads: LogHeads | None = None,
) -> bool:
    """Write one quarantine row as an executor would, then commit it as the driver does;
    whether it committed."""
    union_row = union_table(
        {
            "kind": ["quarantine"],
            "reason": ["malformed_json"],
            "partition": [0],
            "offset": [batch_id],
            "kafka_timestamp_ms": [1_767_225_600_000],
            "value": [b"{"],
        },
        1,
    )
    target = BatchFiles(lake.root, None, stream, writer_epoch, batch_id, (QUARANTINE.name,))
    written = write_task_files(target, lambda: 0)(iter(packed_table(union_row).to_batches()))
    files = [WrittenFile.from_row(row) for batch in written for row in batch.to_pylist()]
    return lake.commit_files(
        QUARANTINE, files, stream, batch_id, writer_epoch, before_commit, heads
    )
