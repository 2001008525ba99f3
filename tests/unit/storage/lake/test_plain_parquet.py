"""The plain Parquet writer against pyarrow's: any rows of any output table's schema, cut into
files anywhere, read back by pyarrow and DuckDB as the rows they were, in the types pyarrow's
own file of the same rows reads back in."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.lake import plain_parquet
from storage.lake.plain_parquet import CREATED_BY, PlainParquet
from storage.lake.tables import ALL_TABLES, TableSpec
from storage.lake.thrift_compact import I32, I64, Holes, StructLayout, read_struct, zigzag

_TEXT = st.text(max_size=12)  # any code point: multi-byte UTF-8 included
_SMALL_INT = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_BIG_INT = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_TIME = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)


def _values(arrow_type: pa.DataType) -> st.SearchStrategy[Any]:
    if pa.types.is_map(arrow_type):
        return st.lists(
            st.tuples(_values(arrow_type.key_type), st.none() | _values(arrow_type.item_type)),
            max_size=4,
        )
    if pa.types.is_list(arrow_type):
        return st.lists(st.none() | _values(arrow_type.value_type), max_size=4)
    if pa.types.is_string(arrow_type):
        return _TEXT
    if pa.types.is_binary(arrow_type):
        return st.binary(max_size=12)
    if pa.types.is_boolean(arrow_type):
        return st.booleans()
    if pa.types.is_int32(arrow_type):
        return _SMALL_INT
    if pa.types.is_int64(arrow_type):
        return _BIG_INT
    if pa.types.is_floating(arrow_type):
        return st.floats(allow_nan=False, width=arrow_type.bit_width)
    if pa.types.is_timestamp(arrow_type):
        return _TIME
    if pa.types.is_date32(arrow_type):
        return st.dates(min_value=date(1970, 1, 1), max_value=date(2200, 1, 1))
    raise AssertionError(f"no values for {arrow_type}")


@st.composite
def _rows_and_ranges(draw: st.DrawFn, schema: pa.Schema) -> tuple[pa.Table, list[tuple[int, int]]]:
    count = draw(st.integers(min_value=1, max_value=30))
    columns = {
        field.name: draw(st.lists(st.none() | _values(field.type), min_size=count, max_size=count))
        for field in schema
    }
    rows = pa.table(columns, schema=schema)
    cuts = sorted(draw(st.sets(st.integers(min_value=1, max_value=count - 1))) if count > 1 else [])
    bounds = [0, *cuts, count]
    return rows, list(itertools.pairwise(bounds))


@st.composite
def _files_of_keys(draw: st.DrawFn, schema: pa.Schema) -> tuple[pa.Table, list[tuple[int, int]]]:
    """Rows cut into files as a settle cuts them, a key's each: in most files a column is
    all null or has no null (levels of one run), in some it mixes them."""
    sizes = draw(st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=40))
    bounds = [0, *itertools.accumulate(sizes)]
    columns: dict[str, list[Any]] = {field.name: [] for field in schema}
    for size in sizes:
        for field in schema:
            nulls = draw(
                st.sampled_from(["none", "all", "some"]) if field.nullable else st.just("none")
            )
            values = st.none() | _values(field.type) if nulls == "some" else _values(field.type)
            columns[field.name] += (
                [None] * size
                if nulls == "all"
                else draw(st.lists(values, min_size=size, max_size=size))
            )
    return pa.table(columns, schema=schema), list(itertools.pairwise(bounds))


_FLAT_TABLES = [
    spec
    for spec in ALL_TABLES
    if not any(
        pa.types.is_nested(field.type) or pa.types.is_boolean(field.type) for field in spec.schema
    )
]


@pytest.mark.parametrize("spec", _FLAT_TABLES, ids=lambda spec: spec.name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_many_files_encoded_column_wise_are_the_bytes_of_one_by_one(
    spec: TableSpec, data: st.DataObject
) -> None:
    rows, ranges = data.draw(_files_of_keys(spec.schema))
    writer = PlainParquet.of(spec.schema)
    assert writer is not None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plain_parquet, "COLUMNWISE_FILES", 1)
        column_wise = writer.encode(rows, ranges)
        patch.setattr(plain_parquet, "COLUMNWISE_FILES", len(ranges) + 1)
        one_by_one = writer.encode(rows, ranges)

    assert column_wise == one_by_one
    for content, (first, end) in zip(column_wise, ranges, strict=True):
        assert _read(content).to_pylist() == rows.slice(first, end - first).to_pylist()


def _read(content: bytes) -> pa.Table:
    return pq.read_table(pa.BufferReader(content))


def _pyarrows_file(rows: pa.Table) -> bytes:
    out = pa.BufferOutputStream()
    pq.write_table(rows, out, store_schema=False)
    return out.getvalue().to_pybytes()


@pytest.mark.parametrize("spec", ALL_TABLES, ids=lambda spec: spec.name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_file_reads_back_as_its_rows_in_the_types_of_pyarrows_own(
    spec: TableSpec, data: st.DataObject
) -> None:
    rows, ranges = data.draw(_rows_and_ranges(spec.schema))
    writer = PlainParquet.of(spec.schema)
    assert writer is not None

    files = writer.encode(rows, ranges)

    assert len(files) == len(ranges)
    for content, (first, end) in zip(files, ranges, strict=True):
        expected = _read(_pyarrows_file(rows.slice(first, end - first)))
        back = _read(content)
        assert back.schema == expected.schema
        assert back.to_pylist() == expected.to_pylist()
        assert pq.ParquetFile(pa.BufferReader(content)).metadata.created_by == CREATED_BY.decode()


def test_duckdb_reads_the_files_as_pyarrow_does(tmp_path: Any) -> None:
    # DuckDB is the query service's reader of settled files: nulls, empty and null lists and
    # maps, multi-byte text and a file per row.
    windows = next(spec for spec in ALL_TABLES if spec.name == "windows")
    start = datetime(2026, 11, 30, tzinfo=UTC)
    rows = pa.Table.from_pylist(
        [
            {
                "tenant": "acme",
                "source": "web",
                "window_id": "w1",
                "window_start": start,
                "count": 3,
                "metrics": [("sum", 1.5), ("max", None)],
                "merged_window_ids": ["a", None, "ü"],
                "is_final": True,
            },
            {"tenant": "acme", "source": None, "metrics": [], "merged_window_ids": None},
            {"tenant": "ßeta", "window_start": start + timedelta(hours=1), "metrics": None},
        ],
        schema=windows.schema,
    )
    writer = PlainParquet.of(windows.schema)
    assert writer is not None
    for index, content in enumerate(writer.encode(rows, [(0, 3), (0, 1), (1, 2), (2, 3)])):
        (tmp_path / f"{index}.parquet").write_bytes(content)
    connection = duckdb.connect()

    def read(name: str) -> list[tuple[Any, ...]]:
        return connection.execute(
            "SELECT tenant, source, count, metrics, merged_window_ids, is_final, window_start "
            f"FROM read_parquet('{tmp_path / name}') ORDER BY ALL"
        ).fetchall()

    whole = read("0.parquet")
    assert whole == read("[123].parquet")
    assert len(whole) == 3
    acme = next(row for row in whole if row[1] == "web")
    assert acme[2:6] == (3, {"sum": 1.5, "max": None}, ["a", None, "ü"], True)


@pytest.mark.parametrize(
    "arrow_type",
    [pa.int8(), pa.timestamp("s"), pa.decimal128(10, 2), pa.struct([("a", pa.int32())])],
    ids=str,
)
def test_a_type_written_otherwise_is_left_to_pyarrow(arrow_type: pa.DataType) -> None:
    assert PlainParquet.of(pa.schema([("x", pa.string()), ("y", arrow_type)])) is None


def test_rows_of_another_schema_are_refused() -> None:
    writer = PlainParquet.of(pa.schema([("x", pa.string())]))
    assert writer is not None
    with pytest.raises(ValueError, match="schema"):
        writer.encode(pa.table({"x": [1]}), [(0, 1)])


def test_structs_encode_as_thrift_and_read_back_field_by_field() -> None:
    # Field ids 1, 2 and 20: a delta in the header, then one too big for it.
    layout = StructLayout((1, I32), (2, I64), (20, I32))
    encoded = layout.encode(zigzag(-3), zigzag(2**40), zigzag(150))
    fields = read_struct(encoded)
    assert fields.end == len(encoded)
    assert {field_id: fields.raw(field_id) for field_id in fields.spans} == {
        1: zigzag(-3),
        2: zigzag(2**40),
        20: zigzag(150),
    }
    holes = Holes(layout.encode(Holes.marker(0), zigzag(7), Holes.marker(1)), 2)
    assert b"".join(holes.pieces(zigzag(-3), zigzag(150))) == layout.encode(
        zigzag(-3), zigzag(7), zigzag(150)
    )
