"""A checkpoint's row groups by tenant, so that a reader of one tenant reads a few of them.

At a million tenants a table's checkpoint holds a million `add` rows, and finding one tenant's
files read all of them (a second). The checkpoint writer sorts its rows by the tenant partition
value a run of rows at a time, writes each run in small row groups, and records each row
group's range of tenants in the file's key-value metadata. A reader of one tenant then reads
the row groups whose range holds that tenant, a few per run.

The ranges are computed from the rows written, under the partition column they name: a reader
uses them only where the checkpoint's own metadata partitions by that column, and reads every
row group of a checkpoint without them (one delta-rs wrote). Other readers (delta-rs, Spark)
ignore key-value metadata they do not know, and a checkpoint's rows are a set: their order
means nothing to them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SORTED_RUN_ROWS = 200_000
"""Rows sorted together: the memory a run takes, and a reader's row groups per million rows
(a tenant's rows lie in about one row group per run)."""
ROW_GROUP_ROWS = 4_096
"""Rows a row group holds: what a reader of one tenant reads per run."""
RANGES_KEY = b"tenant_windows.tenant_ranges"
"""Key-value metadata: `{"column": name, "row_groups": [[first, last] or null, ...]}`, null for
a row group without `add` rows."""
NO_TENANT = ""
"""The sort value of an `add` without a tenant value: inside the ranges, before every id."""


def sorted_row_groups(
    table: pa.Table, tenant_column: str
) -> Iterator[tuple[pa.Table, list[str] | None]]:
    """`table`'s rows sorted by the tenant of their `add`, in row groups, each with its range
    of tenants (None: it holds no `add`). Rows without an `add` come first."""
    adds = table.column("add")
    values = pc.struct_field(adds, "partitionValues")
    named = pc.map_lookup(values, pa.scalar(tenant_column), "first")
    tenants = pc.if_else(
        pc.is_valid(adds), pc.coalesce(named, pa.scalar(NO_TENANT)), pa.scalar(None, pa.string())
    )
    order = pc.array_sort_indices(tenants, null_placement="at_start")
    table = table.take(order)
    tenants = tenants.take(order)
    for start in range(0, table.num_rows, ROW_GROUP_ROWS):
        group_tenants = tenants.slice(start, ROW_GROUP_ROWS)
        first_last = pc.min_max(group_tenants)
        first = first_last["min"].as_py()
        yield (
            table.slice(start, ROW_GROUP_ROWS),
            None if first is None else [first, first_last["max"].as_py()],
        )


def ranges_metadata(tenant_column: str, ranges: list[list[str] | None]) -> dict[bytes, bytes]:
    return {RANGES_KEY: orjson.dumps({"column": tenant_column, "row_groups": ranges})}


def row_groups_holding(
    checkpoint: pq.ParquetFile, tenant_column: str, tenants: Collection[str]
) -> list[int] | None:
    """The row groups of `checkpoint` whose `add` rows may name any of `tenants` (add
    `NO_TENANT` for files without a tenant value); None: no ranges for `tenant_column`, so any
    row group may."""
    metadata = checkpoint.metadata.metadata or {}
    recorded = metadata.get(RANGES_KEY)
    if recorded is None:
        return None
    ranges = orjson.loads(recorded)
    row_groups = ranges.get("row_groups")
    if ranges.get("column") != tenant_column or not isinstance(row_groups, list):
        return None
    if len(row_groups) != checkpoint.num_row_groups:
        return None
    return [
        index
        for index, bounds in enumerate(row_groups)
        if bounds is not None and any(bounds[0] <= tenant <= bounds[1] for tenant in tenants)
    ]
