"""A table's data files at one version, by tenant: built once from a snapshot, then moved forward
one commit at a time.

A reader that answers one tenant's statements needs that tenant's files only. delta-rs gives
them by materialising every file of the version first: at 100,000 tenants a table holds a file
per tenant, and loading a version after a compaction (200,000 `add`s) took over a second of a
query that reads a few kilobytes. `TableFiles` keeps the files indexed by the tenant whose
partition holds them, and `advanced` applies the log's new commits to it: a batch's commit
costs its own few actions, a compaction's its own swap, and a tenant's lookup a dictionary's.

Only `add` and `remove` actions move files. A commit the index cannot follow (new metadata,
which may re-partition the table, a deletion vector, a `remove` that does not name its
partition) makes `advanced` return None: the caller loads the version from delta-rs
(`of_table`) instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple
from urllib.parse import unquote

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from storage.lake.checkpoint_tenants import NO_TENANT, row_groups_holding
from storage.lake.delta_log import Action, DeltaLog
from storage.lake.snapshot_reader import partition_columns, tenant_file_actions
from storage.lake.tables import STAGED, tenant_partition_column


@dataclass(frozen=True)
class DataFile:
    uri: str
    size: int
    min_tenant: str | None = None
    max_tenant: str | None = None
    """The file's `tenant` statistics; None: unknown, so it may hold any tenant."""

    def may_hold(self, tenant: str) -> bool:
        if self.min_tenant is None or self.max_tenant is None:
            return True
        return self.min_tenant <= tenant <= self.max_tenant


@dataclass(frozen=True)
class OpenedCheckpoint:
    """A checkpoint file with its footer and its table's partitioning read: what every reader of
    one tenant's files in it needs first, once (its `metaData` column spans the whole file)."""

    table_uri: str
    version: int
    file: pq.ParquetFile
    partition_columns: tuple[str, ...]

    @classmethod
    def open(cls, delta_log: DeltaLog, version: int) -> OpenedCheckpoint | None:
        """None if it does not hold exactly one `metaData`."""
        checkpoint = delta_log.open_checkpoint(version)
        metadata = checkpoint.read(columns=["metaData"]).column("metaData").drop_null()
        if len(metadata) != 1:
            return None
        partition_columns = tuple(metadata[0]["partitionColumns"].as_py())
        return cls(delta_log.table_uri, version, checkpoint, partition_columns)


MAX_COMMITS_PER_ADVANCE = 1_000
"""A reader far behind catches up over several calls, each one a bounded read."""

_Files = Mapping[str, DataFile]
"""By path relative to the table, as the file system names it (the log percent-encodes it)."""


@dataclass(frozen=True)
class TableFiles:
    table_uri: str
    version: int
    partition_schema: pa.Schema
    tenant_column: str | None
    """The partition column whose value is a file's tenant; None: files are not by tenant."""
    by_tenant: Mapping[str, _Files]
    """Each tenant's files in its own partition."""
    shared: _Files
    """Every other file: staged ones, holding many tenants' rows, or all of an unpartitioned
    table's."""
    only_tenant: str | None = None
    """Set: the index holds this tenant's files only (and the shared ones), as a one-off
    reader of one tenant needs; it answers for no other."""

    @classmethod
    def of_table(cls, table: DeltaTable, only_tenant: str | None = None) -> TableFiles:
        """The files of `table`'s loaded version; with `only_tenant`, that tenant's only."""
        partitions = partition_columns(table)
        tenant_column = tenant_partition_column(partitions.names)
        actions = (
            pa.table(table.get_add_actions(flatten=True))
            if only_tenant is None
            # Filtered as Arrow: a one-off reader pays nothing per other tenant's file.
            else tenant_file_actions(table, only_tenant)
        )
        paths = actions["path"].to_pylist()
        sizes = actions["size_bytes"].to_pylist()
        lows, highs = (_column(actions, f"{end}.tenant") for end in ("min", "max"))
        owners = (
            actions[f"partition.{tenant_column}"].to_pylist()
            if tenant_column is not None
            else [None] * actions.num_rows
        )
        index = _Index(table.table_uri, only_tenant)
        for row, owner in enumerate(owners):
            tenant = _owner(owner)
            shared = tenant is None  # only a shared file's statistics are looked at
            index.add(
                paths[row],
                int(sizes[row]),
                tenant,
                lows[row] if shared else None,
                highs[row] if shared else None,
            )
        return index.frozen(table.version(), partitions, tenant_column)

    @classmethod
    def of_log(
        cls,
        table_uri: str,
        storage_schema: pa.Schema,
        storage_options: Mapping[str, str] | None,
        only_tenant: str | None = None,
    ) -> TableFiles | None:
        """The files at the table's newest version (with `only_tenant`, that tenant's and the
        staged ones that may hold its rows), read from the log's newest checkpoint
        (`of_checkpoint`) and the commits after it, without delta-rs. None where this reader
        cannot (see `of_checkpoint`, and a later commit it cannot follow): the caller loads the
        version with delta-rs (`of_table`)."""
        delta_log = DeltaLog(table_uri, storage_options)
        version = delta_log.checkpointed_version()
        if version is None or version < 0:
            return None
        opened = OpenedCheckpoint.open(delta_log, version)
        files = None if opened is None else cls.of_checkpoint(opened, storage_schema, only_tenant)
        for _ in range(MAX_COMMITS_PER_ADVANCE):
            if files is None:
                return None
            newer = files.advanced(storage_options)
            if newer is files:
                return files
            files = newer
        return files

    @classmethod
    def of_checkpoint(
        cls, opened: OpenedCheckpoint, storage_schema: pa.Schema, only_tenant: str | None = None
    ) -> TableFiles | None:
        """The files of the `opened` checkpoint (with `only_tenant`, as for `of_log`): a reader
        pays for the checkpoint's path, size and partition columns only, not for
        materialising every file of a table of a million tenants with its statistics, and a
        reader of one tenant reads the row groups that may hold it (`checkpoint_tenants`).
        None for a checkpoint this reader cannot read (deletion vectors, a partition column
        the table's schema lacks)."""
        checkpoint, partition_names = opened.file, opened.partition_columns
        if any(name not in storage_schema.names for name in partition_names):
            return None
        partitions = pa.schema([storage_schema.field(name) for name in partition_names])
        tenant_column = tenant_partition_column(partition_names)
        row_groups = (
            None
            if tenant_column is None or only_tenant is None
            else row_groups_holding(checkpoint, tenant_column, (only_tenant, STAGED, NO_TENANT))
        )
        adds = _checkpoint_adds(checkpoint, row_groups)
        if adds is None:
            return None
        paths, sizes, values = adds
        rows: list[int] | range = range(len(paths))
        owners: list[str | None] = [None] * len(paths)
        if tenant_column is not None:
            owner_column = pc.map_lookup(values, pa.scalar(tenant_column), "first")
            if only_tenant is not None:
                mine = pc.is_in(owner_column, pa.array([only_tenant, STAGED]))
                kept = pc.indices_nonzero(pc.fill_null(mine, False))
                rows = kept.to_pylist()
                owner_column, paths, sizes = (
                    column.take(kept) for column in (owner_column, paths, sizes)
                )
            owners = [_owner(value) for value in owner_column.to_pylist()]
        shared = [row for row, owner in zip(rows, owners, strict=True) if owner is None]
        stats = _staged_stats(checkpoint, row_groups, shared)
        index = _Index(opened.table_uri, only_tenant)
        for row, path, size, owner in zip(
            rows, paths.to_pylist(), sizes.to_pylist(), owners, strict=True
        ):
            low, high = stats.get(row, (None, None))
            index.add(path, size, owner, low, high)
        return index.frozen(opened.version, partitions, tenant_column)

    def files_of(self, tenant: str | None) -> dict[str, int]:
        """URIs of the files that may hold `tenant`'s rows (None: every file), with their sizes
        as stored: its own partition's, and the shared files its statistics do not rule out."""
        if tenant != self.only_tenant and self.only_tenant is not None:
            raise ValueError(f"these files are {self.only_tenant!r}'s only, not {tenant!r}'s")
        if tenant is None:
            every = [*self.shared.values()]
            for files in self.by_tenant.values():
                every.extend(files.values())
            return {file.uri: file.size for file in every}
        own = self.by_tenant.get(tenant, {})
        shared = (file for file in self.shared.values() if file.may_hold(tenant))
        return {file.uri: file.size for file in (*own.values(), *shared)}

    def advanced(self, storage_options: Mapping[str, str] | None) -> TableFiles | None:
        """This table at a newer version, from the commits after this one (at most
        `MAX_COMMITS_PER_ADVANCE`; self when there are none); None when a commit cannot be
        followed (see the module's doc). A commit is read a line (an action) at a time: a
        compaction's swap at a million keys is a 1.5 GB commit."""
        delta_log = DeltaLog(self.table_uri, storage_options)
        index = _Index(self.table_uri, self.only_tenant, self.by_tenant, self.shared)
        version = self.version
        for _ in range(MAX_COMMITS_PER_ADVANCE):
            actions = delta_log.actions(version + 1)
            if actions is None:
                break
            changes = file_changes(actions, self.tenant_column)
            if changes is None:
                return None
            index.apply(changes)
            version += 1
        if version == self.version:
            return self
        return index.frozen(version, self.partition_schema, self.tenant_column)

    def changed(self, version: int, changes: Iterable[FileChange]) -> TableFiles:
        """This table at `version`, the commits after this one making `changes` (in order)."""
        index = _Index(self.table_uri, self.only_tenant, self.by_tenant, self.shared)
        index.apply(changes)
        return index.frozen(version, self.partition_schema, self.tenant_column)


class FileChange(NamedTuple):
    """A file a commit added to or removed from the table, as the index needs it."""

    added: bool
    path: str
    tenant: str | None
    """The tenant whose partition holds it; None: a shared file."""
    size: int = 0
    low: str | None = None
    """A shared file's `tenant` statistics (None: unknown, so it may hold any tenant)."""
    high: str | None = None


def file_changes(actions: Iterable[Action], tenant_column: str | None) -> list[FileChange] | None:
    """The files a commit's actions add and remove; None if one of them is a change the index
    cannot follow: new metadata (which may re-partition the table), a deletion vector, a
    `remove` that does not name its partition (Delta makes that optional; which tenant's files
    held it is then unknown)."""
    changes = []
    for action in actions:
        if "metaData" in action:
            return None
        if (removed := action.get("remove")) is not None:
            unplaced = tenant_column is not None and not removed.get("partitionValues")
            if removed.get("deletionVector") or unplaced:
                return None
            changes.append(FileChange(False, removed["path"], _tenant(removed, tenant_column)))
        elif (added := action.get("add")) is not None:
            if added.get("deletionVector"):
                return None
            tenant = _tenant(added, tenant_column)
            low, high = _tenant_stats(added) if tenant is None else (None, None)
            changes.append(FileChange(True, added["path"], tenant, int(added["size"]), low, high))
    return changes


class _Index:
    """`TableFiles`' mappings while they change: copied on the first change of each, so the
    version it started from is left as it was."""

    def __init__(
        self,
        table_uri: str,
        only_tenant: str | None,
        by_tenant: Mapping[str, _Files] | None = None,
        shared: _Files | None = None,
    ) -> None:
        self._table_uri = table_uri
        # URIs as delta-rs' `file_uris` names them: a local table's as plain paths.
        self._root = table_uri.rstrip("/").removeprefix("file://")
        self._only_tenant = only_tenant
        self._by_tenant: dict[str, _Files] = dict(by_tenant or {})
        self._shared: dict[str, DataFile] = dict(shared or {})
        self._changed: dict[str, dict[str, DataFile]] = {}

    def add(
        self, path: str, size: int, tenant: str | None, low: str | None, high: str | None
    ) -> None:
        if tenant is not None and self._only_tenant not in (None, tenant):
            return
        relative = unquote(path)
        self._files(tenant)[relative] = DataFile(f"{self._root}/{relative}", size, low, high)

    def remove(self, path: str, tenant: str | None) -> None:
        if tenant is not None and self._only_tenant not in (None, tenant):
            return
        self._files(tenant).pop(unquote(path), None)
        if tenant is not None and not self._changed[tenant]:
            del self._by_tenant[tenant], self._changed[tenant]

    def apply(self, changes: Iterable[FileChange]) -> None:
        for change in changes:
            if change.added:
                self.add(change.path, change.size, change.tenant, change.low, change.high)
            else:
                self.remove(change.path, change.tenant)

    def _files(self, tenant: str | None) -> dict[str, DataFile]:
        if tenant is None:
            return self._shared
        files = self._changed.get(tenant)
        if files is None:
            files = self._changed[tenant] = dict(self._by_tenant.get(tenant, {}))
            self._by_tenant[tenant] = files
        return files

    def frozen(
        self, version: int, partition_schema: pa.Schema, tenant_column: str | None
    ) -> TableFiles:
        return TableFiles(
            table_uri=self._table_uri,
            version=version,
            partition_schema=partition_schema,
            tenant_column=tenant_column,
            by_tenant=MappingProxyType(self._by_tenant),
            shared=MappingProxyType(self._shared),
            only_tenant=self._only_tenant,
        )


def _checkpoint_adds(
    checkpoint: pq.ParquetFile, row_groups: Sequence[int] | None
) -> tuple[pa.ChunkedArray, pa.ChunkedArray, pa.ChunkedArray] | None:
    """The live files of the checkpoint's `row_groups` (None: all): paths, sizes and partition
    values (None: one with deletion vectors, which this reader does not apply)."""
    columns = ["add.path", "add.size", "add.partitionValues", "add.deletionVector.storageType"]
    adds = pc.drop_null(_read(checkpoint, row_groups, columns).column("add"))
    if len(adds) and pc.any(pc.is_valid(pc.struct_field(adds, "deletionVector"))).as_py():
        return None
    return (
        pc.struct_field(adds, "path"),
        pc.struct_field(adds, "size"),
        pc.struct_field(adds, "partitionValues"),
    )


def _staged_stats(
    checkpoint: pq.ParquetFile, row_groups: Sequence[int] | None, rows: list[int]
) -> dict[int, tuple[str | None, str | None]]:
    """The `tenant` statistics of the live files at `rows` (positions among the `add` actions
    of `row_groups`): read only where there are such files, the staged ones."""
    if not rows:
        return {}
    adds = pc.drop_null(_read(checkpoint, row_groups, ["add.stats"]).column("add"))
    texts = pc.struct_field(adds, "stats")
    return {row: _tenant_stats({"stats": texts[row].as_py()}) for row in rows}


def _read(
    checkpoint: pq.ParquetFile, row_groups: Sequence[int] | None, columns: list[str]
) -> pa.Table:
    if row_groups is None:
        return checkpoint.read(columns=columns)
    return checkpoint.read_row_groups(row_groups, columns=columns)


def _tenant(action: Mapping[str, Any], tenant_column: str | None) -> str | None:
    """The tenant whose partition holds the action's file; None: a shared file."""
    if tenant_column is None:
        return None
    return _owner((action.get("partitionValues") or {}).get(tenant_column))


def _owner(partition_value: Any) -> str | None:
    if partition_value is None or partition_value == STAGED:
        return None
    return str(partition_value)


def _tenant_stats(added: Mapping[str, Any]) -> tuple[str | None, str | None]:
    stats = added.get("stats")
    if not stats:
        return None, None
    parsed = orjson.loads(stats)
    return (
        (parsed.get("minValues") or {}).get("tenant"),
        (parsed.get("maxValues") or {}).get("tenant"),
    )


def _column(actions: pa.Table, name: str) -> list[str | None]:
    """A statistics column as text (None where a file has none, or no file has it)."""
    if name not in actions.column_names:
        return [None] * actions.num_rows
    return [None if value is None else str(value) for value in actions[name].to_pylist()]


def tenant_files(table: DeltaTable, tenant: str) -> list[str]:
    """URIs of the loaded version's files that may hold rows of `tenant`
    (`snapshot_reader.tenant_file_actions`)."""
    return list(TableFiles.of_table(table, only_tenant=tenant).files_of(tenant))
