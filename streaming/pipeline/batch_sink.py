"""The `foreachBatch` target: one micro-batch's rows into every Delta table, exactly once.

Executors write the batch's Parquet files (`storage.lake.file_writer`); the driver collects only
one small row per file and commits each table's files in one Delta commit carrying the transaction
id (stream, batch). A table that already holds this stream's commit for the batch id is
skipped, so a retried or replayed batch never duplicates output; a crash between two tables'
commits is completed by the replay. Spark's commit log entry comes after this returns, so a
batch is replayed until all of its tables are committed. Every commit is fenced with this
instance's writer epoch, so an instance that lost the stream to a newer one fails its batch
instead of writing.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable

from pyspark.sql import DataFrame

from storage.lake.delta_lake import DeltaLake
from storage.lake.file_names import BatchFiles
from storage.lake.file_writer import write_task_files
from storage.lake.log_head import LogHeads
from storage.lake.tables import ALL_TABLES, QUARANTINE, TableSpec
from storage.lake.written_files import WRITTEN_FILE_DDL, WrittenFile
from streaming.fault_points import NO_FAULTS, FaultHook, FaultPoint
from streaming.observe.batch_progress import BatchOutcome
from streaming.pipeline.compaction_schedule import CompactionSchedule
from streaming.records.quarantine_log import QuarantineLog, quarantined_by_reason

log = logging.getLogger(__name__)

DriverFiles = Callable[[BatchFiles, list[WrittenFile]], list[WrittenFile]]
"""Rows the driver adds to a batch (e.g. `configured_status`): given the batch's target and the
executors' files, it writes its own files there and returns them, committed with the rest."""


class MicroBatchSink:
    def __init__(
        self,
        lake: DeltaLake,
        app_id: str,
        writer_epoch: int,
        after_batch: Callable[[int], None] | None = None,
        fault_hook: FaultHook = NO_FAULTS,
        driver_files: DriverFiles | None = None,
        report: Callable[[BatchOutcome], None] | None = None,
        compaction: CompactionSchedule | None = None,
        quarantine_log: QuarantineLog | None = None,
    ) -> None:
        self.lake = lake
        self.app_id = app_id
        self.writer_epoch = writer_epoch
        self.after_batch = after_batch
        self.fault_hook = fault_hook
        self.driver_files = driver_files
        self.report = report
        """Told what each batch committed, once all of its tables are done."""
        self.compaction = compaction
        """Settles staged rows after the batch, when due; also after a replayed batch, which
        finishes a compaction a crash cut short."""
        self.quarantine_log = quarantine_log or QuarantineLog(lake)
        self._heads = LogHeads()

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        self.fault_hook.reached(FaultPoint.BATCH_START, batch_id)
        pending = [spec for spec in ALL_TABLES if not self._holds(spec, batch_id)]
        if not pending:
            # The plan must still run: it commits this batch's state store version, and Spark
            # fails the batch if it does not. Only the Delta commits are skipped.
            batch_df.write.format("noop").mode("overwrite").save()
            log.info(
                "stream %r, batch %d already committed to every table; skipped",
                self.app_id,
                batch_id,
            )
            outcome = BatchOutcome(batch_id=batch_id, rows={}, already_committed=True)
        else:
            outcome = self._commit(batch_df, batch_id, pending)
        if self.compaction is not None:
            self.compaction.after_batch(batch_df.sparkSession, batch_id)
        if self.report is not None:
            self.report(outcome)
        if self.after_batch is not None:
            self.after_batch(batch_id)

    def _commit(self, batch_df: DataFrame, batch_id: int, pending: list[TableSpec]) -> BatchOutcome:
        """Write and commit the batch to the `pending` tables; what was committed."""
        started = time.monotonic()
        target = BatchFiles(
            root=self.lake.root,
            storage_options=self.lake.storage_options,
            stream=self.app_id,
            writer_epoch=self.writer_epoch,
            batch_id=batch_id,
            table_names=tuple(spec.name for spec in pending),
        )
        # Only the file list reaches the driver, never the rows.
        written = [
            WrittenFile.from_row(row.asDict())
            for row in batch_df.mapInArrow(write_task_files(target), WRITTEN_FILE_DDL).collect()
        ]
        if self.driver_files is not None:
            written += self.driver_files(target, written)
        rows: dict[str, int] = {}
        value_counts: dict[str, dict[str, int]] = {}
        quarantined: dict[str, int] = {}
        for spec in pending:
            files = [file for file in written if file.table_name == spec.name]
            if files:
                self.lake.commit_files(
                    spec,
                    files,
                    self.app_id,
                    batch_id,
                    self.writer_epoch,
                    before_commit=lambda: self.fault_hook.reached(
                        FaultPoint.BEFORE_DELTA_COMMIT, batch_id
                    ),
                    heads=self._heads,
                )
                self.fault_hook.reached(FaultPoint.BETWEEN_TABLE_COMMITS, batch_id)
            rows[spec.name] = sum(file.num_records for file in files)
            if spec.counted_by is not None:
                value_counts[spec.name] = _summed(file.value_counts for file in files)
            if spec is QUARANTINE:
                quarantined = quarantined_by_reason(files)
        self.fault_hook.reached(FaultPoint.AFTER_DELTA_COMMITS, batch_id)
        log.info(
            "stream %r, batch %d: %d files in %.2fs %s",
            self.app_id,
            batch_id,
            len(written),
            time.monotonic() - started,
            " ".join(f"{name}={count}" for name, count in rows.items()),
        )
        self.quarantine_log.batch_committed(batch_id, written)
        return BatchOutcome(
            batch_id=batch_id, rows=rows, value_counts=value_counts, quarantined=quarantined
        )

    def _holds(self, spec: TableSpec, batch_id: int) -> bool:
        # Batches commit in order, so a table whose newest commit of this stream is at or past
        # `batch_id` already holds it (a batch with no rows for a table commits nothing there).
        committed = self.lake.committed_batch(spec, self.app_id, self._heads)
        return committed is not None and committed >= batch_id


def _summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for count in counts:
        total.update(count)
    return dict(total)
