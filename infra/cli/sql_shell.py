"""What `tenant-windows sql` does around a query: its options, output formats, and the prompt.

pyspark is imported only to print a Spark frame: a statement answered in-process
(`storage.query.local_sql`, printed by `storage.query.spark_text`) never loads it.
"""

from __future__ import annotations

import csv
import io
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from storage.lake.tables import ALL_TABLES

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

OUTPUT_FORMATS = ("table", "csv", "json")
EXIT_WORDS = frozenset({"exit", "quit", "\\q"})
HISTORY_FILE = "tenant_windows_history"


class SqlOptionError(ValueError):
    """A `sql` option value that cannot be used, and why."""


def parse_versions(values: Sequence[str]) -> dict[str, int]:
    """`--as-of-version` values: `N` reads every table at its own version N, `TABLE=N` one
    table (and wins over `N` for that table); tables not named stay current."""
    table_names = [spec.name for spec in ALL_TABLES]
    versions: dict[str, int] = {}
    overrides: dict[str, int] = {}
    for value in values:
        table, sep, number = value.rpartition("=")
        version = _version_number(number, value)
        if not sep:
            versions = dict.fromkeys(table_names, version)
        elif table in table_names:
            overrides[table] = version
        else:
            raise SqlOptionError(
                f"--as-of-version {value}: no table {table!r}; the tables are "
                f"{', '.join(table_names)}"
            )
    return {**versions, **overrides}


def _version_number(text: str, value: str) -> int:
    if not text.isdigit():
        raise SqlOptionError(
            f"--as-of-version {value}: expected a table version N (0, 1, ...) or TABLE=N"
        )
    return int(text)


def print_frame(frame: DataFrame, output_format: str, limit: int) -> None:
    """Print at most `limit` rows of `frame` as a table, CSV (with a header) or JSON lines."""
    print(render_frame(frame, output_format, limit), end="")


def render_frame(frame: DataFrame, output_format: str, limit: int) -> str:
    """`print_frame`'s text: the rows are collected first, so nothing is printed of a statement
    that fails or is cancelled half way."""
    from pyspark.sql import functions as F

    rows = frame.limit(limit)
    out = io.StringIO()
    if output_format == "json":
        for row in rows.select(F.to_json(F.struct("*")).alias("line")).collect():
            out.write(row["line"] + "\n")
    elif output_format == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(frame.columns)
        as_text = rows.select(*(_csv_text(frame, name) for name in frame.columns))
        for row in as_text.collect():
            writer.writerow(["" if value is None else value for value in row])
    else:
        # What `show` prints, as text (PySpark's own helper behind `show`).
        out.write(frame._show_string(limit, truncate=False) + "\n")  # type: ignore[operator]
    return out.getvalue()


def _csv_text(frame: DataFrame, name: str) -> Column:
    """One column as CSV text: nested values as JSON, bytes as base64, the rest as Spark casts
    them to strings (timestamps in the session time zone, UTC)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, BinaryType, MapType, StructType

    kind = frame.schema[name].dataType
    column = F.col(f"`{name}`")
    if isinstance(kind, ArrayType | MapType | StructType):
        text = F.to_json(column)
    elif isinstance(kind, BinaryType):
        text = F.base64(column)
    else:
        text = column.cast("string")
    return text.alias(name)


def history_path() -> Path:
    state_home = os.environ.get("XDG_STATE_HOME")
    if state_home:
        return Path(state_home) / HISTORY_FILE
    return Path.home() / f".{HISTORY_FILE}"


def run_prompt(
    run_statement: Callable[[str], bool], prompt: str, stdin: TextIO, out: TextIO
) -> int:
    """Read statements (each ends with `;`, or at the end of input) and run each; `exit`,
    `quit` or end of input leave. Returns 0 if every statement ran, else 2."""
    interactive = stdin.isatty()
    if interactive:
        _enable_history()
    failures = 0
    for statement in _statements(stdin, prompt if interactive else None, out):
        if statement.rstrip(";").strip().lower() in EXIT_WORDS:
            break
        failures += 0 if run_statement(statement) else 1
    if interactive:
        _save_history()
    return 0 if failures == 0 else 2


def _statements(stdin: TextIO, prompt: str | None, out: TextIO) -> Iterator[str]:
    pending: list[str] = []
    continuation = None if prompt is None else "...> ".rjust(len(prompt))
    while True:
        line = _read_line(stdin, continuation if pending else prompt)
        if line is None:
            break
        if not pending and line.strip().rstrip(";").lower() in EXIT_WORDS:
            yield line.strip()
            return
        if line.strip():
            pending.append(line)
        if pending and line.rstrip().endswith(";"):
            yield "\n".join(pending)
            pending = []
    if pending:
        yield "\n".join(pending)
    if prompt is not None:
        print(file=out)


def _read_line(stdin: TextIO, prompt: str | None) -> str | None:
    if prompt is not None and stdin is sys.stdin:
        try:
            return input(prompt)  # readline editing and history
        except EOFError:
            return None
    line = stdin.readline()
    return None if line == "" else line.rstrip("\n")


def _enable_history() -> None:
    try:
        import readline
    except ImportError:  # not on every platform; the prompt works without it
        return
    path = history_path()
    if path.exists():
        readline.read_history_file(path)
    readline.set_history_length(1000)


def _save_history() -> None:
    try:
        import readline
    except ImportError:
        return
    path = history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    readline.write_history_file(path)
