"""Compaction: a stream's staged rows move to their tenant's partitions (contract §5).

Its steps, and where each lives:
1. when: after which batch, beside or between the batches
   (`streaming.pipeline.compaction_schedule`);
2. what: list the stream's staged files per table and choose to merge or settle everything
   (`Compaction`, here; the choice: `storage.upkeep.settle_policy`);
3. the executors' tasks: read a write task's staged files, write settled files and runs
   (`storage.upkeep.compaction_tasks`), named by `storage.lake.file_names`, written by
   `storage.lake.file_writer`;
4. the file list back to the driver through one manifest per task
   (`storage.upkeep.compaction_manifests`), one slice of tenants at a time for a big settle
   (`storage.upkeep.settle_slices`);
5. the swap: one fenced, conditional Delta commit per table (`DeltaLake.settle`), checked
   against the staged files as listed and the commits after them, on the log itself
   (`storage.lake.log_snapshot`, `storage.lake.log_commits`): neither the listing nor the
   commit loads the table's file list, a file per tenant once settled.

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

import functools
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import CommitFailedError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from storage.lake.delta_lake import DeltaLake, LakeFile, StagedListing
from storage.lake.file_names import (
    MergeFiles,
    SettledFiles,
    run_inputs_digest,
    run_oldest_ms,
    write_task_of_staged_file,
)
from storage.lake.file_writer import MapInArrow
from storage.lake.lake_filesystem import filesystem_of
from storage.lake.tables import APPENDED_TABLES, STAGED_TABLES, TableSpec
from storage.lake.written_files import WrittenFile
from storage.upkeep.compaction_manifests import MANIFEST_DDL, Manifests
from storage.upkeep.compaction_tasks import (
    TaskWriter,
    compact_write_tasks,
    in_spark_task,
    read_staged_files,
    returning_memory,
    write_merged_files,
    write_settled_files,
    write_slice_runs,
)
from storage.upkeep.settle_policy import SETTLE_EVERYTHING, SettlePolicy
from storage.upkeep.settle_slices import (
    SLICE_FILES,
    plan_slices,
    slice_digest,
    slice_of_buckets,
)
from storage.upkeep.work_thread import WorkThread
from storage.upkeep.worker_priority import at_lowest_priority

log = logging.getLogger(__name__)

# The staged files a compaction read were taken by another commit in between (an `optimize`,
# or a stream compacting foreign files): it lists them again this many times.
SETTLE_ATTEMPTS = 5
MANIFESTS_FOLDER = "_compaction_manifests"
"""Under the lake's root: the lists of files a compaction's tasks wrote, while it runs."""
PACK_FILES = 100
"""An appended table (`APPENDED_TABLES`) is packed by the compaction that finds this many files
in it: at a 1 s trigger `tenant_status` gains a file or more a second, so unpacked it held
thousands within the hour, and every reader and the driver's snapshot of the table paid per
file; a short run never reaches it."""


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
    slices: int = 1
    """Commits of settled files (`storage.upkeep.settle_slices`)."""


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
    slice_files: int = SLICE_FILES
    """A table's settle that adds more files than this commits in slices of tenants, each adding
    about this many at most (`storage.upkeep.settle_slices`)."""
    yields_cpu: bool = False
    """Its tasks run at the lowest CPU priority (`storage.upkeep.worker_priority`): beside the
    batches (`streaming.pipeline.compaction_schedule.beside_batches`)."""

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
        between_slices: Callable[[], None] = lambda: None,
    ) -> list[TableCompaction]:
        """Compact every staged table; `version` (the batch it runs after) is the commits'
        transaction version under `<stream>/compaction`, `now_ms` its timestamp (None: settle
        everything). `between_slices` runs between two slices' commits of a sliced settle.

        The tables commit one after the other, in `STAGED_TABLES`' order, but the executors
        write the next table's files while the driver commits this one's: a settle at many
        tenants spends seconds a table in its commits, and the cores would wait. Files written
        and never committed are in no version, so a crash keeps the guarantees of one table at
        a time."""
        # An instance that crashed mid-compaction left its manifests; each start has a new
        # epoch, so an older epoch's are never read again.
        Manifests.remove_older(
            self.lake.root, self.lake.storage_options, self._manifests_folder, self.writer_epoch
        )
        hooks = _Hooks(before_commit, between_slices)
        done = []
        write = functools.partial(self._write, spark, version=version, now_ms=now_ms)
        written = self._write_beside(write, STAGED_TABLES[0])
        for index, spec in enumerate(STAGED_TABLES):
            attempt = written.result()
            if index + 1 < len(STAGED_TABLES):
                written = self._write_beside(write, STAGED_TABLES[index + 1])
            try:
                result = self._compact(spark, spec, version, now_ms, attempt, hooks)
            except BaseException:
                if index + 1 < len(STAGED_TABLES):
                    _discard(written)
                raise
            if result is not None:
                done.append(result)
                after_table()
        self.pack_appended_tables()
        return done

    def pack_appended_tables(self) -> None:
        """Rewrite each appended table's small files into few, once it holds `PACK_FILES`.
        Their rows are unchanged, so it needs no fence; a commit that lands first (another
        stream's packing, a purge) makes it give way to the next compaction."""
        for spec in APPENDED_TABLES:
            if len(self.lake.open(spec).file_uris()) >= PACK_FILES:
                self._pack(spec)

    def _pack(self, spec: TableSpec) -> None:
        try:
            packed = self.lake.compact_small_files(spec)
        except CommitFailedError as error:
            log.info("packing %s gave way to another commit: %s", spec.name, error)
            return
        log.info(
            "packed %s: %d small files into %d, version %d",
            spec.name,
            packed.files_removed,
            packed.files_added,
            packed.version,
        )

    def _write_beside(
        self, write: Callable[[TableSpec], _Written | None], spec: TableSpec
    ) -> WorkThread[_Written | None]:
        """`spec`'s files written while the caller commits another table's: the Spark jobs keep
        the caller's scheduler pool and job group, so a stop cancels both."""
        return WorkThread(
            functools.partial(write, spec), f"compaction-write-{spec.name}", spark_properties=True
        )

    def _write(
        self, spark: SparkSession, spec: TableSpec, version: int, now_ms: int | None
    ) -> _Written | None:
        """List `spec`'s staged files and write what compacting them takes; None: nothing to
        compact."""
        started = time.monotonic()
        listing = self.lake.staged_listing(spec, self.stream)
        staged = listing.files
        if not staged:
            return None
        settles_all = self.policy.settles_all(staged, now_ms)
        if not settles_all:
            # Runs stay as they are until they settle by age.
            staged = [file for file in staged if run_oldest_ms(file.path) is None]
            if not staged:
                return None
        swap = _Swap(self, spark, spec, listing, staged, version, started)
        return swap.write_settled() if settles_all else swap.write_merged()

    def _compact(
        self,
        spark: SparkSession,
        spec: TableSpec,
        version: int,
        now_ms: int | None,
        written: _Written | None,
        hooks: _Hooks,
    ) -> TableCompaction | None:
        """Commit `written` (the first attempt's files), listing and writing again while the
        staged files it took change under it."""
        started = written.swap.started if written is not None else time.monotonic()
        for attempt in range(SETTLE_ATTEMPTS):
            if attempt:
                log.info(
                    "compacting %s: its staged files changed meanwhile; listing again", spec.name
                )
                written = self._write(spark, spec, version, now_ms)
            if written is None:
                return None
            swapped = written.commit(hooks)
            if swapped is not None:
                result = TableCompaction(
                    table=spec.name,
                    settled_all=written.settles_all,
                    staged_files=len(written.swap.staged),
                    settled_files=swapped.settled_files,
                    run_files=swapped.run_files,
                    records=swapped.records,
                    seconds=time.monotonic() - started,
                    slices=swapped.slices,
                )
                log.info(
                    "compacted %s (%s): %d staged files into %d settled ones (%d rows) and %d "
                    "runs in %.2fs",
                    spec.name,
                    "settled everything" if written.settles_all else "merged",
                    result.staged_files,
                    result.settled_files,
                    result.records,
                    result.run_files,
                    result.seconds,
                )
                return result
        raise RuntimeError(
            f"compacting {spec.name}: its staged files kept changing during {SETTLE_ATTEMPTS} "
            "attempts; the next compaction tries again"
        )

    @property
    def _manifests_folder(self) -> str:
        return f"{MANIFESTS_FOLDER}/{self.stream}"

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

    def _manifests(self, spec: TableSpec, kind: str) -> Manifests:
        return Manifests(
            self.lake.root,
            self.lake.storage_options,
            f"{self._manifests_folder}/epoch-{self.writer_epoch}/{spec.name}/{kind}",
        )

    def _run_tasks(
        self,
        spark: SparkSession,
        spec: TableSpec,
        staged: list[LakeFile],
        writer: TaskWriter,
        manifests: Manifests,
    ) -> list[str]:
        """Run `writer` over the staged files' rows, each key's rows in one task; the paths of
        the manifests listing what it wrote."""
        by_task = staged_by_write_task(staged)
        if by_task is None:
            files = self._shuffled(
                spark, spec, staged, self._task(manifests.listing(in_spark_task(writer)))
            )
        else:
            tasks = min(len(by_task), self.tasks)
            compact = compact_write_tasks(
                self.lake.root, self.lake.storage_options, spec.name, by_task, tasks, writer
            )
            files = spark.range(tasks, numPartitions=tasks).mapInArrow(
                self._task(manifests.listing(compact)), MANIFEST_DDL
            )
        # The file list reaches the driver through one manifest per task, never through the JVM
        # (`Manifests`).
        return [row.manifest for row in files.collect()]

    def _task(self, writer: MapInArrow) -> MapInArrow:
        """A task that writes compacted files, as the executors run it."""
        task = returning_memory(writer)
        if not self.yields_cpu:
            return task
        lake = functools.partial(filesystem_of, self.lake.root, self.lake.storage_options)
        return at_lowest_priority(task, warm=lake)

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


@dataclass(frozen=True)
class _Swapped:
    settled_files: int
    run_files: int
    records: int
    slices: int = 1


@dataclass(frozen=True)
class _Hooks:
    before_commit: Callable[[], None]
    between_slices: Callable[[], None]


@dataclass(frozen=True)
class _Swap:
    """One attempt at compacting one table's listed staged files: write, then commit."""

    compaction: Compaction
    spark: SparkSession
    spec: TableSpec
    listing: StagedListing
    """The table's staged files as listed, at the version the swaps are checked from."""
    staged: list[LakeFile]
    version: int
    started: float
    """`time.monotonic()` when the staged files were listed."""

    def write_merged(self) -> _Written:
        """Settle the keys worth a file, the others' rows into runs (committed in one)."""
        compaction, spec = self.compaction, self.spec
        target = MergeFiles(
            **vars(compaction._settled(spec, self.staged)),
            oldest_ms=min(file.staged_ms or 0 for file in self.staged),
        )
        settle_rows = compaction.policy.settle_rows
        manifests = compaction._manifests(spec, "merged")
        paths = self._tasks(
            lambda task: write_merged_files(replace(target, write_task=task), settle_rows),
            manifests,
        )
        return _Written(self, settles_all=False, manifests=manifests, paths=paths)

    def write_settled(self) -> _Written:
        """Every staged row into its key's settled files, committed in one commit or, when that
        would add more than `slice_files` files, in slices (`storage.upkeep.settle_slices`):
        then the staged files' rows are cut into one run per write task and slice too."""
        compaction, spec = self.compaction, self.spec
        target = compaction._settled(spec, self.staged)
        manifests = compaction._manifests(spec, "settled")
        paths = self._tasks(
            lambda task: write_settled_files(replace(target, write_task=task)), manifests
        )
        written = _Written(self, settles_all=True, manifests=manifests, paths=paths)
        try:
            files_per_bucket = manifests.files_per_bucket(paths)
            # Staged files that do not say their write task go through the shuffle, whose tasks
            # cannot cut runs per slice: those settle in one commit, as before slices.
            if (
                int(files_per_bucket.sum()) <= compaction.slice_files
                or staged_by_write_task(self.staged) is None
            ):
                return written
            slices = plan_slices(files_per_bucket, compaction.slice_files)
            return replace(written, slices=slices, runs=self._cut_runs(target, slices))
        except BaseException:
            written.discard()
            raise

    def _tasks(self, writer: TaskWriter, manifests: Manifests) -> list[str]:
        try:
            return self.compaction._run_tasks(self.spark, self.spec, self.staged, writer, manifests)
        except BaseException:
            manifests.remove()
            raise

    def _cut_runs(self, target: SettledFiles, slices: list[range]) -> list[WrittenFile]:
        """The staged files' rows as one run per write task and slice (written, not committed)."""
        compaction, spec = self.compaction, self.spec
        runs_target = MergeFiles(
            **vars(target), oldest_ms=min(file.staged_ms or 0 for file in self.staged)
        )
        slice_of_bucket = slice_of_buckets(slices)
        cut = compaction._manifests(spec, "slices")
        try:
            paths = self._tasks(
                lambda task: write_slice_runs(
                    replace(runs_target, write_task=task), slice_of_bucket
                ),
                cut,
            )
            return WrittenFile.from_table(cut.read(paths))
        finally:
            cut.remove()

    def commit(
        self,
        added: list[WrittenFile] | pa.Table,
        hooks: _Hooks,
        log_checkpoint_files: int | None,
    ) -> int | None:
        """Swap the listed staged files for `added`; the version committed, or None if they
        were taken meanwhile."""
        compaction = self.compaction
        return compaction.lake.settle(
            self.spec,
            self.staged,
            added,
            compaction.stream,
            self.version,
            compaction.writer_epoch,
            hooks.before_commit,
            log_checkpoint_files,
            self.listing,
        )


@dataclass(frozen=True)
class _Written:
    """One attempt's files, written and listed in manifests, none committed yet."""

    swap: _Swap
    settles_all: bool
    manifests: Manifests
    paths: list[str]
    """The manifests listing the settled (and, merging, run) files."""
    slices: list[range] | None = None
    """A sliced settle's slices of tenant buckets; None: one commit."""
    runs: list[WrittenFile] = field(default_factory=list)
    """A sliced settle's runs: the staged rows cut per write task and slice."""

    def discard(self) -> None:
        """Never to be committed: its files are in no version, its manifests go."""
        self.manifests.remove()

    def commit(self, hooks: _Hooks) -> _Swapped | None:
        """Swap the staged files for the written ones; None if they were taken meanwhile."""
        compaction = self.swap.compaction
        try:
            if self.slices is not None:
                return self._in_slices(self.slices, hooks)
            written = self.manifests.read(self.paths)
            if self.swap.commit(written, hooks, compaction.log_checkpoint_files) is None:
                return None
        finally:
            self.discard()
        is_settled = [run_oldest_ms(path) is None for path in written.column("path").to_pylist()]
        settled = written.filter(pa.array(is_settled, pa.bool_()))
        return _Swapped(
            settled_files=settled.num_rows,
            run_files=written.num_rows - settled.num_rows,
            records=_records(settled),
        )

    def _in_slices(self, slices: list[range], hooks: _Hooks) -> _Swapped | None:
        """Swap the staged files for the runs (the same rows), then each slice's runs for its
        settled files, one commit each: every commit swaps the same rows, and the driver holds
        one slice's files at a time."""
        swap = self.swap
        compaction, spec = swap.compaction, swap.spec
        inputs_digest = compaction._settled(spec, swap.staged).inputs_digest
        slice_of_digest = {
            slice_digest(inputs_digest, index): index for index in range(len(slices))
        }
        runs_of: dict[int, list[LakeFile]] = {}
        for run in self.runs:
            index = slice_of_digest[run_inputs_digest(run.path) or ""]
            runs_of.setdefault(index, []).append(
                LakeFile(path=run.path, size=run.size, partition_values=run.partition_values)
            )
        checked = self._swap_staged_for_runs(hooks)
        if checked is None:
            return None
        log.info(
            "compacting %s: %d staged files cut into %d runs for %d slices of tenants",
            spec.name,
            len(swap.staged),
            len(self.runs),
            len(slices),
        )
        settled_files = records = 0
        for index, buckets in enumerate(slices):
            removed = runs_of.get(index, [])
            written = self.manifests.read(self.paths, buckets)
            if bool(removed) != bool(written.num_rows):
                raise RuntimeError(
                    f"compacting {spec.name}: slice {index} has {len(removed)} runs and "
                    f"{written.num_rows} settled files; a slice needs both or neither"
                )
            if not written.num_rows:
                continue
            if settled_files:
                hooks.between_slices()
            checked = compaction.lake.settle_on_log(
                spec,
                checked,
                removed,
                written,
                compaction.stream,
                swap.version,
                compaction.writer_epoch,
                hooks.before_commit,
            )
            if checked is None:
                return None
            settled_files += written.num_rows
            records += _records(written)
            log.info(
                "compacting %s: slice %d of %d committed, %d settled files",
                spec.name,
                index + 1,
                len(slices),
                written.num_rows,
            )
        checkpoint_at = compaction.log_checkpoint_files
        if checkpoint_at is not None and settled_files + len(swap.staged) >= checkpoint_at:
            compaction.lake.checkpoint_log(spec)
        return _Swapped(settled_files, 0, records, len(slices))

    def _swap_staged_for_runs(self, hooks: _Hooks) -> int | None:
        """Commit the staged files' swap for the runs; the version committed (which holds
        every run), from which the slices commit (`DeltaLake.settle_on_log`). None: the staged
        files were taken meanwhile.

        The log gets a checkpoint now if it has none: the one the slices end with is then
        written from it a batch at a time (`DeltaLake.checkpoint_log`), never from a snapshot
        of every settled file."""
        swap = self.swap
        compaction, spec = swap.compaction, swap.spec
        version = swap.commit(self.runs, hooks, None)
        if version is not None and compaction.lake.log(spec).last_checkpoint() is None:
            compaction.lake.checkpoint_log(spec)
        return version


def _records(files: pa.Table) -> int:
    """The rows of `files` (`WRITTEN_FILE_SCHEMA`)."""
    return int(pc.sum(files.column("num_records")).as_py() or 0)


def _discard(pending: WorkThread[_Written | None]) -> None:
    """Wait for a write and drop what it wrote: the caller failed before committing it, and
    raises its own error, not the write's."""
    try:
        written = pending.result()
    except Exception:
        return
    if written is not None:
        written.discard()
