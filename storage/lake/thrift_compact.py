"""Thrift's compact protocol, as much as Parquet's footers and page headers need.

Writing: a struct whose fields are always the same (`StructLayout`) gets its field headers
computed once; its values are encoded by the caller (`zigzag`, `binary`, `list_of`, or a nested
struct's bytes). A message most of whose values never change is encoded once with markers where
the others go (`Holes`), and each copy joins the constant pieces with its values. Reading:
`read_struct` finds where each field of a struct lies, to copy a field pyarrow wrote as it is.

Spec: https://github.com/apache/thrift/blob/master/doc/specs/thrift-compact-protocol.md
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

BOOL_TRUE, BOOL_FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(1, 13)
_STOP = b"\x00"
_SMALL_VARINTS = 1 << 14
"""Varints below this are looked up, not computed: a page header's sizes and counts."""


def _compute_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_VARINTS = tuple(_compute_varint(value) for value in range(_SMALL_VARINTS))
_SMALL_ZIGZAGS = tuple(_VARINTS[value << 1] for value in range(_SMALL_VARINTS >> 1))


def varint(value: int) -> bytes:
    """An unsigned LEB128 varint."""
    return _VARINTS[value] if value < _SMALL_VARINTS else _compute_varint(value)


def zigzag(value: int) -> bytes:
    """An i16, i32 or i64 value."""
    if 0 <= value < _SMALL_VARINTS >> 1:
        return _SMALL_ZIGZAGS[value]
    return varint(value << 1 if value >= 0 else (-value << 1) - 1)


def binary(value: bytes) -> bytes:
    return varint(len(value)) + value


def list_of(element_type: int, elements: Iterable[bytes]) -> bytes:
    """A list of encoded elements of `element_type`."""
    encoded = list(elements)
    size = len(encoded)
    header = (
        bytes([size << 4 | element_type])
        if size < 15
        else bytes([0xF0 | element_type]) + varint(size)
    )
    return header + b"".join(encoded)


class StructLayout:
    """A struct that always has the same fields, in this order: `(field id, type)` each."""

    def __init__(self, *fields: tuple[int, int], first_after: int = 0):
        """`first_after`: the field id written before these (their struct's bytes then start
        with that field's, written by the caller)."""
        headers = []
        previous = first_after
        for field_id, field_type in fields:
            delta = field_id - previous
            if 0 < delta <= 15:
                headers.append(bytes([delta << 4 | field_type]))
            else:
                headers.append(bytes([field_type]) + zigzag(field_id))
            previous = field_id
        self._headers = tuple(headers)

    def encode(self, *values: bytes) -> bytes:
        """The struct of these values, each encoded already."""
        if len(values) != len(self._headers):
            raise ValueError(f"{len(values)} values for {len(self._headers)} fields")
        pieces: list[bytes] = [_STOP] * (2 * len(values) + 1)
        pieces[0:-1:2] = self._headers
        pieces[1::2] = values
        return b"".join(pieces)


class Holes:
    """Encoded bytes in which some values are left to fill: made once from an encoding with
    `Holes.marker(i)` for the i-th varying value, cut at the markers. `pieces` gives the bytes
    as pieces, values in place, for one join with the rest of a message."""

    def __init__(self, encoded: bytes, count: int):
        segments = []
        rest = encoded
        for index in range(count):
            before, found, rest = rest.partition(self.marker(index))
            if not found:
                raise ValueError(f"hole {index} is not in the encoding, or out of order")
            segments.append(before)
        segments.append(rest)
        self.segments = tuple(segments)
        """The constant bytes before each value, then after the last."""
        self.constant_size = sum(len(segment) for segment in segments)
        """The bytes besides the values."""

    @staticmethod
    def marker(index: int) -> bytes:
        # No field header or varint holds these bytes, nor does UTF-8 text (no 0xFF in it).
        return b"\xff\xfehole %d\xfe\xff" % index

    def pieces(self, *values: bytes) -> list[bytes]:
        pieces: list[bytes] = [b""] * (2 * len(values) + 1)
        pieces[0::2] = self.segments
        pieces[1::2] = values
        return pieces


@dataclass(frozen=True)
class StructFields:
    """Where each field of a struct read from `data` lies."""

    data: bytes
    spans: dict[int, tuple[int, int, int]]
    """field id -> (type, first byte of its value, end)."""
    end: int

    def raw(self, field_id: int) -> bytes:
        """A field's value, encoded as it was."""
        _, first, end = self.spans[field_id]
        return self.data[first:end]


def read_struct(data: bytes, position: int = 0) -> StructFields:
    """The fields of the struct that starts at `position`."""
    spans: dict[int, tuple[int, int, int]] = {}
    field_id = 0
    while True:
        header = data[position]
        position += 1
        if header == 0:
            return StructFields(data, spans, position)
        field_type, delta = header & 0x0F, header >> 4
        if delta:
            field_id += delta
        else:
            encoded, position = _read_varint(data, position)
            field_id = encoded >> 1 ^ -(encoded & 1)
        first = position
        position = _skip(data, position, field_type)
        spans[field_id] = (field_type, first, position)


def _skip(data: bytes, position: int, value_type: int) -> int:
    """The position after a value of `value_type` at `position`."""
    if value_type in (BOOL_TRUE, BOOL_FALSE):
        return position
    if value_type == BYTE:
        return position + 1
    if value_type in (I16, I32, I64):
        return _read_varint(data, position)[1]
    if value_type == DOUBLE:
        return position + 8
    if value_type == BINARY:
        size, position = _read_varint(data, position)
        return position + size
    if value_type in (LIST, SET):
        header = data[position]
        position += 1
        size, element_type = header >> 4, header & 0x0F
        if size == 15:
            size, position = _read_varint(data, position)
        for _ in range(size):
            position = _skip(data, position, _in_container(element_type))
        return position
    if value_type == MAP:
        size, position = _read_varint(data, position)
        if size == 0:
            return position
        key_type, item_type = data[position] >> 4, data[position] & 0x0F
        position += 1
        for _ in range(size):
            position = _skip(data, position, _in_container(key_type))
            position = _skip(data, position, _in_container(item_type))
        return position
    if value_type == STRUCT:
        return read_struct(data, position).end
    raise ValueError(f"unknown compact-protocol type {value_type} at byte {position}")


def _in_container(value_type: int) -> int:
    # A list's or a map's booleans are a byte each, not part of a field header.
    return BYTE if value_type in (BOOL_TRUE, BOOL_FALSE) else value_type


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
