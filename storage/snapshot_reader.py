"""Read a Delta table's snapshot into Arrow with pyarrow, from the file list delta-rs gives.

delta-rs's own readers (`to_pyarrow_table`, `to_pyarrow_dataset`, `to_pandas`) read through a
filesystem handler whose threads make a short-lived process abort at exit ("terminate called
without an active exception", exit code 134): 2 of 3 runs of `tenant-windows status` here. The
driver-side reads (status, offboarding, the notification outbox, the writer lease) therefore
take only the file list from delta-rs and read the files with pyarrow's own filesystem, the one
the executors write with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable

from storage.data_files import filesystem_of

PartitionFilter = list[tuple[str, str, str | None]]
"""delta-rs partition filters, e.g. `[("tenant", "=", "acme")]`: whole files are skipped."""


def read_snapshot(
    table: DeltaTable,
    schema: pa.Schema,
    partition_by: Sequence[str],
    storage_options: Mapping[str, str] | None,
    columns: Sequence[str] | None = None,
    row_filter: ds.Expression | None = None,
    partitions: PartitionFilter | None = None,
) -> pa.Table:
    """The rows of `table`'s loaded version, in `schema` (a column a file lacks reads as null)."""
    filesystem, _ = filesystem_of(table.table_uri, storage_options)
    files = [_path(uri) for uri in table.file_uris(file_pruning_predicate=partitions)]
    dataset = ds.dataset(
        files,
        schema=schema,
        format="parquet",
        filesystem=filesystem,
        partitioning=ds.partitioning(
            pa.schema([schema.field(name) for name in partition_by]), flavor="hive"
        ),
        partition_base_dir=_path(table.table_uri).rstrip("/"),
    )
    return dataset.to_table(columns=None if columns is None else list(columns), filter=row_filter)


def _path(uri: str) -> str:
    # pyarrow's filesystems take paths: a local path, or "bucket/key" for S3.
    for scheme in ("file://", "s3://", "s3a://"):
        if uri.startswith(scheme):
            return uri.removeprefix(scheme)
    return uri
