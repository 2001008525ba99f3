"""The Delta tables under one lake root, written with delta-rs (no JVM, no Delta jars).

Each append carries the Delta transaction id (app_id = stream name, version = batch id) in the
same atomic commit as its data, so "was batch N committed to table T?" has an exact answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable, Transaction
from deltalake.schema import Field as DeltaField
from deltalake.transaction import AddAction, RemoveAction

from storage.commits import check_fence, commit_without_conflict, conditional
from storage.data_files import WrittenFile
from storage.s3 import reaching, storage_options
from storage.snapshot_reader import read_snapshot
from storage.tables import LAKE_TABLES, TableSpec
from tenants.settings import LakeSettings


@dataclass(frozen=True)
class TableMaintenance:
    files_removed: int
    files_added: int
    version: int


class DeltaLake:
    def __init__(self, root: str, storage_options: dict[str, str] | None = None) -> None:
        self.root = root.rstrip("/")
        self.storage_options = storage_options

    def __repr__(self) -> str:
        # storage_options may hold S3 keys: never print them.
        return f"DeltaLake({self.root!r})"

    @classmethod
    def from_settings(cls, lake: LakeSettings) -> DeltaLake:
        return cls(lake.root, storage_options(lake))

    @property
    def is_local(self) -> bool:
        return "://" not in self.root or self.root.startswith("file://")

    def table_uri(self, spec: TableSpec) -> str:
        return f"{self.root}/{spec.name}"

    def ensure_tables(self) -> None:
        """Create every table that does not exist yet, so readers always find all of them, and
        add the columns a table created by an older release lacks."""
        for spec in LAKE_TABLES:
            with reaching(self.root, self.storage_options, f"creating table {spec.name}"):
                table = DeltaTable.create(
                    self.table_uri(spec),
                    spec.schema,
                    mode="ignore",
                    partition_by=list(spec.partition_by),
                    storage_options=self.storage_options,
                )
                _add_missing_columns(table, spec)

    def open(self, spec: TableSpec) -> DeltaTable:
        with reaching(self.root, self.storage_options, f"opening table {spec.name}"):
            return DeltaTable(self.table_uri(spec), storage_options=self.storage_options)

    def read_arrow(
        self,
        spec: TableSpec,
        columns: list[str] | None = None,
        row_filter: ds.Expression | None = None,
    ) -> pa.Table:
        """The table's current rows (`columns` of those matching `row_filter`), read by pyarrow
        from the snapshot's files (`storage.snapshot_reader` says why not by delta-rs)."""
        with reaching(self.root, self.storage_options, f"reading table {spec.name}"):
            return read_snapshot(
                self.open(spec),
                spec.schema,
                spec.partition_by,
                self.storage_options,
                columns,
                row_filter,
            )

    def committed_batch(self, spec: TableSpec, app_id: str) -> int | None:
        """The highest batch id `app_id` has committed to the table, if any."""
        return self.open(spec).transaction_version(app_id)

    def vacuum(self, retention_ms: int, dry_run: bool) -> dict[str, list[str]]:
        """Delete files no table version within `retention_ms` references, per table.

        That covers the files a crashed attempt wrote but never committed, and the files of
        old versions; committed data of the current version is never touched. delta-rs counts
        retention in hours, so it is rounded up to whole hours.
        """
        return {
            spec.name: self.open(spec).vacuum(
                retention_hours=-(-retention_ms // 3_600_000),
                dry_run=dry_run,
                # The retention check refuses less than a week; the operator chose the window.
                enforce_retention_duration=False,
                # Also files no commit ever referenced, not only those removed by a commit.
                full=True,
            )
            for spec in LAKE_TABLES
        }

    def optimize(self, target_file_bytes: int | None = None) -> dict[str, TableMaintenance]:
        """Compact each table's small files and write a log checkpoint, per table.

        Executors write a file per partition and task each batch, so at thousands of tenants a
        table gathers thousands of small files; readers then pay per file. Compaction rewrites
        them into files of about `target_file_bytes` (delta-rs's default when None); the
        checkpoint keeps opening a table fast as its log grows. Data is unchanged: the commits
        carry `dataChange = false`, and the stream's own commits retry around them.
        """
        done = {}
        for spec in LAKE_TABLES:
            with reaching(self.root, self.storage_options, f"optimizing table {spec.name}"):
                table = self.open(spec)
                metrics = table.optimize.compact(target_size=target_file_bytes)
                table.create_checkpoint()
            done[spec.name] = TableMaintenance(
                files_removed=int(metrics.get("numFilesRemoved", 0)),
                files_added=int(metrics.get("numFilesAdded", 0)),
                version=table.version(),
            )
        return done

    def commit_files(
        self,
        spec: TableSpec,
        files: list[WrittenFile],
        app_id: str,
        batch_id: int,
        writer_epoch: int,
        before_commit: Callable[[], None] = lambda: None,
    ) -> bool:
        """Commit `files` (written by executors) as batch `batch_id` of `app_id`, in one commit,
        unless the table already holds that batch.

        Only while the table is fenced with `writer_epoch` (see `storage.writer_lease`): the check
        and the commit use one snapshot, and the commit fails if anything landed after it, so a
        newer instance's fence can never be slipped past. `before_commit` runs after those checks,
        right before the commit. Returns whether it committed.
        """
        actions: list[AddAction | RemoveAction] = [
            AddAction(
                path=file.path,
                size=file.size,
                partition_values=file.partition_values,
                modification_time=file.modification_time,
                data_change=True,
                stats=file.stats,
            )
            for file in files
        ]

        def attempt() -> bool:
            table = self.open(spec)
            check_fence(table, app_id, writer_epoch)
            committed = table.transaction_version(app_id)
            if committed is not None and committed >= batch_id:
                return False
            before_commit()
            doing = f"committing batch {batch_id} to table {spec.name}"
            with reaching(self.root, self.storage_options, doing):
                table.create_write_transaction(
                    actions,
                    mode="append",
                    schema=spec.schema,
                    partition_by=list(spec.partition_by) or None,
                    commit_properties=conditional(Transaction(app_id=app_id, version=batch_id)),
                )
            return True

        return commit_without_conflict(f"{self.table_uri(spec)}, batch {batch_id}", attempt)


def _add_missing_columns(table: DeltaTable, spec: TableSpec) -> None:
    """Schema evolution for a table created before `spec` gained nullable columns at its end.

    Old rows read the new columns as null. Only added nullable columns are evolved; any other
    difference is left for the commit to refuse.
    """
    present = set(table.schema().to_arrow().names)
    missing = [field for field in spec.schema if field.name not in present and field.nullable]
    if missing:
        table.alter.add_columns([DeltaField.from_arrow(field) for field in missing])
