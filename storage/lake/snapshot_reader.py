"""Read a Delta table's snapshot into Arrow with pyarrow, from the file list delta-rs gives.

delta-rs's own readers (`to_pyarrow_table`, `to_pyarrow_dataset`, `to_pandas`) read through a
filesystem handler whose threads make a short-lived process abort at exit ("terminate called
without an active exception", exit code 134): 2 of 3 runs of `tenant-windows status` here. The
driver-side reads (status, offboarding, the notification outbox, the writer lease) therefore
take only the file list from delta-rs and read the files with pyarrow's own filesystem, the one
the executors write with.

The partition columns come from the table's own metadata, not from this release's spec: a lake
written before the staged layout (partitioned by `tenant` itself) reads the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable

from storage.lake.lake_filesystem import filesystem_of
from storage.lake.tables import LAYOUT_PREFIX, STAGED

PartitionFilter = list[tuple[str, str, str | None]]
"""delta-rs partition filters, e.g. `[("tenant", "=", "acme")]`: whole files are skipped."""


def read_snapshot(
    table: DeltaTable,
    schema: pa.Schema,
    storage_options: Mapping[str, str] | None,
    columns: Sequence[str] | None = None,
    row_filter: ds.Expression | None = None,
    partitions: PartitionFilter | None = None,
    files: Sequence[str] | None = None,
) -> pa.Table:
    """The rows of `table`'s loaded version, in `schema` (a column a file lacks reads as null);
    `files` (URIs of the version) reads only those."""
    if files is None:
        files = table.file_uris(file_pruning_predicate=partitions)
    return read_files(
        table.table_uri,
        partition_columns(table),
        files,
        schema,
        storage_options,
        columns,
        row_filter,
    )


def read_files(
    table_uri: str,
    partition_schema: pa.Schema,
    files: Sequence[str],
    schema: pa.Schema,
    storage_options: Mapping[str, str] | None,
    columns: Sequence[str] | None = None,
    row_filter: ds.Expression | None = None,
) -> pa.Table:
    """The rows of `files` (URIs) of the table at `table_uri`, in `schema`; the partition
    columns are read from the files' Hive-style folder names."""
    filesystem, _ = filesystem_of(table_uri, storage_options)
    dataset = ds.dataset(
        [filesystem_path(uri) for uri in files],
        schema=pa.schema([*schema, *(f for f in partition_schema if f.name not in schema.names)]),
        format="parquet",
        filesystem=filesystem,
        partitioning=ds.partitioning(partition_schema, flavor="hive"),
        partition_base_dir=filesystem_path(table_uri).rstrip("/"),
    )
    wanted = list(schema.names if columns is None else columns)
    try:
        return dataset.to_table(columns=wanted, filter=row_filter)
    except pa.ArrowNotImplementedError:
        if row_filter is None:
            raise
        # Files delta-rs rewrote (`tenants purge` deletes rows with it) hold strings as
        # string_view, and pyarrow compares the filter's strings with them before it casts to
        # `schema`: read the rows cast, then filter.
        named = _fields_of(row_filter, dataset.schema)
        read = dataset.to_table(columns=sorted(set(wanted) | named))
        return read.filter(row_filter).select(wanted)


def _fields_of(row_filter: ds.Expression, schema: pa.Schema) -> set[str]:
    """The columns of `schema` whose names appear in `row_filter`'s text: every column it
    reads, and perhaps a few more (a name inside another), which only costs their read."""
    text = str(row_filter)
    return {name for name in schema.names if name in text}


def partition_columns(table: DeltaTable) -> pa.Schema:
    """The partition columns of the table as its metadata declares them, with their types."""
    stored = pa.schema(table.schema().to_arrow())
    return pa.schema([stored.field(name) for name in table.metadata().partition_columns])


def filesystem_path(uri: str) -> str:
    """What pyarrow's filesystems take: a local path, or `bucket/key` for S3."""
    for scheme in ("file://", "s3://", "s3a://"):
        if uri.startswith(scheme):
            return uri.removeprefix(scheme)
    return uri


def current_paths(table: DeltaTable) -> set[str]:
    """The loaded version's data files, relative to the table, as the file system names them
    (Delta's log percent-encodes special characters)."""
    return {unquote(path) for path in pa.table(table.get_add_actions())["path"].to_pylist()}


def tenant_file_actions(table: DeltaTable, tenant: str) -> pa.Table:
    """The add actions (flattened) of the loaded version's files that may hold rows of `tenant`:
    in a table partitioned by tenant, its own partition's files; in the staged layout, those
    plus the staged files; in either, minus every file whose `tenant` statistics rule the
    tenant out."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return actions
    keep = pa.array([True] * actions.num_rows)
    for column, allowed in (("tenant", [tenant]), (f"{LAYOUT_PREFIX}tenant", [tenant, STAGED])):
        if f"partition.{column}" in actions.column_names:
            keep = pc.and_(keep, pc.is_in(actions[f"partition.{column}"], pa.array(allowed)))
    if "min.tenant" in actions.column_names:
        within = pc.and_(
            pc.less_equal(actions["min.tenant"], tenant),
            pc.greater_equal(actions["max.tenant"], tenant),
        )
        keep = pc.and_(keep, _or_unknown(within))
    return actions.filter(keep)


def batch_files(table: DeltaTable, after: int, through: int) -> list[str]:
    """URIs of the loaded version's files that may hold rows of batches (after, through], by
    their `batch_id` statistics: a poll for new rows opens the newest files, not all of them."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return []
    if "min.batch_id" not in actions.column_names:
        return table.file_uris()
    overlaps = pc.and_(
        pc.greater(actions["max.batch_id"], after),
        pc.less_equal(actions["min.batch_id"], through),
    )
    return _uris(table, actions, _or_unknown(overlaps))


def read_newest_first(
    table: DeltaTable,
    schema: pa.Schema,
    storage_options: Mapping[str, str] | None,
    columns: Sequence[str],
    enough: Callable[[pa.Table, int], bool],
    files_per_read: int = 64,
) -> pa.Table:
    """The rows of the loaded version's newest files (by their `batch_id` statistics), read a
    group of files at a time until `enough(rows, unread_batch_id)` says the rows read so far
    suffice, `unread_batch_id` being the highest `batch_id` a file not read yet may hold; or
    until all are read.

    For "the latest row per key" in an append-only history: once each key's newest row read is
    at least as new as anything left, the read stops at the history's recent end. A packed file
    (`optimize`, compaction) spans many batches, so having seen a key is not enough: an older
    row of it may have been read from a packed file while a file left holds a newer one.
    """
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return read_snapshot(table, schema, storage_options, columns, files=[])
    if "max.batch_id" not in actions.column_names:
        return read_snapshot(table, schema, storage_options, columns)
    # Files without statistics sort last and may hold any batch: no read stops before them.
    actions = actions.sort_by([("max.batch_id", "descending")])
    newest = actions["max.batch_id"].to_pylist()
    by_path = {_relative(uri, table.table_uri): uri for uri in table.file_uris()}
    uris = [by_path[unquote(path)] for path in actions["path"].to_pylist()]
    parts = []
    for first in range(0, len(uris), files_per_read):
        chunk = uris[first : first + files_per_read]
        parts.append(read_snapshot(table, schema, storage_options, columns, files=chunk))
        rows = pa.concat_tables(parts)
        unread = newest[first + files_per_read :]
        if unread and None not in unread and enough(rows, unread[0]):
            return rows
    return pa.concat_tables(parts)


def _or_unknown(condition: pa.ChunkedArray) -> pa.ChunkedArray:
    # A file without statistics may hold anything: it is kept.
    return pc.fill_null(condition, True)


def _uris(table: DeltaTable, actions: pa.Table, keep: pa.ChunkedArray | pa.Array) -> list[str]:
    kept_actions = actions.filter(keep)
    kept = {unquote(path) for path in kept_actions["path"].to_pylist()}
    return [
        uri for uri in _uris_around(table, kept_actions) if _relative(uri, table.table_uri) in kept
    ]


# Past this many partitions a pruning predicate costs more than it saves.
_MAX_PRUNED_PARTITIONS = 1_000


def _uris_around(table: DeltaTable, actions: pa.Table) -> list[str]:
    """URIs of the loaded version that include those of `actions`' files: only the partitions
    (by the first partition column) they lie in, chosen by delta-rs, when they are few. With a
    file per tenant, matching every URI of the table in Python would cost a second at 100,000
    tenants for a statement that reads one tenant's few files."""
    column = next((c for c in actions.column_names if c.startswith("partition.")), None)
    if column is None or actions.num_rows == 0:
        return table.file_uris() if actions.num_rows else []
    values = pc.unique(actions[column])
    if values.null_count or len(values) > _MAX_PRUNED_PARTITIONS:
        return table.file_uris()
    name = column.removeprefix("partition.")
    return table.file_uris(file_pruning_predicate=[(name, "in", values.to_pylist())])


def _relative(uri: str, table_uri: str) -> str:
    return unquote(filesystem_path(uri)).removeprefix(
        unquote(filesystem_path(table_uri)).rstrip("/") + "/"
    )
