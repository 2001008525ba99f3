"""Parquet files of a few rows each, many at once: one PLAIN, uncompressed data page per column.

A settle writes a file per key of a few rows each: 200,000 of them at 100,000 tenants. pyarrow's
writer sets up and tears down a column writer for every column of every file, about 8 µs each
whatever the rows (140 µs for a two-row file of `events`' 16 columns), and that was most of a
settle's time. A file of a few rows needs nothing that set-up buys (dictionaries, compression,
statistics, page splitting), so `PlainParquet` writes the plainest valid Parquet instead: one row
group, and per column one version-1 data page of PLAIN values behind RLE/bit-packed levels. It
encodes a slice of many files column-wise (numpy, no Python per row); per file it joins byte
ranges and writes a footer, or, for a slice of many files of flat columns, it builds their page
headers and footers column-wise too (`byte_pieces`: 28 -> 9 us a file of `events`).

The schema's Parquet form is pyarrow's own, copied from the footer of an empty file pyarrow
writes once per schema, so a file reads back exactly as pyarrow's would. Columns of numbers,
dates, timestamps, booleans, strings and binaries, and lists and maps of those, are written;
a schema with any other type is declined (`PlainParquet.of` returns None) and left to pyarrow.

Format: https://github.com/apache/parquet-format (`parquet.thrift`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from storage.lake.byte_pieces import BytePieces, varint_lengths
from storage.lake.thrift_compact import (
    BINARY,
    I16,
    I32,
    I64,
    LIST,
    STRUCT,
    Holes,
    StructLayout,
    binary,
    list_of,
    read_struct,
    varint,
    zigzag,
)

CREATED_BY = b"tenant-windows plain-parquet version 1.0.0"
"""The footer's writer, in the form readers parse (`<name> version <x.y.z>`)."""
_MAGIC = b"PAR1"
_DATA_PAGE = 0
_PLAIN = 0
_RLE = 3
_UNCOMPRESSED = 0
_PHYSICAL_TYPES = {"BOOLEAN": 0, "INT32": 1, "INT64": 2, "FLOAT": 4, "DOUBLE": 5, "BYTE_ARRAY": 6}
_FIXED_WIDTHS = {"INT32": 4, "INT64": 8, "FLOAT": 4, "DOUBLE": 8}

COLUMNWISE_FILES = 128
"""Files encoded at once from which the column-wise path is the quicker: its cost is per piece
of the format (a few hundred for a table of twenty columns), the other's per file."""

_ZERO = zigzag(0)
_PAGE_HEADER = Holes(
    # A data page of PLAIN values behind RLE levels; holes: its size twice, its entries.
    StructLayout((1, I32), (2, I32), (3, I32), (5, STRUCT)).encode(
        zigzag(_DATA_PAGE),
        Holes.marker(0),
        Holes.marker(1),
        StructLayout((1, I32), (2, I32), (3, I32), (4, I32)).encode(
            Holes.marker(2), zigzag(_PLAIN), zigzag(_RLE), zigzag(_RLE)
        ),
    ),
    3,
)
_COLUMN_METADATA = StructLayout(
    (1, I32), (2, LIST), (3, LIST), (4, I32), (5, I64), (6, I64), (7, I64), (9, I64)
)
_COLUMN_CHUNK = StructLayout((2, I64), (3, STRUCT))
_ROW_GROUP = StructLayout((1, LIST), (2, I64), (3, I64), (5, I64), (6, I64), (7, I16))
_FILE_METADATA = StructLayout((1, I32), (2, LIST), (3, I64), (4, LIST), (6, BINARY), (7, LIST))


def _physical_type(arrow_type: pa.DataType) -> str | None:
    """The Parquet type pyarrow stores `arrow_type`'s values as, PLAIN-encoded as they lie in
    Arrow's buffer; None for a type written otherwise (narrow integers, seconds, decimals...)."""
    if pa.types.is_boolean(arrow_type):
        return "BOOLEAN"
    if pa.types.is_int32(arrow_type) or pa.types.is_date32(arrow_type):
        return "INT32"
    if pa.types.is_int64(arrow_type):
        return "INT64"
    if pa.types.is_timestamp(arrow_type) and arrow_type.unit in ("ms", "us"):
        return "INT64"
    if pa.types.is_float32(arrow_type):
        return "FLOAT"
    if pa.types.is_float64(arrow_type):
        return "DOUBLE"
    if pa.types.is_string(arrow_type) or pa.types.is_binary(arrow_type):
        return "BYTE_ARRAY"
    return None


_Part = Literal["value", "element", "key", "item"]
"""Which part of a top-level field a leaf column holds: the value itself, a list's elements, a
map's keys or items."""


@dataclass(frozen=True)
class _Leaf:
    """A leaf column: a flat field, a list's elements, or a map's keys or values."""

    field_index: int
    """The top-level field it is in."""
    part: _Part
    slot_nullable: bool
    """The top-level field may be null."""
    value_nullable: bool
    """A value of the leaf may be null (for a flat field: the same as `slot_nullable`)."""
    physical_type: str

    @property
    def max_definition(self) -> int:
        if self.part == "value":
            return int(self.slot_nullable)
        # The optional list or map, its repeated group, the optional element.
        return int(self.slot_nullable) + 1 + int(self.value_nullable)

    @property
    def max_repetition(self) -> int:
        return 0 if self.part == "value" else 1


def _leaves(schema: pa.Schema) -> list[_Leaf] | None:
    """The schema's leaf columns in Parquet's order; None if one has a type not written here."""
    leaves = []
    for index, field in enumerate(schema):
        field_type = field.type
        parts: list[tuple[_Part, pa.Field]]
        if pa.types.is_map(field_type):
            parts = [("key", field_type.key_field), ("item", field_type.item_field)]
        elif pa.types.is_list(field_type):
            parts = [("element", field_type.value_field)]
        else:
            parts = [("value", field)]
        for part, value_field in parts:
            physical = _physical_type(value_field.type)
            if physical is None:
                return None
            leaves.append(_Leaf(index, part, field.nullable, value_field.nullable, physical))
    return leaves


@dataclass(frozen=True)
class _ColumnPages:
    """One leaf column of a slice of rows, encoded: each file's page is a range of it.

    Levels are per entry: one per row of a flat column; for a list or map one per element, or
    one for a row whose list is empty or null."""

    row_entries: list[int]
    """Entries before each row (len rows + 1)."""
    entry_values: list[int]
    """Values before each entry (len entries + 1): an entry of a null carries none."""
    definition: _Levels | None
    repetition: _Levels | None
    value_ends: list[int]
    """Bytes of `values` before each value (len values + 1); for booleans, the values' count."""
    values: bytes | np.ndarray
    """Every value PLAIN-encoded one after another; booleans as an array, bit-packed per page."""
    entry_value_array: np.ndarray
    value_end_array: np.ndarray
    """`entry_values` and `value_ends` for the column-wise path, which reads them per file."""

    def add_flat_pages(self, files: BytePieces, firsts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Append each file's data page of a flat column (rows [firsts[i], ends[i]), its levels
        one run) to `files`; each page's size."""
        assert not isinstance(self.values, np.ndarray)
        entries = ends - firsts
        value_starts = self.value_end_array[self.entry_value_array[firsts]]
        value_ends = self.value_end_array[self.entry_value_array[ends]]
        body = value_ends - value_starts
        if self.definition is not None:
            run_header = entries << 1
            run_bytes = varint_lengths(run_header) + 1
            body = body + 4 + run_bytes
        _add_holes(files, _PAGE_HEADER, [body, body, entries])
        if self.definition is not None:
            files.int32s(run_bytes)
            files.varints(run_header)
            files.varints(self.definition.levels_at(firsts))
        files.ranges(np.frombuffer(self.values, dtype=np.uint8), value_starts, value_ends)
        sizes: np.ndarray = (
            _PAGE_HEADER.constant_size
            + 2 * varint_lengths(body << 1)
            + varint_lengths(entries << 1)
            + body
        )
        return sizes

    def page_body(self, first_row: int, end_row: int) -> tuple[int, list[bytes], int]:
        """(entries, the data page's body in pieces, its size) for rows [first_row, end_row)."""
        first, end = self.row_entries[first_row], self.row_entries[end_row]
        first_value, end_value = self.entry_values[first], self.entry_values[end]
        pieces = []
        if self.repetition is not None:
            pieces.append(self.repetition.encode(first, end))
        if self.definition is not None:
            pieces.append(self.definition.encode(first, end))
        if isinstance(self.values, np.ndarray):
            values = self.values[first_value:end_value]
            pieces.append(np.packbits(values, bitorder="little").tobytes())
        else:
            pieces.append(self.values[self.value_ends[first_value] : self.value_ends[end_value]])
        return end - first, pieces, sum(map(len, pieces))


class _Levels:
    """Definition or repetition levels of a column's entries, encoded a range at a time."""

    def __init__(self, levels: np.ndarray, max_level: int):
        self._levels = levels
        self._bit_width = max_level.bit_length()
        # Changes before each entry: a range [a, b) is one run when none falls within (a, b).
        changes = np.concatenate([[0], np.cumsum(levels[1:] != levels[:-1])])
        self._change_array = changes
        self._changes = changes.tolist()
        self._runs: dict[tuple[int, int], bytes] = {}
        """Encoded runs by (length, level): most files' levels are one run of a few."""

    def one_run(self, firsts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Whether the levels of each range [firsts[i], ends[i]) are all equal."""
        one_run: np.ndarray = self._change_array[ends - 1] == self._change_array[firsts]
        return one_run

    def levels_at(self, entries: np.ndarray) -> np.ndarray:
        levels: np.ndarray = self._levels[entries]
        return levels

    def encode(self, first: int, end: int) -> bytes:
        """Levels [first, end) in the RLE/bit-packed hybrid, behind their 4-byte length: one
        RLE run when they are all equal (the usual case), else bit-packed."""
        count = end - first
        if self._changes[end - 1] == self._changes[first]:
            run = (count, int(self._levels[first]))
            encoded = self._runs.get(run)
            if encoded is None:
                body = varint(count << 1) + bytes([run[1]])
                encoded = self._runs[run] = len(body).to_bytes(4, "little") + body
            return encoded
        groups = -(-count // 8)
        padded = np.zeros(groups * 8, dtype=np.uint8)
        padded[:count] = self._levels[first:end]
        bits = (padded[:, None] >> np.arange(self._bit_width, dtype=np.uint8)) & 1
        body = varint(groups << 1 | 1) + np.packbits(bits.ravel(), bitorder="little").tobytes()
        return len(body).to_bytes(4, "little") + body


class PlainParquet:
    """Writes Parquet files of one Arrow schema."""

    def __init__(self, schema: pa.Schema, leaves: list[_Leaf], template: bytes):
        self.schema = schema
        self._leaves = leaves
        footer = read_struct(template, len(template) - 8 - _footer_size(template))
        if set(footer.spans) - {1, 2, 3, 4, 6, 7}:
            raise ValueError(f"pyarrow's footer has fields {sorted(footer.spans)}")
        columns = pq.ParquetFile(pa.BufferReader(template)).schema
        column_chunks = []
        for index, leaf in enumerate(leaves):
            column = columns.column(index)
            if (column.physical_type, column.max_definition_level, column.max_repetition_level) != (
                leaf.physical_type,
                leaf.max_definition,
                leaf.max_repetition,
            ):
                raise ValueError(f"column {column.path}: {column} for {leaf}")
            encodings = [_PLAIN, _RLE] if leaf.max_definition or leaf.max_repetition else [_PLAIN]
            metadata = _COLUMN_METADATA.encode(
                zigzag(_PHYSICAL_TYPES[leaf.physical_type]),
                list_of(I32, (zigzag(encoding) for encoding in encodings)),
                list_of(BINARY, (binary(part.encode()) for part in column.path.split("."))),
                zigzag(_UNCOMPRESSED),
                *(Holes.marker(hole) for hole in range(4)),  # values, sizes twice, page offset
            )
            # `file_offset` is deprecated; pyarrow writes 0 there too.
            column_chunks.append(Holes(_COLUMN_CHUNK.encode(_ZERO, metadata), 4))
        self._column_chunks = column_chunks
        # The column-wise path writes flat columns of byte-aligned values (no bit-packed
        # booleans) only.
        self._flat = all(
            leaf.part == "value" and leaf.physical_type != "BOOLEAN" for leaf in leaves
        )
        self._columns_header = list_of(STRUCT, [b""] * len(leaves))
        # Holes: the rows; the row group's columns, data size, rows, and data size again (the
        # one row group's data starts after the magic bytes and is stored uncompressed).
        row_group = _ROW_GROUP.encode(
            *(Holes.marker(hole) for hole in (1, 2, 3)),
            zigzag(len(_MAGIC)),
            Holes.marker(4),
            _ZERO,
        )
        self._footer = Holes(
            _FILE_METADATA.encode(
                footer.raw(1),
                footer.raw(2),
                Holes.marker(0),
                list_of(STRUCT, [row_group]),
                binary(CREATED_BY),
                footer.raw(7),
            ),
            5,
        )

    @staticmethod
    @functools.lru_cache(maxsize=32)
    def of(schema: pa.Schema) -> PlainParquet | None:
        """The writer of `schema`'s files; None when a column has a type it does not write."""
        leaves = _leaves(schema)
        if leaves is None or sys.byteorder != "little" or any("." in name for name in schema.names):
            return None
        template = pa.BufferOutputStream()
        pq.write_table(
            schema.empty_table(),
            template,
            compression="none",
            use_dictionary=False,
            write_statistics=False,
            store_schema=False,
        )
        return PlainParquet(schema, leaves, template.getvalue().to_pybytes())

    def encode(self, rows: pa.Table, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """A file for each range [first, end) of `rows` (of `self.schema`), none of them empty."""
        if not rows.schema.equals(self.schema):
            raise ValueError(f"rows of schema {rows.schema} for a writer of {self.schema}")
        if any(not 0 <= first < end <= rows.num_rows for first, end in ranges):
            raise ValueError(f"ranges {ranges} of {rows.num_rows} rows: one is empty or outside")
        columns = [rows.column(index).combine_chunks() for index in range(rows.num_columns)]
        pages = [_column_pages(leaf, columns[leaf.field_index]) for leaf in self._leaves]
        if len(ranges) < COLUMNWISE_FILES or not self._flat:
            return [self._file(pages, first, end) for first, end in ranges]
        firsts = np.fromiter((first for first, _ in ranges), np.int64, len(ranges))
        ends = np.fromiter((end for _, end in ranges), np.int64, len(ranges))
        one_run = np.ones(len(ranges), dtype=bool)
        for column in pages:
            if column.definition is not None:
                one_run &= column.definition.one_run(firsts, ends)
        if one_run.all():
            return self._files_columnwise(pages, firsts, ends)
        # A file whose column mixes nulls and values has bit-packed levels: those are encoded
        # one by one.
        files: list[bytes] = [b""] * len(ranges)
        columnwise = self._files_columnwise(pages, firsts[one_run], ends[one_run])
        for at, file in zip(np.flatnonzero(one_run).tolist(), columnwise, strict=True):
            files[at] = file
        for at in np.flatnonzero(~one_run).tolist():
            first, end = ranges[at]
            files[at] = self._file(pages, first, end)
        return files

    def _files_columnwise(
        self, pages: Sequence[_ColumnPages], firsts: np.ndarray, ends: np.ndarray
    ) -> list[bytes]:
        """The files of rows [firsts[i], ends[i]) of a flat schema without booleans, whose
        levels are one run in each file, built a piece of the format at a time over every file
        (`BytePieces`)."""
        files = BytePieces(len(firsts))
        files.constant(_MAGIC)
        entries = ends - firsts
        offset = np.full(len(firsts), len(_MAGIC), np.int64)
        chunks = []
        for column in pages:
            size = column.add_flat_pages(files, firsts, ends)
            chunks.append((size, offset))
            offset = offset + size
        data_size = offset - len(_MAGIC)
        footer = files.mark()

        def columns() -> None:
            files.constant(self._columns_header)
            for chunk, (size, at) in zip(self._column_chunks, chunks, strict=True):
                _add_holes(files, chunk, [entries, size, size, at])

        _add_holes(files, self._footer, [entries, columns, data_size, entries, data_size])
        files.int32s(files.lengths_since(footer))
        files.constant(_MAGIC)
        return files.build()

    def _file(self, pages: Sequence[_ColumnPages], first_row: int, end_row: int) -> bytes:
        pieces = [_MAGIC]
        chunks = [self._columns_header]
        offset = len(_MAGIC)
        for chunk, column in zip(self._column_chunks, pages, strict=True):
            entry_count, body, body_size = column.page_body(first_row, end_row)
            entries = zigzag(entry_count)
            encoded_body_size = zigzag(body_size)
            header = _PAGE_HEADER.pieces(encoded_body_size, encoded_body_size, entries)
            size = (
                _PAGE_HEADER.constant_size + 2 * len(encoded_body_size) + len(entries) + body_size
            )
            encoded_size = zigzag(size)
            chunks += chunk.pieces(entries, encoded_size, encoded_size, zigzag(offset))
            pieces += header
            pieces += body
            offset += size
        data_size = zigzag(offset - len(_MAGIC))
        num_rows = zigzag(end_row - first_row)
        footer = b"".join(
            self._footer.pieces(num_rows, b"".join(chunks), data_size, num_rows, data_size)
        )
        pieces += (footer, len(footer).to_bytes(4, "little"), _MAGIC)
        return b"".join(pieces)


def _add_holes(
    files: BytePieces, holes: Holes, values: Sequence[np.ndarray | Callable[[], None]]
) -> None:
    """`holes` with each file's values in them: an array's values as zigzag varints (of
    non-negative numbers: the varint of twice the number), or the pieces a callable adds."""
    for segment, value in zip(holes.segments, values, strict=False):
        files.constant(segment)
        if callable(value):
            value()
        else:
            files.varints(value << 1)
    files.constant(holes.segments[-1])


def _footer_size(file: bytes) -> int:
    return int.from_bytes(file[-8:-4], "little")


def _column_pages(leaf: _Leaf, column: pa.Array) -> _ColumnPages:
    """`leaf`'s levels and values over every row of `column` (its top-level field)."""
    rows = len(column)
    slot_valid = _validity(column)
    if leaf.part == "value":
        values = column
        row_entries = np.arange(rows + 1)
        definition = slot_valid.astype(np.uint8) if leaf.max_definition else None
        repetition = None
    else:
        offsets_buffer = column.buffers()[1]
        offsets = (
            np.frombuffer(offsets_buffer, dtype=np.int32)[column.offset : column.offset + rows + 1]
            if offsets_buffer is not None
            else np.zeros(rows + 1, dtype=np.int32)
        )
        # A null slot may still span children in Arrow; they are not its elements.
        lengths = np.where(slot_valid, np.diff(offsets), 0)
        children = column.values.slice(offsets[0], offsets[-1] - offsets[0])
        if leaf.part != "element":
            children = children.field(0 if leaf.part == "key" else 1)
        kept = np.repeat(slot_valid, np.diff(offsets))
        if not kept.all():
            children = children.filter(pa.array(kept))
        entries = np.maximum(lengths, 1)
        row_entries = np.concatenate([[0], np.cumsum(entries)])
        repetition = np.ones(int(row_entries[-1]), dtype=np.uint8)
        repetition[row_entries[:-1]] = 0
        is_element = np.repeat(lengths > 0, entries)
        definition = np.empty(len(repetition), dtype=np.uint8)
        slot_level = int(leaf.slot_nullable)
        definition[~is_element] = np.where(slot_valid[lengths == 0], slot_level, slot_level - 1)
        element_level = slot_level + 1
        definition[is_element] = element_level + (
            _validity(children).astype(np.uint8) if leaf.value_nullable else 0
        )
        values = children
    carries_value = (
        definition == leaf.max_definition if definition is not None else np.ones(rows, dtype=bool)
    )
    entry_values = np.concatenate([[0], np.cumsum(carries_value)])
    value_ends, encoded = _plain_values(pc.drop_null(values), leaf.physical_type)
    return _ColumnPages(
        row_entries=row_entries.tolist(),
        entry_values=entry_values.tolist(),
        definition=_Levels(definition, leaf.max_definition) if definition is not None else None,
        repetition=_Levels(repetition, 1) if repetition is not None else None,
        value_ends=value_ends.tolist(),
        values=encoded,
        entry_value_array=entry_values,
        value_end_array=value_ends,
    )


def _validity(array: pa.Array) -> np.ndarray:
    if array.null_count == 0:
        return np.ones(len(array), dtype=bool)
    return np.asarray(array.is_valid())


def _plain_values(values: pa.Array, physical_type: str) -> tuple[np.ndarray, bytes | np.ndarray]:
    """Non-null values, PLAIN-encoded: (the bytes before each, the bytes)."""
    count = len(values)
    if physical_type == "BOOLEAN":
        return np.arange(count + 1), np.asarray(values)
    if physical_type != "BYTE_ARRAY":
        width = _FIXED_WIDTHS[physical_type]
        if not pa.types.is_floating(values.type):
            values = values.view(pa.int32() if width == 4 else pa.int64())
        encoded = np.ascontiguousarray(values.to_numpy()).view(np.uint8)
        return np.arange(0, (count + 1) * width, width), encoded.tobytes()
    # Each value's 4-byte length, then its bytes.
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[
        values.offset : values.offset + count + 1
    ]
    data_buffer = values.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    ends = np.concatenate([[0], np.cumsum(lengths + 4)])
    encoded = np.empty(int(ends[-1]), dtype=np.uint8)
    starts = ends[:-1]
    encoded[starts[:, None] + np.arange(4)] = lengths.astype("<i4").view(np.uint8).reshape(-1, 4)
    shift = np.repeat(starts + 4 - offsets[:-1], lengths)
    source = np.arange(offsets[0], offsets[-1])
    encoded[source + shift] = data[offsets[0] : offsets[-1]]
    return ends, encoded.tobytes()
