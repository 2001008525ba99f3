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

from collections.abc import Mapping, Sequence
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable

from storage.data_files import filesystem_of
from storage.tables import LAYOUT_PREFIX, STAGED

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
    filesystem, _ = filesystem_of(table.table_uri, storage_options)
    if files is None:
        files = table.file_uris(file_pruning_predicate=partitions)
    partition_schema = partition_columns(table)
    dataset = ds.dataset(
        [filesystem_path(uri) for uri in files],
        schema=pa.schema([*schema, *(f for f in partition_schema if f.name not in schema.names)]),
        format="parquet",
        filesystem=filesystem,
        partitioning=ds.partitioning(partition_schema, flavor="hive"),
        partition_base_dir=filesystem_path(table.table_uri).rstrip("/"),
    )
    return dataset.to_table(
        columns=list(schema.names if columns is None else columns), filter=row_filter
    )


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


def tenant_files(table: DeltaTable, tenant: str) -> list[str]:
    """URIs of the loaded version's files that may hold rows of `tenant`: in a table partitioned
    by tenant, its own partition's files; in the staged layout, those plus the staged files; in
    either, minus every file whose `tenant` statistics rule the tenant out."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return []
    keep = pa.array([True] * actions.num_rows)
    for column, allowed in (("tenant", [tenant]), (f"{LAYOUT_PREFIX}tenant", [tenant, STAGED])):
        if f"partition.{column}" in actions.column_names:
            keep = pc.and_(keep, pc.is_in(actions[f"partition.{column}"], pa.array(allowed)))
    if "min.tenant" in actions.column_names:
        # A file without statistics may hold anyone's rows: it is kept.
        low, high = actions["min.tenant"], actions["max.tenant"]
        within = pc.and_(pc.less_equal(low, tenant), pc.greater_equal(high, tenant))
        keep = pc.and_(keep, pc.fill_null(within, True))
    kept = {unquote(path) for path in actions.filter(keep)["path"].to_pylist()}
    return [uri for uri in table.file_uris() if _relative(uri, table.table_uri) in kept]


def _relative(uri: str, table_uri: str) -> str:
    return unquote(filesystem_path(uri)).removeprefix(
        unquote(filesystem_path(table_uri)).rstrip("/") + "/"
    )
