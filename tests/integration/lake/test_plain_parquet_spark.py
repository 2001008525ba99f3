"""Spark's Parquet reader (the one users' SQL runs on) reads the plain writer's files as it reads
pyarrow's files of the same rows, for every output table: nulls, empty and null maps and lists,
multi-byte text, the extremes of each type, and a file per row."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage.lake.plain_parquet import PlainParquet
from storage.lake.tables import ALL_TABLES, TableSpec

pytestmark = pytest.mark.integration


def _column(arrow_type: pa.DataType) -> list[Any]:
    """Four values of a type: null, an ordinary one, and two at its edges."""
    if pa.types.is_map(arrow_type):
        return [None, [("sum", 1.5), ("max", None)], [], [("ü", -0.0)]]
    if pa.types.is_list(arrow_type):
        return [None, ["a", "b"], [], [None, "ß"]]
    if pa.types.is_string(arrow_type):
        return [None, "acme", "", "ünïcødé ✓"]
    if pa.types.is_binary(arrow_type):
        return [None, b"\x00\xff", b"", b"x" * 300]
    if pa.types.is_boolean(arrow_type):
        return [None, True, False, True]
    if pa.types.is_int32(arrow_type):
        return [None, 7, -(2**31), 2**31 - 1]
    if pa.types.is_int64(arrow_type):
        return [None, 7, -(2**63), 2**63 - 1]
    if pa.types.is_floating(arrow_type):
        return [None, 1.5, -1e300, 0.0]
    if pa.types.is_timestamp(arrow_type):
        moments = [
            datetime(2026, 11, 30, 12, 0, 0, 123456),
            datetime(1970, 1, 1),
            datetime(2199, 12, 31),
        ]
        return [None, *(moment.replace(tzinfo=UTC) for moment in moments)]
    if pa.types.is_date32(arrow_type):
        return [None, date(2026, 11, 30), date(1970, 1, 1), date(2199, 12, 31)]
    raise AssertionError(f"no values for {arrow_type}")


@pytest.mark.parametrize("spec", ALL_TABLES, ids=lambda spec: spec.name)
def test_spark_reads_plain_files_as_it_reads_pyarrows(
    spark: Any, spec: TableSpec, tmp_path: Path
) -> None:
    rows = pa.table({field.name: _column(field.type) for field in spec.schema}, schema=spec.schema)
    writer = PlainParquet.of(spec.schema)
    assert writer is not None
    plain, reference = tmp_path / "plain", tmp_path / "pyarrow"
    plain.mkdir()
    for index, content in enumerate(writer.encode(rows, [(0, 1), (1, 2), (2, 4)])):
        (plain / f"part-{index}.parquet").write_bytes(content)
    pq.write_table(rows, tmp_path / "pyarrow.parquet", store_schema=False)
    reference.mkdir()
    (tmp_path / "pyarrow.parquet").rename(reference / "part-0.parquet")

    def read(folder: Path) -> tuple[Any, list[Any]]:
        frame = spark.read.parquet(str(folder))
        return frame.schema, sorted(frame.collect(), key=repr)

    plain_schema, plain_rows = read(plain)
    reference_schema, reference_rows = read(reference)
    assert plain_schema == reference_schema
    assert plain_rows == reference_rows
    assert len(plain_rows) == 4
