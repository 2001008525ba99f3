"""A table's rows split by partition, each part with the Delta statistics of its file.

Stats let readers skip files. Column-wise throughout: no Python per row.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from dataclasses import dataclass
from datetime import date
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

# Stats let readers skip files; min/max only for the types Delta compares without surprises,
# and for the id columns: ids are short (at most 63 characters), so their stats are exact, and
# they let a reader skip the files (settled, or staged) that hold no row of a tenant.
_STATS_TYPES = (pa.types.is_integer, pa.types.is_timestamp, pa.types.is_date)
_ID_COLUMNS = ("tenant", "source")
SETTLED_FILE_STATS = ("tenant", "source", "batch_id")
"""The only statistics of a settled file: its partition already says its tenant, source and
date, so time ranges within it skip little, and every process that opens a table holds every
file's statistics (delta-rs keeps them all): at a file per tenant and source, a million files.
`tenant` and `source` keep skipping exact for a reader that filters on them rather than on the
layout columns, and `batch_id` is what the notifier and newest-first reads skip by
(`snapshot_reader`). Staged files and runs, which hold many tenants, keep them all."""


def sorted_rows(rows: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    return rows.take(pc.sort_indices(rows, [(column, "ascending") for column in columns]))


def run_starts(rows: pa.Table, columns: tuple[str, ...]) -> np.ndarray:
    """The row indices where the values of `columns` differ from the row before (and 0): the
    starts of `rows`' runs of equal keys, nulls equal to nulls. Column-wise: no Python per row."""
    if rows.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    follows = rows.num_rows - 1
    changes = np.zeros(follows, dtype=bool)
    for column in columns:
        before, after = rows[column].slice(0, follows), rows[column].slice(1)
        differs = pc.or_(
            pc.fill_null(pc.not_equal(after, before), False),
            pc.xor(pc.is_null(after), pc.is_null(before)),
        )
        changes |= differs.to_numpy(zero_copy_only=False)
    return np.flatnonzero(np.concatenate([[True], changes]))


@dataclass(frozen=True)
class Partitions:
    """A table's rows with each partition's rows next to each other, and each partition's
    values and the Delta statistics of its file."""

    rows: pa.Table
    bounds: list[int]
    """Partition i holds rows [bounds[i], bounds[i + 1])."""
    values: list[dict[str, str | None]]
    """Each partition's values, as Delta's log spells them."""
    stats: list[str]

    def splits(self) -> list[tuple[dict[str, str | None], pa.Table, str]]:
        """(values, rows, stats) of each partition; the rows a zero-copy slice."""
        return [
            (values, self.rows.slice(first, end - first), stats)
            for values, (first, end), stats in zip(
                self.values, itertools.pairwise(self.bounds), self.stats, strict=True
            )
        ]


def partitioned(
    rows: pa.Table, partition_by: tuple[str, ...], stats_columns: Collection[str] | None = None
) -> Partitions:
    """`rows` by partition, with the stats of `stats_columns` only, if given (e.g.
    `SETTLED_FILE_STATS`).

    The rows are sorted only when a partition's rows are not next to each other already (a
    table's `sort_by` and a staged file's single partition are). One grouped aggregation gives
    every partition's stats at once.
    """
    if not partition_by:
        stats = _partition_stats(rows, partition_by, stats_columns)
        return Partitions(rows, [0, rows.num_rows], [{}], [stats[()]])
    starts = run_starts(rows, partition_by)
    stats = _partition_stats(rows, partition_by, stats_columns, one_partition=len(starts) == 1)
    if len(starts) != len(stats):
        rows = sorted_rows(rows, partition_by)
        starts = run_starts(rows, partition_by)
    first_rows = rows.select(list(partition_by)).take(pa.array(starts)).to_pylist()
    keys = [tuple(values[column] for column in partition_by) for values in first_rows]
    return Partitions(
        rows=rows,
        bounds=[*starts.tolist(), rows.num_rows],
        values=[
            {column: partition_text(value) for column, value in values.items()}
            for values in first_rows
        ],
        stats=[stats[key] for key in keys],
    )


def split_by_partition(
    rows: pa.Table, partition_by: tuple[str, ...], stats_columns: Collection[str] | None = None
) -> list[tuple[dict[str, str | None], pa.Table, str]]:
    """(partition values, that partition's rows, their Delta stats) for each partition
    (`partitioned`)."""
    return partitioned(rows, partition_by, stats_columns).splits()


def _partition_stats(
    rows: pa.Table,
    partition_by: tuple[str, ...],
    stats_columns: Collection[str] | None,
    one_partition: bool = False,
) -> dict[tuple[Any, ...], str]:
    """Each partition's Delta stats (JSON), by its partition values; `one_partition`: all of
    `rows` are in one.

    Column-wise up to the JSON itself: at a file per key a settle writes a file of a few rows per
    partition, and turning every aggregate into a Python object first (dates and timestamps
    formatted one at a time) cost three times what this does."""
    ranged = _ranged_columns(rows.schema, partition_by)
    counted = _null_counted_columns(rows.schema, partition_by)
    if stats_columns is not None:
        ranged = [column for column in ranged if column in stats_columns]
        counted = [column for column in counted if column in stats_columns]
    aggregated = (
        _whole_table_aggregates(rows, partition_by, ranged, counted)
        if one_partition or not partition_by
        else rows.group_by(list(partition_by), use_threads=False).aggregate(
            [
                ([], "count_all"),
                *((column, kind) for column in ranged for kind in ("min", "max")),
                *((column, "count", pc.CountOptions(mode="only_null")) for column in counted),
            ]
        )
    )
    # pyarrow names each `<column>_<function>`.
    minimums = {c: _json_values(aggregated[f"{c}_min"]) for c in ranged}
    maximums = {c: _json_values(aggregated[f"{c}_max"]) for c in ranged}
    null_counts = {c: aggregated[f"{c}_count"].to_pylist() for c in counted}
    records = aggregated["count_all"].to_pylist()
    # Matched by key: pyarrow does not promise the groups in the order of the runs (in one
    # table here they came out swapped, and each file carried another's statistics).
    keys = zip(*(aggregated[column].to_pylist() for column in partition_by), strict=True)
    return {
        key: orjson.dumps(
            {
                "numRecords": records[index],
                "minValues": _present(minimums, index),
                "maxValues": _present(maximums, index),
                "nullCount": {column: counts[index] for column, counts in null_counts.items()},
            }
        ).decode()
        for index, key in enumerate(keys if partition_by else [()])
    }


def _whole_table_aggregates(
    rows: pa.Table, partition_by: tuple[str, ...], ranged: list[str], counted: list[str]
) -> pa.Table:
    """The one group `group_by(partition_by).aggregate` gives for rows of one partition, with
    its columns' names, from scalar aggregates: a staged file's rows are all in one partition,
    and hashing each of them to find that out cost as much as writing the file."""
    columns: dict[str, pa.Array] = {
        column: rows[column].slice(0, 1).combine_chunks() for column in partition_by
    }
    columns["count_all"] = pa.array([rows.num_rows], pa.int64())
    for column in ranged:
        extremes = pc.min_max(rows[column])
        columns[f"{column}_min"] = pa.array([extremes["min"]], rows[column].type)
        columns[f"{column}_max"] = pa.array([extremes["max"]], rows[column].type)
    for column in counted:
        columns[f"{column}_count"] = pa.array([rows[column].null_count], pa.int64())
    return pa.table(columns)


def _ranged_columns(schema: pa.Schema, partition_by: tuple[str, ...]) -> list[str]:
    """The columns whose min and max a file's stats carry."""
    return [
        f.name
        for f in schema
        if f.name not in partition_by
        and (f.name in _ID_COLUMNS or any(is_type(f.type) for is_type in _STATS_TYPES))
    ]


def _null_counted_columns(schema: pa.Schema, partition_by: tuple[str, ...]) -> list[str]:
    return [
        f.name
        for f in schema
        if f.name not in partition_by
        and not pa.types.is_map(f.type)
        and not pa.types.is_list(f.type)
    ]


def _present(values: dict[str, list[Any]], index: int) -> dict[str, Any]:
    return {
        column: column_values[index]
        for column, column_values in values.items()
        if column_values[index] is not None
    }


def _json_values(values: pa.ChunkedArray) -> list[Any]:
    """As Delta's stats spell them: timestamps in ISO-8601 to the millisecond (truncated), in UTC
    with a `Z` when they have a time zone; dates in ISO-8601."""
    if pa.types.is_timestamp(values.type):
        zoned = values.type.tz is not None
        milliseconds = pc.floor_temporal(values, unit="millisecond").cast(
            pa.timestamp("ms", tz="UTC" if zoned else None)
        )
        text = pc.strftime(milliseconds, format="%Y-%m-%dT%H:%M:%S")
        values = pc.binary_join_element_wise(text, "Z", "") if zoned else text
    elif pa.types.is_date(values.type):
        values = values.cast(pa.string())
    json_values: list[Any] = values.to_pylist()
    return json_values


def partition_text(value: Any) -> str | None:
    """A partition value as Delta's log spells it (a date as YYYY-MM-DD)."""
    if value is None:
        return None
    if isinstance(value, date):
        return value.isoformat()
    return str(value)
