"""The Delta tables under one lake root, written with delta-rs (no JVM, no Delta jars).

Each append carries the Delta transaction id (app_id = stream name, version = batch id) in the
same atomic commit as its data, so "was batch N committed to table T?" has an exact answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.schema import Field as DeltaField
from deltalake.transaction import AddAction, RemoveAction

from storage.lake.commits import (
    COMMIT_ATTEMPTS,
    check_fence,
    check_fence_epoch,
    commit_without_conflict,
    conditional,
    fence_app_id,
)
from storage.lake.delta_log import DeltaLog, plain_writer
from storage.lake.file_names import run_oldest_ms, stream_of_staged_file
from storage.lake.file_stats import partition_text
from storage.lake.lake_filesystem import filesystem_of
from storage.lake.log_checkpoint import write_checkpoint
from storage.lake.log_cleanup import clean_up_expired_logs
from storage.lake.log_commits import FencedCommit, commit_fenced
from storage.lake.log_head import LogHead, LogHeads, read_head
from storage.lake.log_snapshot import partition_snapshot
from storage.lake.s3_options import reaching, storage_options
from storage.lake.snapshot_reader import (
    current_paths,
    filesystem_path,
    partition_columns,
    read_newest_first,
    read_snapshot,
    tenant_file_actions,
)
from storage.lake.table_files import tenant_files
from storage.lake.tables import LAKE_TABLES, STAGED, TableSpec, with_layout
from storage.lake.written_files import WrittenFile
from tenants.settings import LakeSettings

# Not `log`: `DeltaLake.log` is a table's Delta log.
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableMaintenance:
    files_removed: int
    files_added: int
    version: int


DELETE_ATTEMPTS = 5


class DeltaLake:
    def __init__(self, root: str, storage_options: dict[str, str] | None = None) -> None:
        self.root = root.rstrip("/")
        self.storage_options = storage_options
        self._logs: dict[str, DeltaLog] = {}
        self._checkpointing: dict[str, threading.Thread] = {}

    def __repr__(self) -> str:
        # storage_options may hold S3 keys: never print them.
        return f"DeltaLake({self.root!r})"

    @classmethod
    def from_settings(cls, lake: LakeSettings) -> DeltaLake:
        return cls(lake.root, storage_options(lake))

    @property
    def is_local(self) -> bool:
        return "://" not in self.root or self.root.startswith("file://")

    @property
    def local_path(self) -> Path | None:
        """The lake's folder on this machine; None for an object store."""
        return Path(self.root.removeprefix("file://")) if self.is_local else None

    def table_uri(self, spec: TableSpec) -> str:
        return f"{self.root}/{spec.name}"

    def ensure_tables(self) -> None:
        """Create every table that does not exist yet, so readers always find all of them, and
        add the columns a table created by an older release lacks.

        Raises `LakeLayoutError` if a table is partitioned otherwise than this release writes
        (a lake from before the staged layout): `tenant-windows migrate-layout` converts it.
        """
        outdated = []
        for spec in LAKE_TABLES:
            head = self.head(spec)
            if head is not None:
                if head.partition_columns != spec.partition_by:
                    outdated.append(spec.name)
                    continue
                if head.unfit_for(spec) is None:
                    continue  # as this release writes it: delta-rs need not load its files
            with reaching(self.root, self.storage_options, f"creating table {spec.name}"):
                table = DeltaTable.create(
                    self.table_uri(spec),
                    spec.storage_schema,
                    mode="ignore",
                    partition_by=list(spec.partition_by),
                    storage_options=self.storage_options,
                )
                if tuple(table.metadata().partition_columns) != spec.partition_by:
                    outdated.append(spec.name)
                    continue
                _add_missing_columns(table, spec)
        if outdated:
            raise LakeLayoutError(
                f"the tables {', '.join(outdated)} under {self.root} are partitioned by tenant "
                "(the layout before staged writes); run `tenant-windows migrate-layout` once, "
                "with the stream stopped, to convert them "
                "(docs/how-to/operate.md#a-lake-from-before-staged-writes)"
            )

    def outdated_tables(self) -> list[TableSpec]:
        """The existing tables whose partitioning is not the one this release writes."""
        outdated = []
        for spec in LAKE_TABLES:
            try:
                table = self.open(spec)
            except TableNotFoundError:
                continue
            if tuple(table.metadata().partition_columns) != spec.partition_by:
                outdated.append(spec)
        return outdated

    def migrate_layout(self, spec: TableSpec) -> int:
        """Rewrite a table partitioned by `tenant` (the layout before staged writes) into this
        release's layout, every row settled in its tenant's partition, in one commit; returns
        the new version.

        The rows stream through in record batches (never the whole table in memory). The
        overwrite keeps the table's transaction ids (batch ids and writer fence), so a stream
        resumes exactly where it stopped.
        """
        table = self.open(spec)
        version = table.version()
        source = ds.dataset(
            [filesystem_path(uri) for uri in table.file_uris()],
            schema=pa.schema(
                [
                    *spec.schema,
                    *(f for f in partition_columns(table) if f.name not in spec.schema.names),
                ]
            ),
            format="parquet",
            filesystem=filesystem_of(self.root, self.storage_options)[0],
            partitioning=ds.partitioning(partition_columns(table), flavor="hive"),
            partition_base_dir=filesystem_path(table.table_uri).rstrip("/"),
        )
        batches = (
            with_layout(pa.Table.from_batches([batch]), spec, settled=True).to_batches()
            for batch in source.to_batches(columns=spec.schema.names)
            if batch.num_rows > 0
        )
        reader = pa.RecordBatchReader.from_batches(
            spec.storage_schema, (batch for group in batches for batch in group)
        )
        with reaching(self.root, self.storage_options, f"migrating table {spec.name}"):
            write_deltalake(
                table,
                reader,
                mode="overwrite",
                schema_mode="overwrite",
                partition_by=list(spec.partition_by),
                storage_options=self.storage_options,
                commit_properties=conditional(),
            )
        migrated = self.open(spec)
        if migrated.version() != version + 1:
            raise RuntimeError(f"{spec.name}: another commit landed during the migration")
        return migrated.version()

    def open(self, spec: TableSpec) -> DeltaTable:
        with reaching(self.root, self.storage_options, f"opening table {spec.name}"):
            return DeltaTable(self.table_uri(spec), storage_options=self.storage_options)

    def read_arrow(
        self,
        spec: TableSpec,
        columns: list[str] | None = None,
        row_filter: ds.Expression | None = None,
        tenant: str | None = None,
    ) -> pa.Table:
        """The table's current rows (`columns` of those matching `row_filter`), read by pyarrow
        from the snapshot's files (`storage.lake.snapshot_reader` says why not by delta-rs); with
        `tenant`, only from the files that may hold its rows (the caller still filters)."""
        with reaching(self.root, self.storage_options, f"reading table {spec.name}"):
            table = self.open(spec)
            return read_snapshot(
                table,
                spec.schema,
                self.storage_options,
                columns,
                row_filter,
                files=None if tenant is None else tenant_files(table, tenant),
            )

    def read_newest(
        self, spec: TableSpec, columns: list[str], enough: Callable[[pa.Table, int], bool]
    ) -> pa.Table:
        """The table's rows from its newest batches back, until `enough` of them are read
        (`storage.lake.snapshot_reader.read_newest_first`, which says what `enough` is told)."""
        with reaching(self.root, self.storage_options, f"reading table {spec.name}"):
            return read_newest_first(
                self.open(spec), spec.schema, self.storage_options, columns, enough
            )

    def delete_rows(self, spec: TableSpec, predicate: str) -> int:
        """Delete the rows matching `predicate` (SQL) in one commit; rows deleted. A concurrent
        commit (a running stream's) makes delta-rs refuse it: it is tried again on the newer
        version, a few times."""
        attempts = 1
        while True:
            try:
                with reaching(self.root, self.storage_options, f"deleting from {spec.name}"):
                    metrics = self.open(spec).delete(predicate=predicate)
                return int(metrics.get("num_deleted_rows") or 0)
            except CommitFailedError:
                if attempts == DELETE_ATTEMPTS:
                    raise
                attempts += 1

    def committed_batch(
        self, spec: TableSpec, app_id: str, heads: LogHeads | None = None
    ) -> int | None:
        """The highest batch id `app_id` has committed to the table, if any; `heads` keeps the
        table's head from one call to the next (default: read anew)."""
        head = self.head(spec, heads)
        if head is None:
            return self.open(spec).transaction_version(app_id)
        return head.transactions.get(app_id)

    def head(self, spec: TableSpec, heads: LogHeads | None = None) -> LogHead | None:
        """The table's transaction ids, protocol and columns at its newest version, read from
        the log (`log_head`), moved on from `heads`' when given; None where that reader
        declines (delta-rs then answers)."""
        with reaching(self.root, self.storage_options, f"reading table {spec.name}"):
            return read_head(self.log(spec)) if heads is None else heads.head(self.log(spec))

    def vacuum(
        self, retention_ms: int, dry_run: bool, unreferenced: bool = True
    ) -> dict[str, list[str]]:
        """Delete files no table version within `retention_ms` references, per table.

        That covers the files of old versions (a commit removed them) and, with `unreferenced`,
        the files a crashed attempt wrote but never committed, which only a listing of every
        table's folder finds; committed data of the current version is never touched.
        delta-rs counts retention in hours, so it is rounded up to whole hours.
        """
        return {
            spec.name: self.open(spec).vacuum(
                retention_hours=-(-retention_ms // 3_600_000),
                dry_run=dry_run,
                # The retention check refuses less than a week; the operator chose the window.
                enforce_retention_duration=False,
                # Also files no commit ever referenced, not only those removed by a commit.
                full=unreferenced,
            )
            for spec in LAKE_TABLES
        }

    def optimize(self, target_file_bytes: int | None = None) -> dict[str, TableMaintenance]:
        """Compact each table's small files and write a log checkpoint, per table
        (`compact_small_files`).

        Executors write a file per partition and task each batch, so at thousands of tenants a
        table gathers thousands of small files; readers then pay per file. The checkpoint keeps
        opening a table fast as its log grows.
        """
        return {
            spec.name: self.compact_small_files(spec, target_file_bytes) for spec in LAKE_TABLES
        }

    def compact_small_files(
        self, spec: TableSpec, target_file_bytes: int | None = None
    ) -> TableMaintenance:
        """Rewrite `spec`'s small files into files of about `target_file_bytes` (delta-rs's
        default when None) and checkpoint its log. Data is unchanged: the commit carries
        `dataChange = false`, and the stream's own commits retry around it."""
        with reaching(self.root, self.storage_options, f"optimizing table {spec.name}"):
            table = self.open(spec)
            # Staged files are the stream's to settle: merged here, they would settle only
            # as files of no stream (`storage.upkeep.compaction` still takes them, later).
            metrics = table.optimize.compact(
                partition_filters=([(spec.partition_by[0], "!=", STAGED)] if spec.staged else None),
                target_size=target_file_bytes,
            )
        self.checkpoint_log(spec)
        return TableMaintenance(
            files_removed=int(metrics.get("numFilesRemoved", 0)),
            files_added=int(metrics.get("numFilesAdded", 0)),
            version=table.version(),
        )

    def commit_files(
        self,
        spec: TableSpec,
        files: list[WrittenFile],
        app_id: str,
        batch_id: int,
        writer_epoch: int,
        before_commit: Callable[[], None] = lambda: None,
        heads: LogHeads | None = None,
    ) -> bool:
        """Commit `files` (written by executors) as batch `batch_id` of `app_id`, in one commit,
        unless the table already holds that batch; `heads` as for `committed_batch`.

        Only while the table is fenced with `writer_epoch` (see `writer_lease`): checked at the
        table's head, and against every commit after it (`log_commits.commit_fenced`), so a
        newer instance's fence can never be slipped past. `before_commit` runs after those
        checks, right before the commit. Returns whether it committed.

        Written on the log, so a commit costs the commits since the head, not the table's
        files; by delta-rs where the log's reader declines or the protocol asks more of a
        writer than files. Raises `LakeLayoutError` if the table cannot take the files as they
        are (`LogHead.unfit_for`).
        """
        batch = FencedCommit(
            removed=(),
            added=files,
            app_id=app_id,
            writer_epoch=writer_epoch,
            transaction=(app_id, batch_id),
            data_change=True,
        )
        for _ in range(COMMIT_ATTEMPTS):
            head = self.head(spec, heads)
            if head is None or not head.plain_writer:
                return self._commit_files_by_delta_rs(spec, files, batch, before_commit)
            if (unfit := head.unfit_for(spec)) is not None:
                raise LakeLayoutError(
                    f"table {spec.name} under {self.root} cannot take batch {batch_id}: {unfit}. "
                    "A stream adds missing columns when it starts; `tenant-windows "
                    "migrate-layout` converts an old partitioning "
                    "(docs/how-to/operate.md#a-lake-from-before-staged-writes)"
                )
            fenced_with = head.transactions.get(fence_app_id(app_id))
            check_fence_epoch(fenced_with, self.table_uri(spec), app_id, writer_epoch)
            committed = head.transactions.get(app_id)
            if committed is not None and committed >= batch_id:
                return False
            doing = f"committing batch {batch_id} to table {spec.name}"
            with reaching(self.root, self.storage_options, doing):
                version = commit_fenced(self.log(spec), head.version, batch, before_commit)
            if version is not None:
                if version % head.checkpoint_interval == 0:
                    self._checkpoint_after_batch(spec, version)
                return True
            # The table's metadata or protocol changed since its head: look at it again.
        raise RuntimeError(
            f"{self.table_uri(spec)}: its metadata kept changing during {COMMIT_ATTEMPTS} "
            f"attempts to commit batch {batch_id}; retry"
        )

    def _commit_files_by_delta_rs(
        self,
        spec: TableSpec,
        files: list[WrittenFile],
        batch: FencedCommit,
        before_commit: Callable[[], None],
    ) -> bool:
        app_id, batch_id = batch.transaction

        def not_yet_committed(table: DeltaTable) -> bool:
            committed = table.transaction_version(app_id)
            return committed is None or committed < batch_id

        return self._fenced_commit(
            spec,
            add_actions(files, data_change=True),
            Transaction(app_id=app_id, version=batch_id),
            (app_id, batch.writer_epoch),
            f"committing batch {batch_id} to table {spec.name}",
            not_yet_committed,
            before_commit,
        )

    def settle(
        self,
        spec: TableSpec,
        staged: list[LakeFile],
        settled: list[WrittenFile] | pa.Table,
        app_id: str,
        compaction_version: int,
        writer_epoch: int,
        before_commit: Callable[[], None] = lambda: None,
        log_checkpoint_files: int | None = None,
        listing: StagedListing | None = None,
    ) -> int | None:
        """Replace `staged` files by the `settled` ones holding the same rows, in one commit
        (contract §5: at every version each row is visible exactly once), with the transaction id
        (`<app_id>/compaction`, `compaction_version`) and `dataChange = false`: readers that
        follow the table see no new data. Returns the version committed.

        Checked against `listing` (the staged files as listed, default: listed now) and the
        commits after it, on the log (`log_commits.commit_fenced`), never a loaded snapshot: a
        table of a file per tenant costs a commit nothing more. Fenced like a batch's commit:
        `FencedError` if the listed version or a later commit holds a newer writer's fence.
        Returns None, committing nothing, if one of the staged files is gone (another
        compaction or an `optimize` took it): the caller lists the staged files again.

        A commit of at least `log_checkpoint_files` actions is followed by a checkpoint of the
        log: at many tenants a compaction adds a file per tenant, and until a checkpoint every
        reader that opens the table replays each of those actions from JSON.
        """
        listed = listing or self.staged_listing(spec, app_id)
        check_fence_epoch(listed.fence_epoch, self.table_uri(spec), app_id, writer_epoch)
        if not listed.plain_writer:
            raise RuntimeError(
                f"table {spec.name} requires writer features this release does not write; "
                "the stream cannot settle its rows"
            )
        present = {file.path for file in listed.files}
        if any(unquote(file.path) not in present for file in staged):
            return None
        version = self.settle_on_log(
            spec,
            listed.version,
            staged,
            settled,
            app_id,
            compaction_version,
            writer_epoch,
            before_commit,
        )
        swapped = len(staged) + len(settled)
        checkpoint_at = log_checkpoint_files
        if version is not None and checkpoint_at is not None and swapped >= checkpoint_at:
            self.checkpoint_log(spec)
        return version

    def checkpoint_log(self, spec: TableSpec) -> None:
        """Write a checkpoint of the table's log at its newest version, then delete the log
        files past the table's log retention (`log_cleanup`). A crash before it costs only
        reading speed: the log stays whole without it.

        Written a batch of actions at a time from the newest checkpoint and the commits after it
        (`log_checkpoint`), so its memory does not grow with the table's files; where that
        writer declines, by delta-rs."""
        with reaching(self.root, self.storage_options, f"checkpointing table {spec.name}"):
            if not write_checkpoint(self.log(spec)):
                self.open(spec).create_checkpoint()
            clean_up_expired_logs(self.log(spec))
        # A checkpoint's batches are the largest buffers a stream's driver frees, and they grow
        # with the table's tombstones for `deletedFileRetentionDuration`. glibc keeps a freed
        # heap's high-water mark for the next allocation: without giving it back here, the
        # driver grew a few MiB at every checkpoint for as long as the tombstones grew (the
        # system pool's `release_unused` is glibc's `malloc_trim`).
        pa.default_memory_pool().release_unused()

    def _checkpoint_after_batch(self, spec: TableSpec, version: int) -> None:
        """Checkpoint the log every `delta.checkpointInterval` commits, as Delta writers do:
        without, every reader that opens the table (a restarting stream among them) replays
        each batch's commit since the last compaction's checkpoint, and the log is never
        cleaned up. In a thread of its own, beside the next batches: at a million settled files
        a checkpoint takes 20 s, which no batch should wait for. One at a time per table: one
        still running when the next is due leaves it to the interval after."""
        running = self._checkpointing.get(spec.name)
        if running is not None and running.is_alive():
            return
        thread = threading.Thread(
            target=self._checkpoint_in_background,
            args=(spec, version),
            name=f"checkpoint-{spec.name}",
            daemon=True,  # a checkpoint cut short is never moved into place
        )
        self._checkpointing[spec.name] = thread
        thread.start()

    def _checkpoint_in_background(self, spec: TableSpec, version: int) -> None:
        try:
            self.checkpoint_log(spec)
        except Exception:
            # No caller to raise to: the log stays whole without it, and the next interval
            # tries again.
            logger.exception("checkpointing %s after version %d failed", spec.name, version)

    def wait_for_checkpoints(self) -> None:
        """Wait for the log checkpoints being written beside the batches."""
        for thread in list(self._checkpointing.values()):
            thread.join()

    def log(self, spec: TableSpec) -> DeltaLog:
        """The table's log, one object per table (its S3 client made once)."""
        delta_log = self._logs.get(spec.name)
        if delta_log is None:
            delta_log = self._logs[spec.name] = DeltaLog(self.table_uri(spec), self.storage_options)
        return delta_log

    def settle_on_log(
        self,
        spec: TableSpec,
        checked_version: int,
        removed: list[LakeFile],
        settled: list[WrittenFile] | pa.Table,
        app_id: str,
        compaction_version: int,
        writer_epoch: int,
        before_commit: Callable[[], None] = lambda: None,
    ) -> int | None:
        """`settle`, checked against the commits after `checked_version` (a version holding
        `removed`, fenced with `writer_epoch`) instead of a loaded snapshot
        (`log_commits.commit_fenced`): what a sliced settle's commits cost stays one slice's
        files, whatever the table holds. Returns the version committed; None, committing
        nothing, if one of `removed` is gone or the table's metadata changed since."""
        swap = FencedCommit(
            removed=removed,
            added=settled,
            app_id=app_id,
            writer_epoch=writer_epoch,
            transaction=(compaction_app_id(app_id), compaction_version),
        )
        with reaching(self.root, self.storage_options, f"settling a slice of {spec.name}"):
            return commit_fenced(self.log(spec), checked_version, swap, before_commit)

    def replace_files(
        self,
        spec: TableSpec,
        removed: list[LakeFile],
        added: list[WrittenFile],
        transaction: Transaction,
        fence: tuple[str, int],
        data_change: bool,
        before_commit: Callable[[], None] = lambda: None,
    ) -> bool:
        """Remove `removed` and add `added` in one commit carrying `transaction`, on a snapshot
        fenced with `fence` (writer, epoch: `commits.check_fence`). Returns False, committing
        nothing, if one of `removed` is gone from the table already."""
        now_ms = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            RemoveAction(
                path=file.path,
                data_change=data_change,
                deletion_timestamp=now_ms,
                size=file.size,
                partition_values=file.partition_values,
            )
            for file in removed
        ]
        actions += add_actions(added, data_change)

        return self._fenced_commit(
            spec,
            actions,
            transaction,
            fence,
            f"replacing {len(removed)} files of table {spec.name}",
            lambda table: _holds_all(table, spec, removed),
            before_commit,
        )

    def _fenced_commit(
        self,
        spec: TableSpec,
        actions: list[AddAction | RemoveAction],
        transaction: Transaction,
        fence: tuple[str, int],
        doing: str,
        ready: Callable[[DeltaTable], bool],
        before_commit: Callable[[], None],
    ) -> bool:
        """Commit `actions` with `transaction`, conditionally on the snapshot checked: fenced
        with `fence` (writer, epoch: `commits.check_fence`) and `ready` for them (False: commit
        nothing, return False). `before_commit` runs after both checks, right before the commit.
        A commit that another beat is tried again on the newer version
        (`commits.commit_without_conflict`), checks included, on the table opened first brought
        up to date. Returns whether it committed."""
        table: DeltaTable | None = None

        def attempt() -> bool:
            nonlocal table
            if table is None:
                table = self.open(spec)
            else:
                # A retry only reads the commits that beat the last attempt: the batches that
                # commit beside a compaction would otherwise make it reopen the table each time.
                with reaching(self.root, self.storage_options, f"reading table {spec.name}"):
                    table.update_incremental()
            check_fence(table, *fence)
            if not ready(table):
                return False
            before_commit()
            with reaching(self.root, self.storage_options, doing):
                table.create_write_transaction(
                    actions,
                    mode="append",
                    schema=spec.storage_schema,
                    partition_by=list(spec.partition_by) or None,
                    commit_properties=conditional(transaction),
                )
            return True

        what = f"{self.table_uri(spec)}, {transaction.app_id} {transaction.version}"
        return commit_without_conflict(what, attempt)

    def tenant_files(self, spec: TableSpec, tenant: str) -> list[LakeFile]:
        """The current version's files that may hold rows of `tenant`: its partitions' and the
        staged ones its statistics do not rule out (`snapshot_reader.tenant_file_actions`)."""
        actions = tenant_file_actions(self.open(spec), tenant)
        partitions = [c for c in actions.column_names if c.startswith("partition.")]
        return [
            LakeFile(
                path=row["path"],
                size=row["size_bytes"],
                partition_values={
                    column.removeprefix("partition."): partition_text(row[column])
                    for column in partitions
                },
            )
            for row in actions.select(["path", "size_bytes", *partitions]).to_pylist()
        ]

    def staged_files(self, spec: TableSpec, stream: str | None = None) -> list[LakeFile]:
        """The staged files of the table's newest version, by path; with `stream`, those it
        wrote and those no stream's name marks (an outside `OPTIMIZE` merged staged files)."""
        return self.staged_listing(spec, stream).files

    def staged_listing(self, spec: TableSpec, stream: str | None = None) -> StagedListing:
        """`staged_files` with the version they were listed at, read from the log's
        checkpoint and later commits (`log_snapshot`), or, where that reader declines, from
        delta-rs."""
        column = spec.partition_by[0]
        with reaching(self.root, self.storage_options, f"listing table {spec.name}"):
            snapshot = partition_snapshot(self.log(spec), column, STAGED)
        if snapshot is None:
            return self._staged_listing_of_delta_rs(spec, stream)
        files = [
            LakeFile(
                path=file.path,
                size=file.size,
                partition_values={
                    name: file.partition_values.get(name) for name in spec.partition_by
                },
                staged_ms=_staged_ms(file.path, file.modification_time),
            )
            for file in snapshot.files
            if stream is None or stream_of_staged_file(file.path) in (stream, None)
        ]
        fence_epoch = None if stream is None else snapshot.transactions.get(fence_app_id(stream))
        return StagedListing(
            snapshot.version,
            files,
            fence_epoch,
            plain_writer(snapshot.writer_version, snapshot.writer_features),
        )

    def _staged_listing_of_delta_rs(self, spec: TableSpec, stream: str | None) -> StagedListing:
        table = self.open(spec)
        actions = pa.table(table.get_add_actions(flatten=True))
        column = f"partition.{spec.partition_by[0]}"
        rows = (
            actions.filter(pc.equal(actions[column], STAGED)).to_pylist()
            if actions.num_rows and column in actions.column_names
            else []
        )
        files = [
            LakeFile(
                path=row["path"],
                size=row["size_bytes"],
                partition_values={
                    name: partition_text(row[f"partition.{name}"]) for name in spec.partition_by
                },
                staged_ms=_staged_ms(row["path"], row["modification_time"]),
            )
            for row in rows
            if stream is None or stream_of_staged_file(row["path"]) in (stream, None)
        ]
        fence_epoch = None if stream is None else table.transaction_version(fence_app_id(stream))
        protocol = table.protocol()
        return StagedListing(
            table.version(),
            sorted(files, key=lambda file: file.path),
            fence_epoch,
            plain_writer(protocol.min_writer_version, protocol.writer_features),
        )


def _holds_all(table: DeltaTable, spec: TableSpec, files: list[LakeFile]) -> bool:
    """Whether the table's loaded version holds every one of `files`."""
    present = _present_paths(table, spec, files)
    return all(unquote(file.path) in present for file in files)


def _present_paths(table: DeltaTable, spec: TableSpec, files: list[LakeFile]) -> set[str]:
    """Which of the table's current files could be among `files`, by path: only the staged
    partition's, when they are all staged. A settle checks its staged files are still there
    before each commit, and a sliced one commits many times to a table of a million files: the
    staged partition's few paths cost nothing, the whole table's a second each."""
    column = spec.partition_by[0] if spec.partition_by else None
    if column is None or any(file.partition_values.get(column) != STAGED for file in files):
        return current_paths(table)
    folder = f"{column}={STAGED}/"
    return {
        unquote(uri[uri.index(folder) :])
        for uri in table.file_uris(file_pruning_predicate=[(column, "=", STAGED)])
    }


def add_actions(files: list[WrittenFile], data_change: bool) -> list[AddAction | RemoveAction]:
    """Delta `add` actions of files executors wrote."""
    return [
        AddAction(
            path=file.path,
            size=file.size,
            partition_values=file.partition_values,
            modification_time=file.modification_time,
            data_change=data_change,
            stats=file.stats,
        )
        for file in files
    ]


def _staged_ms(path: str, modification_time: int) -> int:
    """When the oldest row of a staged file was staged: a run's name says; a batch's file was
    written then; a file no stream named (an outside `OPTIMIZE` merged staged files) may hold
    rows of any age, so it counts as the oldest there can be."""
    oldest = run_oldest_ms(path)
    if oldest is not None:
        return oldest
    return modification_time if stream_of_staged_file(path) is not None else 0


@dataclass(frozen=True)
class LakeFile:
    """A data file of a table's current version, as a commit removes it."""

    path: str
    size: int
    partition_values: dict[str, str | None]
    staged_ms: int | None = None
    """A staged file's: when its oldest row was staged (epoch ms). None for other files."""


@dataclass(frozen=True)
class StagedListing:
    """A table's staged files as listed at one version, with what a swap of them checks."""

    version: int
    files: list[LakeFile]
    fence_epoch: int | None
    """The listing stream's fence at `version` (None: not fenced, or no stream named)."""
    plain_writer: bool
    """Whether the table's protocol lets a writer that knows only files commit to it."""


class LakeLayoutError(RuntimeError):
    """A table of the lake is laid out as an older release wrote it."""


def compaction_app_id(stream: str) -> str:
    return f"{stream}/compaction"


def _add_missing_columns(table: DeltaTable, spec: TableSpec) -> None:
    """Schema evolution for a table created before `spec` gained nullable columns at its end.

    Old rows read the new columns as null. Only added nullable columns are evolved; any other
    difference is left for the commit to refuse.
    """
    present = set(table.schema().to_arrow().names)
    missing = [field for field in spec.schema if field.name not in present and field.nullable]
    if missing:
        table.alter.add_columns([DeltaField.from_arrow(field) for field in missing])
