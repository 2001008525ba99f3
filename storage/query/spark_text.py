"""Rows in Arrow printed exactly as `tenant-windows sql` prints Spark's: its table (`show`), CSV
(Spark's casts to text) and JSON lines (`to_json`), without a JVM.

The in-process engine (`local_sql`) answers with Arrow rows in Spark's types; this gives them
Spark's text, byte for byte. Only types and values whose Spark text is known exactly are
printed; anything else raises `NotPrintable`, and Spark prints the statement instead. What
each format does, as Spark 4 on Java 17 does it (`tests/integration/query/test_sql_in_process.py`
prints a corpus both ways and compares the text):

- **table**: cells left-aligned, padded to the widest cell or name (at least 3) counted in
  UTF-16 units with East Asian wide characters as two; NULL as `NULL`; `\\n`, `\\t` and five
  other control characters escaped; binary as hex bytes `[0A FF]`; arrays `[a, NULL]`; maps
  `{k -> 1.0}`; and `only showing top N rows` when more rows than the limit exist.
- **csv**: a header, then each value as Spark casts it to text; arrays and maps as JSON,
  binary as MIME base64 (lines of 76 characters), NULL as an empty field.
- **json**: one object a row as Jackson writes it; a NULL field is left out.
- **doubles** as Java's `Double.toString`. Java 17's differs from the shortest text in some
  values of 1e7 and above or below 1e-3 (JDK-4511638), so only 0 and magnitudes in
  [1e-3, 1e7) are printed here, where the two agree.
- **timestamps** in UTC (Spark's session zone): `2026-01-01 00:00:01.5`, in JSON
  `2026-01-01T00:00:01.500Z` (milliseconds).
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import io
import math
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa

_MAX_SHOW_ROWS = 2**31 - 2
# Spark's `show` escapes these so that a cell stays on its line (SchemaUtils.escapeMetaCharacters).
_SHOW_ESCAPES = str.maketrans(
    {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f", "\b": "\\b", "\v": "\\v", "\a": "\\a"}
)
# Characters `show` counts as two columns wide (Spark's Utils.stringHalfWidth).
_FULL_WIDTH = re.compile(
    "[\u1100-\u115f\u2e80-\ua4cf\uac00-\ud7a3\uf900-\ufaff\ufe10-\ufe19\ufe30-\ufe6f"
    "\uff00-\uff60\uffe0-\uffe6]"
)
# Jackson's escapes; any other character below 0x20 is \\u00XX with upper-case hex.
_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_JSON_ESCAPES |= {"\b": "\\b", "\f": "\\f"}
_JSON_SPECIAL = re.compile('["\\\\\x00-\x1f]')


class NotPrintable(Exception):  # noqa: N818 - an outcome: Spark prints this one
    """A type or value whose Spark text is not known here exactly."""


def render_rows(table: pa.Table, output_format: str, limit: int) -> str:
    """The text `sql_shell.render_frame` prints for a frame whose first rows are `table`'s:
    at most `limit` of them; `table` holds one more row if the result has more than `limit`
    (the table format then says so)."""
    if not 0 < limit <= _MAX_SHOW_ROWS:
        raise NotPrintable(f"a limit of {limit}")
    names = table.column_names
    if len(set(names)) != len(names):
        raise NotPrintable("duplicate column names")
    shown = table.slice(0, limit)
    if output_format == "table":
        text = _table(names, [_column(shown, name, _show_text) for name in names])
        more = table.num_rows > limit
        return text + (
            f"only showing top {limit} row{'' if limit == 1 else 's'}\n" if more else "\n"
        )
    if output_format == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        cells = [_column(shown, name, _csv_text) for name in names]
        writer.writerows(zip(*cells, strict=True))
        return out.getvalue()
    if output_format == "json":
        keys = [_json_string(name) for name in names]
        values = [_column(shown, name, _json_value) for name in names]
        lines = []
        for row in range(shown.num_rows):
            fields = [
                f"{key}:{column[row]}"
                for key, column in zip(keys, values, strict=True)
                if column[row] is not None
            ]
            lines.append("{" + ",".join(fields) + "}\n")
        return "".join(lines)
    raise NotPrintable(f"the format {output_format!r}")


def _column(table: pa.Table, name: str, text_of: Callable[[pa.DataType, Any], Any]) -> list[Any]:
    column = table.column(name)
    _check_type(column.type)
    try:
        values = column.to_pylist()
    except (ValueError, OverflowError, pa.ArrowException) as error:  # e.g. a year past 9999
        raise NotPrintable(str(error)) from None
    return [text_of(column.type, value) for value in values]


_SCALARS = (
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_integer,
    pa.types.is_boolean,
    pa.types.is_float64,
    pa.types.is_date32,
    pa.types.is_binary,
)


def _check_type(data_type: pa.DataType) -> None:
    """The types printed here: the lake's columns and what the local engine computes."""
    if any(test(data_type) for test in _SCALARS):
        return
    if pa.types.is_timestamp(data_type) and data_type.unit == "us" and data_type.tz == "UTC":
        return
    if pa.types.is_list(data_type) and pa.types.is_string(data_type.value_type):
        return
    if (
        pa.types.is_map(data_type)
        and pa.types.is_string(data_type.key_type)
        and pa.types.is_float64(data_type.item_type)
    ):
        return
    raise NotPrintable(f"values of type {data_type}")


def _show_text(data_type: pa.DataType, value: Any) -> str:
    return _pretty(data_type, value).translate(_SHOW_ESCAPES)


def _pretty(data_type: pa.DataType, value: Any) -> str:
    """Spark's `show` text of a value (before its escapes)."""
    if value is None:
        return "NULL"
    if pa.types.is_binary(data_type):
        return "[" + " ".join(f"{byte:02X}" for byte in value) + "]"
    if pa.types.is_list(data_type):
        return "[" + ", ".join(_pretty(data_type.value_type, item) for item in value) + "]"
    if pa.types.is_map(data_type):
        pairs = (
            f"{_pretty(data_type.key_type, key)} -> {_pretty(data_type.item_type, item)}"
            for key, item in value
        )
        return "{" + ", ".join(pairs) + "}"
    return _scalar_text(value)


def _csv_text(data_type: pa.DataType, value: Any) -> str:
    if value is None:
        return ""
    if pa.types.is_binary(data_type):
        # Spark's `base64` is MIME's: lines of 76 characters, CRLF between them.
        text = base64.b64encode(value).decode("ascii")
        return "\r\n".join(text[start : start + 76] for start in range(0, len(text), 76))
    if pa.types.is_list(data_type) or pa.types.is_map(data_type):
        return _json_value(data_type, value) or ""
    return _scalar_text(value)


def _scalar_text(value: Any) -> str:
    """A scalar as Spark casts it to a string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str):
        return str(value)
    if isinstance(value, float):
        return java_double(value)
    if isinstance(value, dt.datetime):
        return _timestamp_text(value)
    if isinstance(value, dt.date):
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
    raise NotPrintable(f"a value {type(value).__name__}")


def _timestamp_text(value: dt.datetime) -> str:
    text = f"{value.year:04d}-{value:%m-%d %H:%M:%S}"
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text


def _json_value(data_type: pa.DataType, value: Any) -> str | None:
    """Jackson's text of a value inside `to_json` (None: a NULL, which a row leaves out)."""
    if value is None:
        return None
    if pa.types.is_binary(data_type):
        return _json_string(base64.b64encode(value).decode("ascii"))
    if pa.types.is_list(data_type):
        items = (_json_value(data_type.value_type, item) or "null" for item in value)
        return "[" + ",".join(items) + "]"
    if pa.types.is_map(data_type):
        pairs = (
            f"{_json_string(key)}:{_json_value(data_type.item_type, item) or 'null'}"
            for key, item in value
        )
        return "{" + ",".join(pairs) + "}"
    if isinstance(value, str):
        return _json_string(value)
    if isinstance(value, dt.datetime):
        text = f"{value.year:04d}-{value:%m-%dT%H:%M:%S}.{value.microsecond // 1000:03d}Z"
        return f'"{text}"'
    if isinstance(value, dt.date):
        return f'"{_scalar_text(value)}"'
    return _scalar_text(value)  # numbers and booleans as in CSV


def _json_string(text: str) -> str:
    return '"' + _JSON_SPECIAL.sub(_json_escape, text) + '"'


def _json_escape(match: re.Match[str]) -> str:
    char = match.group()
    return _JSON_ESCAPES.get(char) or f"\\u{ord(char):04X}"


def _table(names: list[str], cells: list[list[str]]) -> str:
    header = [name.translate(_SHOW_ESCAPES) for name in names]
    widths = [
        max(3, _width(name), *(_width(cell) for cell in column))
        for name, column in zip(header, cells, strict=True)
    ]
    border = "+" + "+".join("-" * width for width in widths) + "+\n"

    def line(row: list[str]) -> str:
        padded = (
            cell + " " * (width - _width(cell)) for cell, width in zip(row, widths, strict=True)
        )
        return "|" + "|".join(padded) + "|\n"

    rows = [line(list(row)) for row in zip(*cells, strict=True)] if cells else []
    return border + line(header) + border + "".join(rows) + border


def _width(text: str) -> int:
    """Columns `show` gives a text: UTF-16 units, East Asian wide characters twice."""
    units = len(text.encode("utf-16-le")) // 2
    return units + len(_FULL_WIDTH.findall(text))


def java_double(value: float) -> str:
    """Java's `Double.toString` of `value`, which Spark prints; `NotPrintable` where Java 17's
    may differ from the shortest text that reads back as the same double."""
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    if not 1e-3 <= abs(value) < 1e7:  # also NaN and the infinities
        raise NotPrintable(f"the double {value!r}")
    sign = "-" if value < 0 else ""
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    assert isinstance(exponent, int)  # a finite number
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    exponent += len(digit_tuple) - len(digits)
    point = len(digits) + exponent  # digits before the decimal point
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    whole, fraction = digits[:point].ljust(point, "0"), digits[point:]
    return f"{sign}{whole}.{fraction or '0'}"


def json_text(data_type: pa.DataType, value: Any) -> str | None:
    """A value's text as Spark's `to_json` writes it, where it is known here (elsewhere, a
    stable text of it): the key `result_order` sorts arrays, maps and structs by."""
    try:
        return _json_value(data_type, value)
    except NotPrintable:
        return None if value is None else repr(value)
