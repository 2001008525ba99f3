"""Compaction: a stream's staged rows move to their tenant's partitions (contract §5).

A micro-batch writes one staged file per write task and table (`storage.lake.tables` says why).
Compaction reads this stream's staged files, regroups their rows by (tenant, source) across
Spark tasks, writes one settled file per (tenant, source[, window date]) partition, and commits,
per table, one Delta commit that removes exactly the staged files it read and adds the settled
ones (`DeltaLake.settle`). So at every version each row is in exactly one file: the staged one
before the commit, the settled one after.

Crash safety comes from that commit alone. Files written by an attempt that never committed are
referenced by no version (`vacuum` removes them). A restart lists the staged files again: those
a committed compaction took are gone, the others are compacted now. The settled files' names and
bytes are a pure function of the staged files consumed (sorted rows, names from a digest of the
inputs), so a retried compaction rewrites the same files.

Only this stream's own staged files are taken, so streams sharing a lake never contend for them;
staged files no stream's name pattern matches (an outside `OPTIMIZE` merged some) are taken by
whichever stream compacts next.

Runs on the driver, in the stream's `foreachBatch` (between batches); the rows themselves go
from executor to executor, never through the driver.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from storage.lake.data_files import (
    WRITTEN_FILE_DDL,
    SettledFiles,
    WrittenFile,
    read_staged_files,
    write_settled_files,
)
from storage.lake.delta_lake import DeltaLake, LakeFile
from storage.lake.tables import ALL_TABLES, TableSpec

log = logging.getLogger(__name__)

STAGED_TABLES = tuple(spec for spec in ALL_TABLES if spec.staged)
# The staged files a compaction read were taken by another commit in between (an `optimize`,
# or a stream compacting foreign files): it lists them again this many times.
SETTLE_ATTEMPTS = 5


@dataclass(frozen=True)
class TableCompaction:
    table: str
    staged_files: int
    settled_files: int
    records: int
    seconds: float


@dataclass(frozen=True)
class Compaction:
    """Settles one stream's staged rows, fenced with its writer epoch."""

    lake: DeltaLake
    stream: str
    writer_epoch: int
    tasks: int
    """Spark tasks that write settled files: the parallelism, never the file count."""
    log_checkpoint_files: int | None = None
    """A table's compaction that swaps this many files or more checkpoints its log."""

    def run(
        self,
        spark: SparkSession,
        version: int,
        before_commit: Callable[[], None] = lambda: None,
        after_table: Callable[[], None] = lambda: None,
    ) -> list[TableCompaction]:
        """Compact every staged table; `version` (the batch it runs after) is the commits'
        transaction version under `<stream>/compaction`."""
        done = []
        for spec in STAGED_TABLES:
            result = self._compact(spark, spec, version, before_commit)
            if result is not None:
                done.append(result)
                after_table()
        return done

    def _compact(
        self,
        spark: SparkSession,
        spec: TableSpec,
        version: int,
        before_commit: Callable[[], None],
    ) -> TableCompaction | None:
        started = time.monotonic()
        for _ in range(SETTLE_ATTEMPTS):
            staged = self.lake.staged_files(spec, self.stream)
            if not staged:
                return None
            settled = self._write_settled(spark, spec, staged)
            if self.lake.settle(
                spec,
                staged,
                settled,
                self.stream,
                version,
                self.writer_epoch,
                before_commit,
                self.log_checkpoint_files,
            ):
                result = TableCompaction(
                    table=spec.name,
                    staged_files=len(staged),
                    settled_files=len(settled),
                    records=sum(file.num_records for file in settled),
                    seconds=time.monotonic() - started,
                )
                log.info(
                    "compacted %s: %d staged files into %d settled ones (%d rows) in %.2fs",
                    spec.name,
                    result.staged_files,
                    result.settled_files,
                    result.records,
                    result.seconds,
                )
                return result
            log.info("compacting %s: its staged files changed meanwhile; listing again", spec.name)
        raise RuntimeError(
            f"compacting {spec.name}: its staged files kept changing during {SETTLE_ATTEMPTS} "
            "attempts; the next compaction tries again"
        )

    def _write_settled(
        self, spark: SparkSession, spec: TableSpec, staged: list[LakeFile]
    ) -> list[WrittenFile]:
        inputs = "\n".join(file.path for file in staged)
        target = SettledFiles(
            root=self.lake.root,
            storage_options=self.lake.storage_options,
            stream=self.stream,
            writer_epoch=self.writer_epoch,
            inputs_digest=hashlib.sha256(inputs.encode()).hexdigest()[:16],
            table_name=spec.name,
        )
        paths = spark.createDataFrame([(file.path,) for file in staged], "path string")
        rows = paths.repartition(min(len(staged), self.tasks)).mapInArrow(
            read_staged_files(self.lake.root, self.lake.storage_options, spec.name),
            from_arrow_schema(spec.schema),
        )
        # Every row of a (tenant, source) key reaches one task, so each settled partition gets
        # exactly one file; only the file list comes back to the driver.
        by_key = rows.repartition(self.tasks, "tenant", "source")
        return [
            WrittenFile.from_row(row.asDict())
            for row in by_key.mapInArrow(write_settled_files(target), WRITTEN_FILE_DDL).collect()
        ]
