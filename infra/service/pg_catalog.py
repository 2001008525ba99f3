"""What a Postgres client asks besides the lake's rows, answered without them: session commands
(`SET`, `SHOW`, `BEGIN`...), and the catalog (`pg_catalog`, `information_schema`, `version()`,
`current_schema()`), which psql's `\\d`, psycopg, SQLAlchemy and JDBC drivers read.

**Nothing of any tenant is in it.** The catalog is one DuckDB database per process holding the
Postgres catalog's relations and functions, built from the views' schemas (`pg_relations`:
every tenant has the same views, in schema `public`), so its answers are the same for every
tenant and no catalog statement can read a row, a tenant's name (but the caller's own, for
`current_user`) or another table. It takes one `SELECT` at a time (DuckDB's own parse says so),
with file access, extensions and settings switched off, a memory limit, and the caller's
statement timeout.

A statement that reads the catalog and a view at once is refused: the catalog holds no rows of
the views and would answer wrongly. Everything else is the lake's (`lake_statement`): Postgres
SQL turned into Spark SQL for the query service, bound parameters written in as literals.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

from infra.service import pg_relations
from infra.service.pg_wire import WireError
from storage.lake.tables import ALL_TABLES
from storage.query.local_sql import DUCKDB_CONFIG, WINDOW_CONTENTS_SQL
from storage.query.view_catalog import TENANT_VIEW_NAMES, WINDOW_CONTENTS

SERVER_VERSION = "15.0"
"""What the door says it is: clients pick their catalog queries by it (psql, SQLAlchemy)."""
VERSION_TEXT = f"PostgreSQL {SERVER_VERSION} (tenant-windows lake: Spark SQL behind)"
DATABASE = "lake"
SCHEMA = pg_relations.PUBLIC
"""Where the views are, to every client: Postgres' default schema, the one clients look in."""
_CATALOG_MEMORY = "128MB"

# What a session may SET and SHOW; only the values change (nothing reads them but SHOW), so a
# client's habitual settings work, and an unknown name is answered as Postgres would.
_SESSION_DEFAULTS = {
    "application_name": "",
    "client_encoding": "UTF8",
    "datestyle": "ISO, MDY",
    "default_transaction_isolation": "read committed",
    "default_transaction_read_only": "on",
    "extra_float_digits": "1",
    "integer_datetimes": "on",
    "intervalstyle": "postgres",
    "is_superuser": "off",
    "lc_collate": "C",
    "lc_ctype": "C",
    "lc_messages": "C",
    "lc_monetary": "C",
    "lc_numeric": "C",
    "lc_time": "C",
    "max_identifier_length": "63",
    "search_path": f'"$user", {SCHEMA}',
    "server_encoding": "UTF8",
    "server_version": SERVER_VERSION,
    "server_version_num": "150000",
    "standard_conforming_strings": "on",
    "statement_timeout": "0",
    "timezone": "UTC",
    "transaction_isolation": "read committed",
    "transaction_read_only": "on",
}
STARTUP_PARAMETERS = (
    "server_version",
    "server_encoding",
    "client_encoding",
    "datestyle",
    "timezone",
    "integer_datetimes",
    "standard_conforming_strings",
    "intervalstyle",
    "is_superuser",
    "application_name",
)
"""Sent as ParameterStatus after the handshake (Postgres' names are in `_STATUS_NAMES`)."""
STATUS_NAMES = {
    "datestyle": "DateStyle",
    "timezone": "TimeZone",
    "intervalstyle": "IntervalStyle",
}

_TRANSACTION_WORDS = {
    "begin": "BEGIN",
    "start": "START TRANSACTION",
    "commit": "COMMIT",
    "end": "COMMIT",
    "rollback": "ROLLBACK",
    "abort": "ROLLBACK",
}
_QUIET_WORDS = {"discard": "DISCARD ALL", "deallocate": "DEALLOCATE", "unlisten": "UNLISTEN"}
_LEADING_COMMENTS = re.compile(r"^(\s+|--[^\n]*(\n|$)|/\*.*?\*/)*", re.DOTALL)
_CATALOG_MARKERS = re.compile(
    r"\b(pg_catalog|information_schema|pg_[a-z_]+|version\s*\(|current_schemas?\b|"
    r"current_database|current_setting|current_user|session_user|has_[a-z_]+_privilege|"
    r"format_type|obj_description|col_description)",
    re.IGNORECASE,
)
# What DuckDB reads differently from Postgres in the statements clients send, and what it
# would answer for itself (its own version, database and user).
_REWRITES = (
    (re.compile(r"OPERATOR\s*\(\s*pg_catalog\s*\.\s*([^)\s]+)\s*\)", re.I), r"\1"),
    (re.compile(r"\s+COLLATE\s+(\"?pg_catalog\"?\s*\.\s*)?\"?(default|C)\"?", re.I), ""),
    (re.compile(r"\b(pg_catalog\s*\.\s*)?version\s*\(\s*\)", re.I), f"'{VERSION_TEXT}'"),
    (re.compile(r"\b(pg_catalog\s*\.\s*)?current_database\s*\(\s*\)", re.I), f"'{DATABASE}'"),
    # A name cast to an object id is looked up (`'public.windows'::regclass`).
    (
        re.compile(
            r"('(?:[^']|'')*')\s*::\s*(\"?pg_catalog\"?\s*\.\s*)?"
            r"(regclass|regtype|regnamespace)\b",
            re.I,
        ),
        r"to_\3(\1)",
    ),
    # The catalog's relations and functions are in DuckDB's default schema, which a cursor
    # searches first (`pg_relations`); DuckDB keeps `information_schema` for itself.
    (re.compile(r"\"?\bpg_catalog\"?\s*\.\s*(?=[a-z_\"])", re.I), ""),
    (
        re.compile(r"\"?\binformation_schema\"?\s*\.\s*(?=[a-z_\"])", re.I),
        f"{pg_relations.INFORMATION_SCHEMA}.",
    ),
    (re.compile(r"\bjson_build_object\s*\(", re.I), "json_object("),
    (re.compile(r"::\s*(regclass|regtype|regproc|regnamespace)\b", re.I), ""),
    (re.compile(r"::\s*name\b", re.I), "::VARCHAR"),
    (
        re.compile(r"\bAS\s+(regclass|regtype|regproc|regnamespace)\b", re.I),
        "AS VARCHAR",
    ),
)
_WORDS_ONLY = re.compile(r"'(?:[^']|'')*'|--[^\n]*|/\*.*?\*/", re.DOTALL)
"""String literals and comments, which name nothing."""
_USER_WORDS = re.compile(r"\b(current_user|session_user)\b(\s*\(\s*\))?", re.IGNORECASE)


@dataclass(frozen=True)
class SessionAnswer:
    """A session command's effect: its command tag, and rows for SHOW."""

    tag: str
    rows: pa.Table | None = None
    transaction: bool | None = None
    """True: a transaction starts; False: it ends; None: unchanged."""


@dataclass
class SessionSettings:
    """One connection's settings, as SET left them."""

    values: dict[str, str] = field(default_factory=lambda: dict(_SESSION_DEFAULTS))

    def status(self, name: str) -> str:
        return self.values.get(name, "")


def first_word(sql: str) -> str:
    text = _LEADING_COMMENTS.sub("", sql, count=1)
    match = re.match(r"[A-Za-z_]+", text)
    return match.group(0).lower() if match else ""


def session_command(sql: str, settings: SessionSettings) -> SessionAnswer | None:
    """The answer to a session command (None: not one)."""
    word = first_word(sql)
    text = _LEADING_COMMENTS.sub("", sql, count=1).strip().rstrip(";").strip()
    if word in ("savepoint", "release") or re.match(
        r"ROLLBACK\s+(WORK\s+|TRANSACTION\s+)?TO\b", text, re.I
    ):
        # Nothing is written, so a savepoint has nothing to keep or undo.
        return SessionAnswer({"savepoint": "SAVEPOINT", "release": "RELEASE"}.get(word, "ROLLBACK"))
    if word in _TRANSACTION_WORDS:
        return SessionAnswer(_TRANSACTION_WORDS[word], transaction=word in ("begin", "start"))
    if word in _QUIET_WORDS:
        return SessionAnswer(_QUIET_WORDS[word])
    if word == "set":
        _set(text, settings)
        return SessionAnswer("SET")
    if word == "reset":
        name = text.split(None, 1)[1].strip().lower() if " " in text else ""
        if name == "all":
            settings.values = dict(_SESSION_DEFAULTS)
        elif name in _SESSION_DEFAULTS:
            settings.values[name] = _SESSION_DEFAULTS[name]
        return SessionAnswer("RESET")
    if word == "show":
        name = " ".join(text.split()[1:]).lower()
        if name == "transaction isolation level":
            name = "transaction_isolation"
        if name == "all":
            names = sorted(settings.values)
            rows = pa.table(
                {
                    "name": names,
                    "setting": [settings.values[n] for n in names],
                    "description": [""] * len(names),
                }
            )
            return SessionAnswer("SHOW", rows)
        if name not in settings.values:
            raise WireError("42704", f'unrecognized configuration parameter "{name}"')
        return SessionAnswer("SHOW", pa.table({name: [settings.values[name]]}))
    return None


def _set(text: str, settings: SessionSettings) -> None:
    """SET [SESSION|LOCAL] name {TO|=} value, SET TIME ZONE value, SET SESSION
    CHARACTERISTICS ...: remembered where a SHOW would read it, else accepted as is."""
    words = text.split(None, 1)[1] if " " in text else ""
    words = re.sub(r"^(SESSION|LOCAL)\s+", "", words, flags=re.I)
    if re.match(r"TIME\s+ZONE\s+", words, re.I):
        name, value = "timezone", re.sub(r"^TIME\s+ZONE\s+", "", words, flags=re.I)
    else:
        match = re.match(r"([A-Za-z_][\w.]*)\s*(=|\s+TO\s+|\s)\s*(.*)$", words, re.I | re.S)
        if match is None:
            return  # SET SESSION CHARACTERISTICS, SET TRANSACTION ...: nothing to remember
        name, value = match.group(1).lower(), match.group(3)
    value = value.strip().strip("'\"")
    if name in _SESSION_DEFAULTS and not name.startswith(("server_", "is_superuser")):
        settings.values[name] = "UTC" if name == "timezone" and value.lower() == "utc" else value


def reads_catalog(sql: str) -> bool:
    """Whether a statement is the catalog's: it names a catalog relation or function. Refused
    (`WireError`) if it reads a lake view too. A catalog's name inside a string or a comment
    (`WHERE source = 'pg_web'`) is not the catalog's."""
    if _CATALOG_MARKERS.search(_WORDS_ONLY.sub(" ", sql)) is None:
        return False
    try:
        trees = sqlglot.parse(sql, read="postgres")
    except sqlglot.errors.SqlglotError:
        return True  # the catalog database reads it, or refuses it, by its own parse
    for tree in trees:
        if tree is None:
            continue
        ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
        for table in tree.find_all(exp.Table):
            name = table.name.lower()
            if _is_view_name(table) and name in TENANT_VIEW_NAMES and name not in ctes:
                raise WireError(
                    "0A000",
                    "a statement reads either the catalog (pg_catalog, information_schema) "
                    "or the lake's views, not both",
                )
    return True


class CatalogDatabase:
    """The catalog's DuckDB database (see the module's doc): built once, read by every
    connection through a cursor of its own."""

    def __init__(self) -> None:
        config = {**DUCKDB_CONFIG, "threads": 1}
        self._database = duckdb.connect(":memory:", config=config)
        self._lock = threading.Lock()
        database = self._database
        # Empty tables of the views' columns: window_contents' are those of its statement.
        database.execute(f"CREATE SCHEMA {SCHEMA}")
        for spec in ALL_TABLES:
            database.register("empty_view", spec.schema.empty_table())
            database.execute(f"CREATE TABLE {SCHEMA}.{spec.name} AS SELECT * FROM empty_view")
            database.unregister("empty_view")
        database.execute(f"SET search_path = '{SCHEMA}'")
        contents = database.sql(f"SELECT * FROM ({WINDOW_CONTENTS_SQL}) LIMIT 0").to_arrow_table()
        database.execute("RESET search_path")
        views = {spec.name: spec.schema for spec in ALL_TABLES}
        definition = sqlglot.transpile(
            WINDOW_CONTENTS_SQL, read="duckdb", write="spark", pretty=True
        )
        pg_relations.install(
            database,
            {**views, WINDOW_CONTENTS: contents.schema},
            {WINDOW_CONTENTS: " " + definition[0].replace("\n", "\n ") + ";"},
            {**_SESSION_DEFAULTS, "default_table_access_method": "heap"},
        )
        database.execute(f"SET memory_limit = '{_CATALOG_MEMORY}'")
        database.execute("SET TimeZone = 'UTC'")
        database.execute("SET lock_configuration = true")

    def answer(self, sql: str, tenant: str, params: Sequence[Any], timeout_s: float) -> pa.Table:
        """The rows of one catalog `SELECT`, as DuckDB answers it once the Postgres-only parts
        are rewritten; `WireError` for anything else."""
        for pattern, replacement in _REWRITES:
            sql = pattern.sub(replacement, sql)
        quoted_tenant = tenant.replace("'", "''")
        sql = _USER_WORDS.sub(f"'{quoted_tenant}'", sql)
        with self._lock:
            cursor = self._database.cursor()
        timer = threading.Timer(timeout_s, cursor.interrupt)
        try:
            try:
                statements = cursor.extract_statements(sql)
            except duckdb.Error as error:
                raise WireError("42601", _one_line(error)) from None
            if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
                raise WireError("25006", "the catalog answers one SELECT at a time (read only)")
            timer.start()
            try:
                relation = cursor.sql(sql, params=list(params) or None)
                table = relation.to_arrow_table() if relation is not None else pa.table({})
                # Postgres names a column of `version()` "version", not by the text put there.
                names = {f"'{VERSION_TEXT}'": "version", f"'{DATABASE}'": "current_database"}
                names[f"'{quoted_tenant}'"] = "current_user"
                return table.rename_columns([names.get(n, n) for n in table.column_names])
            except duckdb.InterruptException:
                raise WireError("57014", "canceling statement due to statement timeout") from None
            except duckdb.Error as error:
                raise WireError(_sqlstate(error), _one_line(error)) from None
        finally:
            timer.cancel()
            cursor.close()


def _sqlstate(error: duckdb.Error) -> str:
    if isinstance(error, duckdb.CatalogException):
        return "42P01"
    if isinstance(error, duckdb.ParserException):
        return "42601"
    if isinstance(error, duckdb.BinderException):
        return "42703"
    return "XX000"


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:500]


def lake_statement(sql: str, params: Sequence[Any]) -> str:
    """A statement for the query service: Postgres SQL as Spark SQL, with the bound
    parameters (`$1`...) as literals. What sqlglot cannot read as one Postgres statement is
    passed on as written (Spark SQL), for the guard to accept or refuse."""
    try:
        trees = [tree for tree in sqlglot.parse(sql, read="postgres") if tree is not None]
    except sqlglot.errors.SqlglotError:
        trees = []
    if len(trees) != 1:
        if params:
            raise WireError("42601", "a statement with parameters must be one Postgres statement")
        return sql
    tree = trees[0]
    for name in tree.find_all(exp.Table, exp.Column):
        if isinstance(name, exp.Table | exp.Column) and name.args.get("db") and _is_view_name(name):
            # `public.windows` (and `public.windows.source`), as clients that qualify every
            # name write them, are the view (and its column).
            name.set("db", None)
            name.set("catalog", None)
    for parameter in list(tree.find_all(exp.Parameter, exp.Placeholder)):
        number = parameter.this.this if isinstance(parameter.this, exp.Literal) else None
        if number is None or not str(number).isdigit() or not 1 <= int(number) <= len(params):
            raise WireError("08P01", f"no value bound for parameter {parameter.sql()}")
        parameter.replace(_literal(params[int(number) - 1]))
    return tree.sql(dialect="spark")


def _is_view_name(name: exp.Table | exp.Column) -> bool:
    """Whether a relation's (or a column's relation's) qualifiers, if any, are where the views
    are (`lake.public`)."""
    db, catalog = name.args.get("db"), name.args.get("catalog")
    return (db is None or db.name.lower() == SCHEMA) and (
        catalog is None or catalog.name.lower() == DATABASE
    )


def _literal(value: Any) -> exp.Expr:
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | float) or type(value).__name__ == "Decimal":
        return exp.Literal.number(str(value))
    return exp.Literal.string(str(value))
