"""Compaction: a stream's staged rows move to their tenant's partitions (contract §5).

Its steps, and where each lives:
1. when: after which batch, beside or between the batches
   (`streaming.pipeline.compaction_schedule`);
2. what: list the stream's staged files per table and choose to merge or settle everything
   (`Compaction`, `SettlePolicy`, here);
3. the executors' tasks: read a write task's staged files, write settled files and runs
   (`storage.upkeep.compaction_tasks`), named by `storage.lake.file_names`, written by
   `storage.lake.file_writer`;
4. the file list back to the driver through one manifest per task
   (`storage.upkeep.compaction_manifests`);
5. the swap: one fenced, conditional Delta commit per table (`DeltaLake.settle`, sharing its
   commit path with the batches' commits in `storage.lake.delta_lake`).

A micro-batch writes one staged file per write task and table (`storage.lake.tables` says why).
Compaction reads this stream's staged files, regroups their rows by (tenant, source), writes one
settled file per (tenant, source[, window date]) partition, and commits,
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

Settling follows the data, not the tenant count (`SettlePolicy`). A settled file per tenant and
interval would cost a PUT per tenant per interval, most of them for a handful of rows at many
tenants. So a compaction does one of two things per table:
- it merges: it reads the batches' staged files only, settles the keys with `settle_rows` rows
  or more among them, and writes every other row to one *run* per write task, a staged file
  sorted by key whose name says when its oldest row was staged. Runs are not read again until
  everything settles;
- it settles everything: when the oldest staged row would pass the age limit before the next
  compaction, every staged file (runs included) is read and each key gets one settled file per
  partition, whatever the number of runs it waited in.

Both are one commit per table that removes what they read and adds what they wrote, so the
crash safety above holds for both, and the choice is a function of the files it lists and the
timestamp of the batch it runs after.

Runs on the driver, beside the stream's batches (`streaming.pipeline.compaction_schedule`),
whose commits may land between its own: it takes the staged files it lists, and its commit only
needs those to be still there. The rows never reach the driver.

No shuffle is needed to regroup them. A key's rows are in the staged files of one write task
only, the one that writes its state partition, and every staged file's name says which
(`write_task_of_staged_file`): an executor task reads one write task's files and settles their
keys on its own (`compact_write_tasks`). Spark's shuffle would convert every row to the JVM's
format and back, and hold a core longer: beside the batches on two cores, 360,000 rows took
2.3 s this way and 5-9 s through the shuffle (docs/scale.md). Staged files that do not say (an
outside `OPTIMIZE` merged some) still go through the shuffle.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from storage.lake.delta_lake import DeltaLake, LakeFile
from storage.lake.file_names import (
    MergeFiles,
    SettledFiles,
    run_oldest_ms,
    write_task_of_staged_file,
)
from storage.lake.file_writer import MapInArrow
from storage.lake.tables import STAGED_TABLES, TableSpec
from storage.lake.written_files import WrittenFile
from storage.upkeep.compaction_manifests import MANIFEST_DDL, Manifests
from storage.upkeep.compaction_tasks import (
    TaskWriter,
    compact_write_tasks,
    in_spark_task,
    read_staged_files,
    write_merged_files,
    write_settled_files,
)

log = logging.getLogger(__name__)

# The staged files a compaction read were taken by another commit in between (an `optimize`,
# or a stream compacting foreign files): it lists them again this many times.
SETTLE_ATTEMPTS = 5
MANIFESTS_FOLDER = "_compaction_manifests"
"""Under the lake's root: the lists of files a compaction's tasks wrote, while it runs."""


@dataclass(frozen=True)
class SettlePolicy:
    """When staged rows settle: `stream.compact_interval`, `merge_interval`, `settle_rows`."""

    age_limit_ms: int = 0
    """No staged row waits longer than this (plus one batch) to settle; 0: every compaction
    settles everything."""
    pass_interval_ms: int = 0
    """How often compaction runs (at most `age_limit_ms`)."""
    settle_rows: int = 1
    """A key with this many rows among a merge's inputs settles them."""

    @classmethod
    def of(cls, age_limit_ms: int, merge_interval_ms: int, settle_rows: int) -> SettlePolicy:
        return cls(age_limit_ms, min(merge_interval_ms, age_limit_ms), settle_rows)

    def settles_all(self, staged: list[LakeFile], now_ms: int | None) -> bool:
        """Whether a compaction at `now_ms` (None: the stream's last one, as an
        `--available-now` run ends) settles every staged row, or only merges: the oldest row
        would be older than the age limit by the next compaction, `pass_interval_ms` later."""
        if now_ms is None or self.age_limit_ms <= self.pass_interval_ms:
            return True
        oldest_ms = min(file.staged_ms or 0 for file in staged)
        return oldest_ms <= now_ms - (self.age_limit_ms - self.pass_interval_ms)

    def owes(self, staged: list[LakeFile], now_ms: int) -> bool:
        """Whether a compaction at `now_ms` has work that one at the start of its interval
        would have done: a staged file from before the interval began that it takes (a run only
        when it settles everything). A stream that died before its interval's compaction
        committed owes it."""
        began_ms = now_ms - now_ms % self.pass_interval_ms if self.pass_interval_ms else now_ms
        takes_runs = bool(staged) and self.settles_all(staged, now_ms)
        return any(
            (file.staged_ms or 0) < began_ms and (takes_runs or run_oldest_ms(file.path) is None)
            for file in staged
        )


SETTLE_EVERYTHING = SettlePolicy()


@dataclass(frozen=True)
class TableCompaction:
    table: str
    settled_all: bool
    """Every staged row settled (the age limit, or the run's end); False: a merge."""
    staged_files: int
    settled_files: int
    run_files: int
    records: int
    """Rows settled; rows moved to runs are not counted."""
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
    policy: SettlePolicy = SETTLE_EVERYTHING

    def owed(self, now_ms: int) -> bool:
        """Whether this stream owes a compaction at `now_ms` (`SettlePolicy.owes`)."""
        return any(
            self.policy.owes(self.lake.staged_files(spec, self.stream), now_ms)
            for spec in STAGED_TABLES
        )

    def run(
        self,
        spark: SparkSession,
        version: int,
        now_ms: int | None = None,
        before_commit: Callable[[], None] = lambda: None,
        after_table: Callable[[], None] = lambda: None,
    ) -> list[TableCompaction]:
        """Compact every staged table; `version` (the batch it runs after) is the commits'
        transaction version under `<stream>/compaction`, `now_ms` its timestamp (None: settle
        everything)."""
        # An instance that crashed mid-compaction left its manifests; each start has a new
        # epoch, so an older epoch's are never read again.
        Manifests.remove_older(
            self.lake.root, self.lake.storage_options, self._manifests_folder, self.writer_epoch
        )
        done = []
        for spec in STAGED_TABLES:
            result = self._compact(spark, spec, version, now_ms, before_commit)
            if result is not None:
                done.append(result)
                after_table()
        return done

    def _compact(
        self,
        spark: SparkSession,
        spec: TableSpec,
        version: int,
        now_ms: int | None,
        before_commit: Callable[[], None],
    ) -> TableCompaction | None:
        started = time.monotonic()
        for _ in range(SETTLE_ATTEMPTS):
            staged = self.lake.staged_files(spec, self.stream)
            if not staged:
                return None
            settles_all = self.policy.settles_all(staged, now_ms)
            if settles_all:
                written = self._write_settled(spark, spec, staged)
            else:
                # Runs stay as they are until they settle by age.
                staged = [file for file in staged if run_oldest_ms(file.path) is None]
                if not staged:
                    return None
                written = self._write_merged(spark, spec, staged)
            if self.lake.settle(
                spec,
                staged,
                written,
                self.stream,
                version,
                self.writer_epoch,
                before_commit,
                self.log_checkpoint_files,
            ):
                settled = [file for file in written if run_oldest_ms(file.path) is None]
                result = TableCompaction(
                    table=spec.name,
                    settled_all=settles_all,
                    staged_files=len(staged),
                    settled_files=len(settled),
                    run_files=len(written) - len(settled),
                    records=sum(file.num_records for file in settled),
                    seconds=time.monotonic() - started,
                )
                log.info(
                    "compacted %s (%s): %d staged files into %d settled ones (%d rows) and %d "
                    "runs in %.2fs",
                    spec.name,
                    "settled everything" if settles_all else "merged",
                    result.staged_files,
                    result.settled_files,
                    result.records,
                    result.run_files,
                    result.seconds,
                )
                return result
            log.info("compacting %s: its staged files changed meanwhile; listing again", spec.name)
        raise RuntimeError(
            f"compacting {spec.name}: its staged files kept changing during {SETTLE_ATTEMPTS} "
            "attempts; the next compaction tries again"
        )

    @property
    def _manifests_folder(self) -> str:
        return f"{MANIFESTS_FOLDER}/{self.stream}"

    def _write_settled(
        self, spark: SparkSession, spec: TableSpec, staged: list[LakeFile]
    ) -> list[WrittenFile]:
        target = self._settled(spec, staged)
        return self._write(
            spark, spec, staged, lambda task: write_settled_files(replace(target, write_task=task))
        )

    def _write_merged(
        self, spark: SparkSession, spec: TableSpec, staged: list[LakeFile]
    ) -> list[WrittenFile]:
        target = MergeFiles(
            **vars(self._settled(spec, staged)),
            oldest_ms=min(file.staged_ms or 0 for file in staged),
        )
        settle_rows = self.policy.settle_rows
        return self._write(
            spark,
            spec,
            staged,
            lambda task: write_merged_files(replace(target, write_task=task), settle_rows),
        )

    def _settled(self, spec: TableSpec, staged: list[LakeFile]) -> SettledFiles:
        inputs = "\n".join(file.path for file in staged)
        return SettledFiles(
            root=self.lake.root,
            storage_options=self.lake.storage_options,
            stream=self.stream,
            writer_epoch=self.writer_epoch,
            inputs_digest=hashlib.sha256(inputs.encode()).hexdigest()[:16],
            table_name=spec.name,
        )

    def _write(
        self, spark: SparkSession, spec: TableSpec, staged: list[LakeFile], writer: TaskWriter
    ) -> list[WrittenFile]:
        manifests = Manifests(
            self.lake.root,
            self.lake.storage_options,
            f"{self._manifests_folder}/epoch-{self.writer_epoch}/{spec.name}",
        )
        by_task = staged_by_write_task(staged)
        if by_task is None:
            files = self._shuffled(spark, spec, staged, manifests.listing(in_spark_task(writer)))
        else:
            tasks = min(len(by_task), self.tasks)
            compact = compact_write_tasks(
                self.lake.root, self.lake.storage_options, spec.name, by_task, tasks, writer
            )
            files = spark.range(tasks, numPartitions=tasks).mapInArrow(
                manifests.listing(compact), MANIFEST_DDL
            )
        # The file list reaches the driver through one manifest per task, never through the JVM
        # (`Manifests`).
        try:
            return manifests.read([row.manifest for row in files.collect()])
        finally:
            manifests.remove()

    def _shuffled(
        self, spark: SparkSession, spec: TableSpec, staged: list[LakeFile], write: MapInArrow
    ) -> DataFrame:
        """`write` over the staged rows regrouped by key, through Spark's shuffle: for staged
        files that do not say which write task wrote them (an outside `OPTIMIZE` merged some)."""
        paths = spark.createDataFrame([(file.path,) for file in staged], "path string")
        rows = paths.repartition(min(len(staged), self.tasks)).mapInArrow(
            read_staged_files(self.lake.root, self.lake.storage_options, spec.name),
            from_arrow_schema(spec.schema),
        )
        # Every row of a (tenant, source) key reaches one task, so each settled partition gets
        # exactly one file.
        return rows.repartition(self.tasks, "tenant", "source").mapInArrow(write, MANIFEST_DDL)


def staged_by_write_task(staged: list[LakeFile]) -> dict[int, list[str]] | None:
    """The staged files' paths by the write task whose keys they hold; None if a file does not
    say (`write_task_of_staged_file`)."""
    by_task: dict[int, list[str]] = {}
    for file in staged:
        task = write_task_of_staged_file(file.path)
        if task is None:
            return None
        by_task.setdefault(task, []).append(file.path)
    return by_task
