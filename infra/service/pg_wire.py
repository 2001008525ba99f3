"""The Postgres wire protocol (version 3) as the Postgres door speaks it: framing, the server's
messages, and Arrow columns as Postgres types in text (or, for the simple types, binary) form.

Only what a server sends and reads; what a message means for a session is `pg_door`'s.
"""

from __future__ import annotations

import datetime
import decimal
import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson
import pyarrow as pa

PROTOCOL_3 = 196_608
SSL_REQUEST = 80_877_103
GSS_REQUEST = 80_877_104
CANCEL_REQUEST = 80_877_102
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""A client message longer than this is a broken or hostile client: the connection ends."""

# Type OIDs (Postgres' pg_type.dat).
BOOL, BYTEA, INT8, INT2, INT4, TEXT, OID, JSON = 16, 17, 20, 21, 23, 25, 26, 114
FLOAT4, FLOAT8, UNKNOWN, VARCHAR, DATE = 700, 701, 705, 1043, 1082
TIMESTAMP, TIMESTAMPTZ, NUMERIC = 1114, 1184, 1700
_TYPE_SIZES = {BOOL: 1, INT2: 2, INT4: 4, INT8: 8, OID: 4, FLOAT4: 4, FLOAT8: 8, DATE: 4}
_POSTGRES_EPOCH = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
_POSTGRES_EPOCH_DAY = datetime.date(2000, 1, 1).toordinal()


class ProtocolError(Exception):
    """The client broke the protocol; the connection ends after an error message."""


class WireError(Exception):
    """A statement's failure as the client gets it: a SQLSTATE and one line."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message


def read_exact(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise EOFError("the client closed the connection")
    return data


def read_startup(stream: BinaryIO) -> tuple[int, bytes]:
    """A startup-phase message (no type byte): its code and the rest."""
    (length,) = struct.unpack("!i", read_exact(stream, 4))
    if not 8 <= length <= 10_000:
        raise ProtocolError("bad startup message length")
    body = read_exact(stream, length - 4)
    return struct.unpack("!i", body[:4])[0], body[4:]


def read_message(stream: BinaryIO) -> tuple[bytes, bytes]:
    """A typed message: its type byte and its body."""
    kind = stream.read(1)
    if not kind:
        raise EOFError("the client closed the connection")
    (length,) = struct.unpack("!i", read_exact(stream, 4))
    if not 4 <= length <= MAX_MESSAGE_BYTES:
        raise ProtocolError("bad message length")
    return kind, read_exact(stream, length - 4)


def startup_parameters(body: bytes) -> dict[str, str]:
    parts = body.split(b"\x00")
    text = [part.decode("utf-8", "replace") for part in parts]
    return {text[i]: text[i + 1] for i in range(0, len(text) - 1, 2) if text[i]}


class Reader:
    """Fields of one message's body, in order."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.at = 0

    def string(self) -> str:
        end = self.body.index(b"\x00", self.at)
        text = self.body[self.at : end].decode("utf-8")
        self.at = end + 1
        return text

    def int16(self) -> int:
        (value,) = struct.unpack_from("!h", self.body, self.at)
        self.at += 2
        return int(value)

    def int32(self) -> int:
        (value,) = struct.unpack_from("!i", self.body, self.at)
        self.at += 4
        return int(value)

    def raw(self, size: int) -> bytes:
        if self.at + size > len(self.body):
            raise ProtocolError("a message is shorter than its fields")
        data = self.body[self.at : self.at + size]
        self.at += size
        return data

    def byte(self) -> str:
        return chr(self.raw(1)[0])


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def cstring(text: str) -> bytes:
    return text.encode("utf-8") + b"\x00"


def authentication(code: int) -> bytes:
    """0: ok; 3: send the password in clear (over TLS where the operator gives a certificate)."""
    return message(b"R", struct.pack("!i", code))


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstring(name) + cstring(value))


def backend_key_data(process_id: int, secret: int) -> bytes:
    return message(b"K", struct.pack("!ii", process_id, secret))


def ready_for_query(status: bytes) -> bytes:
    return message(b"Z", status)


def command_complete(tag: str) -> bytes:
    return message(b"C", cstring(tag))


def error_response(sqlstate: str, text: str, severity: str = "ERROR") -> bytes:
    fields = (
        b"S" + cstring(severity) + b"V" + cstring(severity) + b"C" + cstring(sqlstate)
        + b"M" + cstring(text) + b"\x00"
    )  # fmt: skip
    return message(b"E", fields)


def parameter_description(oids: list[int]) -> bytes:
    return message(b"t", struct.pack(f"!h{len(oids)}i", len(oids), *oids))


PARSE_COMPLETE = message(b"1")
BIND_COMPLETE = message(b"2")
CLOSE_COMPLETE = message(b"3")
NO_DATA = message(b"n")
EMPTY_QUERY = message(b"I")
PORTAL_SUSPENDED = message(b"s")


@dataclass(frozen=True)
class Column:
    """One result column as Postgres describes it, and how its values are written."""

    name: str
    oid: int
    text: Callable[[Any], bytes]
    binary: Callable[[Any], bytes] | None


def row_description(columns: list[Column], formats: list[int]) -> bytes:
    body = struct.pack("!h", len(columns))
    for column, fmt in zip(columns, formats, strict=True):
        size = _TYPE_SIZES.get(column.oid, -1)
        body += cstring(column.name) + struct.pack("!ihihih", 0, 0, column.oid, size, -1, fmt)
    return message(b"T", body)


def result_formats(columns: list[Column], requested: list[int]) -> list[int]:
    """Each column's format: the client's (one code for all, or one each; 0 text, 1 binary).
    A binary request for a type without a binary form is refused."""
    if not requested:
        return [0] * len(columns)
    formats = requested * len(columns) if len(requested) == 1 else requested
    if len(formats) != len(columns):
        raise WireError("08P01", "the result format codes do not match the columns")
    for column, fmt in zip(columns, formats, strict=True):
        if fmt == 1 and column.binary is None:
            raise WireError("0A000", f"column {column.name}: ask for its values as text")
    return formats


def data_rows(table: pa.Table, columns: list[Column], formats: list[int]) -> Iterator[bytes]:
    """`table`'s rows as DataRow messages."""
    writers = [
        column.binary if fmt == 1 and column.binary is not None else column.text
        for column, fmt in zip(columns, formats, strict=True)
    ]
    values = [table.column(index).to_pylist() for index in range(table.num_columns)]
    count = struct.pack("!h", len(columns))
    for row in zip(*values, strict=True) if values else ():
        parts = [count]
        for writer, value in zip(writers, row, strict=True):
            if value is None:
                parts.append(b"\xff\xff\xff\xff")
            else:
                data = writer(value)
                parts.append(struct.pack("!i", len(data)) + data)
        yield message(b"D", b"".join(parts))


def columns_of(schema: pa.Schema) -> list[Column]:
    """Postgres' view of each Arrow column."""
    return [_column(field.name, field.type) for field in schema]


def _column(name: str, data_type: pa.DataType) -> Column:
    if pa.types.is_boolean(data_type):
        return Column(name, BOOL, lambda v: b"t" if v else b"f", lambda v: b"\x01" if v else b"\0")
    if pa.types.is_int8(data_type) or pa.types.is_int16(data_type) or pa.types.is_uint8(data_type):
        return Column(name, INT2, _text_of_int, lambda v: struct.pack("!h", v))
    if pa.types.is_int32(data_type) or pa.types.is_uint16(data_type):
        return Column(name, INT4, _text_of_int, lambda v: struct.pack("!i", v))
    if pa.types.is_int64(data_type) or pa.types.is_uint32(data_type):
        return Column(name, INT8, _text_of_int, lambda v: struct.pack("!q", v))
    if pa.types.is_integer(data_type):  # uint64: past int8
        return Column(name, NUMERIC, _text_of_int, None)
    if pa.types.is_float32(data_type) or pa.types.is_float16(data_type):
        return Column(name, FLOAT4, _text_of_float, lambda v: struct.pack("!f", v))
    if pa.types.is_floating(data_type):
        return Column(name, FLOAT8, _text_of_float, lambda v: struct.pack("!d", v))
    if pa.types.is_decimal(data_type):
        return Column(name, NUMERIC, lambda v: str(v).encode(), None)
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return Column(name, TEXT, _utf8, _utf8)
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return Column(name, BYTEA, lambda v: b"\\x" + bytes(v).hex().encode(), bytes)
    if pa.types.is_timestamp(data_type):
        oid = TIMESTAMPTZ if data_type.tz is not None else TIMESTAMP
        return Column(name, oid, _text_of_timestamp, _binary_of_timestamp)
    if pa.types.is_date(data_type):
        return Column(
            name,
            DATE,
            lambda v: v.isoformat().encode(),
            lambda v: struct.pack("!i", v.toordinal() - _POSTGRES_EPOCH_DAY),
        )
    if pa.types.is_null(data_type):
        return Column(name, TEXT, _utf8, _utf8)
    # json's binary form is its text.
    if pa.types.is_map(data_type):
        as_json: Callable[[Any], bytes] = lambda v: orjson.dumps(dict(v), default=str)  # noqa: E731
        return Column(name, JSON, as_json, as_json)
    if pa.types.is_nested(data_type):
        return Column(name, JSON, _json, _json)
    return Column(name, TEXT, _utf8, _utf8)


def _json(value: Any) -> bytes:
    return orjson.dumps(value, default=str)


def _utf8(value: Any) -> bytes:
    return str(value).encode("utf-8")


def _text_of_int(value: int) -> bytes:
    return str(int(value)).encode()


def _text_of_float(value: float) -> bytes:
    if math.isnan(value):
        return b"NaN"
    if math.isinf(value):
        return b"Infinity" if value > 0 else b"-Infinity"
    return repr(float(value)).encode()


def _text_of_timestamp(value: datetime.datetime) -> bytes:
    # ISO with a numeric zone: what Postgres writes with DateStyle ISO (sent at startup).
    return value.isoformat(sep=" ").encode()


def _binary_of_timestamp(value: datetime.datetime) -> bytes:
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    delta = value - _POSTGRES_EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return struct.pack("!q", micros)


def parameter_value(oid: int, fmt: int, data: bytes) -> str | int | float | bool | decimal.Decimal:
    """A bound parameter as a Python value (text form: validated for numeric and boolean
    types; binary form: the fixed-size types and text)."""
    if fmt == 1:
        if oid in (INT2, INT4, INT8, OID) and len(data) in (2, 4, 8):
            return int.from_bytes(data, "big", signed=True)
        if oid == FLOAT8 and len(data) == 8:
            return float(struct.unpack("!d", data)[0])
        if oid == FLOAT4 and len(data) == 4:
            return float(struct.unpack("!f", data)[0])
        if oid == BOOL and len(data) == 1:
            return data != b"\x00"
        if oid in (TEXT, VARCHAR, UNKNOWN, 0):
            return data.decode("utf-8")
        raise WireError("0A000", f"a binary parameter of type {oid}: send it as text")
    text = data.decode("utf-8")
    try:
        if oid in (INT2, INT4, INT8, OID):
            return int(text)
        if oid in (FLOAT4, FLOAT8):
            return float(text)
        if oid == NUMERIC:
            return decimal.Decimal(text)
    except (ValueError, decimal.InvalidOperation):
        raise WireError("22P02", f"invalid number in a parameter: {text[:40]!r}") from None
    if oid == BOOL:
        lowered = text.strip().lower()
        if lowered in ("t", "true", "1", "on", "yes", "y"):
            return True
        if lowered in ("f", "false", "0", "off", "no", "n"):
            return False
        raise WireError("22P02", "invalid boolean in a parameter")
    return text
