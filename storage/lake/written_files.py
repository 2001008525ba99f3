"""What an executor tells the driver about a data file it wrote: one small row per file.

The driver builds the Delta `add` actions from these rows (`DeltaLake.commit_files`); the rows
never carry data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

WRITTEN_FILE_FIELDS = [
    ("table_name", pa.string()),
    ("path", pa.string()),
    ("size", pa.int64()),
    ("partition_values_json", pa.string()),
    ("modification_time", pa.int64()),
    ("stats", pa.string()),
    ("num_records", pa.int64()),
    ("value_counts_json", pa.string()),
]
WRITTEN_FILE_SCHEMA = pa.schema(WRITTEN_FILE_FIELDS)
WRITTEN_FILE_DDL = ", ".join(
    f"{name} {'STRING' if field_type == pa.string() else 'BIGINT'}"
    for name, field_type in WRITTEN_FILE_FIELDS
)


@dataclass(frozen=True)
class WrittenFile:
    """One Parquet file an executor wrote, as the driver commits it."""

    table_name: str
    path: str
    """Relative to the table's root, as Delta's `add` action wants it."""
    size: int
    partition_values: dict[str, str | None]
    modification_time: int
    stats: str
    num_records: int
    value_counts: dict[str, int] = field(default_factory=dict)
    """Rows per value of the table's `counted_by` column; empty for other tables."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> WrittenFile:
        return cls._from_values(
            row["table_name"],
            row["path"],
            row["size"],
            row["partition_values_json"],
            row["modification_time"],
            row["stats"],
            row["num_records"],
            row.get("value_counts_json"),
        )

    @classmethod
    def from_table(cls, rows: pa.Table) -> list[WrittenFile]:
        """`from_row` of each row of `rows` (`WRITTEN_FILE_SCHEMA`), read a column at a time: a
        settle's driver reads a row per settled file, a million at a million tenants."""
        columns = [rows.column(name).to_pylist() for name, _ in WRITTEN_FILE_FIELDS]
        return [cls._from_values(*values) for values in zip(*columns, strict=True)]

    @classmethod
    def _from_values(
        cls,
        table_name: str,
        path: str,
        size: int,
        partition_values_json: str,
        modification_time: int,
        stats: str,
        num_records: int,
        value_counts_json: str | None,
    ) -> WrittenFile:
        """A row's values, in `WRITTEN_FILE_FIELDS`' order."""
        return cls(
            table_name=table_name,
            path=path,
            size=int(size),
            partition_values=orjson.loads(partition_values_json),
            modification_time=int(modification_time),
            stats=stats,
            num_records=int(num_records),
            value_counts=_counts(value_counts_json),
        )

    def to_row(self) -> dict[str, Any]:
        """The row `from_row` reads: what an executor sends the driver for this file."""
        return {
            "table_name": self.table_name,
            "path": self.path,
            "size": self.size,
            "partition_values_json": json.dumps(self.partition_values),
            "modification_time": self.modification_time,
            "stats": self.stats,
            "num_records": self.num_records,
            "value_counts_json": json.dumps(self.value_counts),
        }


def _counts(value_counts_json: str | None) -> dict[str, int]:
    # Most files count nothing ("{}"): only a batch's files of a counted table do.
    if not value_counts_json or value_counts_json == "{}":
        return {}
    counts: dict[str, int] = orjson.loads(value_counts_json)
    return counts


def written_batch(written: list[WrittenFile]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [file.to_row() for file in written], schema=WRITTEN_FILE_SCHEMA
    )
