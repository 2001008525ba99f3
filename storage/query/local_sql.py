"""Small statements answered in this process by DuckDB, over a tenant's rows only (or, for the
operator's `tenant-windows sql`, every tenant's rows).

A Spark job costs 130-190 ms for the smallest statement, and eight at once queue on a 2-core
query host (docs/querying.md, "Latency"). Most of a tenant's ad-hoc statements read a few
thousand rows; those the query service answers here, in milliseconds:

- **Rows** (`TenantRows`): a tenant's rows of each table, read with pyarrow from the files the
  table's index lists for that tenant (`table_files.TableFiles.files_of`), once per data file.
  Delta never changes a file, so a new table version costs only the files it added.
- **Scope by construction:** each tenant has a DuckDB database of its own that holds nothing. A
  statement's cursor registers that tenant's Arrow tables and nothing else. File access,
  extension installs and every setting are switched off and locked before any statement runs.
- **Spark's answer, or none:** only a statement whose every part means the same in both
  engines runs here (`local_statement`): a small set of clauses, operators and functions, with
  comparisons whose operand types agree, and Spark's names for unaliased aggregates. Anything
  else, any DuckDB error, and a tenant whose rows pass `max_tenant_bytes`, goes to Spark: its
  refusals, errors and odd cases stay Spark's own. `tests/integration/query/test_local_sql.py` runs
  a corpus of statements on both engines and compares rows, names and types.
- **Only what it names:** a statement's cursor registers the tables it names (`window_contents`:
  `windows` and `events`), so a one-shot process (`tenant-windows sql`) reads no other table.
- **Two parsers still agree:** the guard (`sql_guard.check_query`) has accepted the statement.
  DuckDB never reads the tenant's text, only what sqlglot generates from the accepted tree,
  and its own parse of that must name only the registered tables and allow-listed functions.
- **Limits:** the statement timeout interrupts the cursor (408, as on Spark); at most
  `max_result_rows + 1` rows are fetched; each tenant's database has a memory limit and one
  thread, so one tenant's statement takes one core at most.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from storage.lake.delta_lake import DeltaLake
from storage.lake.snapshot_reader import read_files
from storage.lake.table_files import TableFiles
from storage.lake.tables import ALL_TABLES, EVENTS, LAKE_TABLES, WINDOWS, TableSpec
from storage.query.view_tables import WINDOW_CONTENTS
from tenants.settings import QuerySettings

log = logging.getLogger(__name__)

DUCKDB_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    # Nothing outside the registered Arrow tables: no files (read_csv, COPY, ATTACH), no
    # extension downloads or loads behind a function call.
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    # Spark's order: NULLs first ascending, last descending.
    "default_null_order": "nulls_first_on_asc_last_on_desc",
    "threads": 1,
}
_DATABASE_MEMORY = "512MB"
_FETCH_BATCH_ROWS = 2_048

# Parts of a Spark statement that DuckDB evaluates alike (same result, same type), given
# operands of agreeing types (`_Kinds`). Exact types: a subclass may mean something else.
_LOCAL_NODES = frozenset(
    {
        exp.Select, exp.From, exp.Join, exp.Where, exp.Group, exp.Having, exp.Order,
        exp.Ordered, exp.Limit, exp.Column, exp.Identifier, exp.Star, exp.Table,
        exp.TableAlias, exp.Alias, exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.EQ,
        exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.And, exp.Or, exp.Not, exp.Is, exp.In,
        exp.Between, exp.Add, exp.Sub, exp.Mul, exp.Neg, exp.Count, exp.Sum, exp.Min, exp.Max,
        exp.Avg, exp.Distinct, exp.Upper, exp.Lower, exp.Coalesce, exp.With, exp.CTE,
        exp.Subquery, exp.Union,
    }
)  # fmt: skip
# Spark's name for an unaliased aggregate of a column, by the node sqlglot reads.
_SPARK_AGGREGATE_NAMES: dict[type[exp.Expr], str] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Min: "min",
    exp.Max: "max",
}
# DuckDB's names for the functions and operators the nodes above become.
_DUCKDB_FUNCTIONS = frozenset(
    {"count", "count_star", "sum", "min", "max", "avg", "upper", "lower", "+", "-", "*"}
)
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


class StatementTimeout(Exception):  # noqa: N818 - an outcome, named as the caller reports it
    """The statement ran past its timeout and was interrupted."""


def _kind(data_type: pa.DataType) -> str:
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "string"
    if pa.types.is_integer(data_type) or pa.types.is_floating(data_type):
        return "number"
    if pa.types.is_timestamp(data_type) or pa.types.is_date(data_type):
        return "time"
    if pa.types.is_boolean(data_type):
        return "bool"
    return "other"


def _column_kinds(specs: tuple[TableSpec, ...]) -> dict[str, str]:
    """Each column name's kind of value over every view; a name with two kinds has none."""
    kinds: dict[str, str] = {}
    for spec in specs:
        for column in spec.schema:
            kind = _kind(column.type)
            kinds[column.name] = kind if kinds.get(column.name, kind) == kind else "mixed"
    return kinds


_KINDS = _column_kinds(ALL_TABLES)
_OPERATOR_KINDS = _column_kinds(LAKE_TABLES)
"""The operator's views also hold `deliveries`."""


def local_statement(
    tree: exp.Query, max_joins: int, kinds: Mapping[str, str] = _KINDS
) -> str | None:
    """DuckDB's text for a statement the guard accepted, if DuckDB answers it exactly as Spark
    would; None sends it to Spark. `kinds`: each column name's kind of value over the views."""
    joins = 0
    for node in tree.walk():
        if type(node) not in _LOCAL_NODES:
            return None
        if isinstance(node, exp.Join):
            joins += 1
            if not _is_equi_join(node):
                return None
        elif isinstance(node, exp.Table) and node.name.lower() == WINDOW_CONTENTS:
            joins += 1  # the view is a join of windows and events, as Spark counts it
        elif isinstance(node, exp.In) and node.args.get("query") is not None:
            return None
        elif isinstance(node, (*_COMPARISONS, exp.In, exp.Between, exp.Coalesce)):
            if not _comparable({_kind_of(operand, kinds) for operand in _operands(node)}):
                return None
        elif isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Neg)):
            if _kind_of(node, kinds) != "number":
                return None
        elif not _argument_fits(node, kinds):
            return None
    if joins > max_joins:
        return None  # Spark refuses it, in its own words
    local = tree.copy()
    for select in local.find_all(exp.Select):
        if not _name_as_spark(select):
            return None
    return local.sql(dialect="duckdb", comments=False)


_EQUI_JOIN_KINDS = frozenset({("", ""), ("", "INNER"), ("LEFT", ""), ("LEFT", "OUTER")})


def _is_equi_join(join: exp.Join) -> bool:
    """An inner or left join on an equality of columns: a join without one is a nested loop,
    whose size only Spark's estimate refuses."""
    if join.args.get("method") or (join.side, join.kind) not in _EQUI_JOIN_KINDS:
        return False
    if join.args.get("using"):
        return True
    condition = join.args.get("on")
    conjuncts = list(condition.flatten()) if isinstance(condition, exp.And) else [condition]
    return any(
        isinstance(part, exp.EQ)
        and isinstance(part.this, exp.Column)
        and isinstance(part.expression, exp.Column)
        for part in conjuncts
    )


_ORDERED = frozenset({"number", "string", "time", "bool"})
# The argument a function needs to mean the same in both engines.
_ARGUMENT_KINDS: dict[type[exp.Expr], frozenset[str]] = {
    exp.Sum: frozenset({"number"}),
    exp.Avg: frozenset({"number"}),
    exp.Min: _ORDERED,
    exp.Max: _ORDERED,
    exp.Upper: frozenset({"string"}),
    exp.Lower: frozenset({"string"}),
}


def _argument_fits(node: exp.Expr, kinds: Mapping[str, str]) -> bool:
    wanted = _ARGUMENT_KINDS.get(type(node))
    return wanted is None or _kind_of(node.this, kinds) in wanted


def _comparable(kinds: set[str]) -> bool:
    """Operands Spark and DuckDB compare alike: of one kind, or a time with text (both read the
    text as a time, in UTC). Text beside a number is cast differently by each."""
    kinds = kinds - {"null"}
    if kinds <= {"string", "string literal"} or kinds <= {"time", "string literal"}:
        return bool(kinds - {"string literal"}) or kinds == {"string literal"}
    return len(kinds) == 1 and kinds <= _ORDERED


def _operands(node: exp.Expr) -> list[exp.Expr]:
    if isinstance(node, exp.Coalesce):
        return [node.this, *node.expressions]
    if isinstance(node, exp.In):
        return [node.this, *node.expressions]
    if isinstance(node, exp.Between):
        return [node.this, node.args["low"], node.args["high"]]
    return [node.this, node.expression]


def _kind_of(node: exp.Expr, kinds: Mapping[str, str]) -> str:
    """What kind of value an operand is ("?": unknown, which keeps the statement on Spark)."""
    if isinstance(node, exp.Paren):
        return _kind_of(node.this, kinds)
    if isinstance(node, exp.Column):
        return kinds.get(node.name.lower(), "?")
    if isinstance(node, exp.Literal):
        return "string literal" if node.is_string else "number"
    if isinstance(node, exp.Null):
        return "null"
    if isinstance(node, (exp.Count, exp.Sum, exp.Avg)):
        return "number"
    if isinstance(node, (exp.Min, exp.Max)):
        return _kind_of(node.this, kinds)
    if isinstance(node, (exp.Upper, exp.Lower)):
        return "string"
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul)):
        operands = {_kind_of(node.this, kinds), _kind_of(node.expression, kinds)}
        return "number" if operands == {"number"} else "?"
    if isinstance(node, exp.Neg):
        return "number" if _kind_of(node.this, kinds) == "number" else "?"
    return "?"


def _name_as_spark(select: exp.Select) -> bool:
    """Give unaliased aggregates of a column Spark's output names; False where the name Spark
    would give is not known here."""
    has_join = bool(select.args.get("joins"))
    for position, projection in enumerate(select.expressions):
        if isinstance(projection, exp.Alias):
            continue
        if isinstance(projection, exp.Column):
            if isinstance(projection.this, exp.Star):
                if has_join:
                    return False
                continue
            # Spark names the column as the statement writes it; DuckDB as the table does.
            projection.replace(exp.alias_(projection.copy(), projection.name, quoted=True))
            continue
        if isinstance(projection, exp.Star):
            if has_join:
                return False  # Spark keeps duplicate column names, DuckDB renames them
            continue
        name = _spark_aggregate_name(projection)
        if name is None:
            return False
        select.expressions[position].replace(exp.alias_(projection, name, quoted=True))
    return True


def _spark_aggregate_name(node: exp.Expr) -> str | None:
    function = _SPARK_AGGREGATE_NAMES.get(type(node))
    argument = node.this
    if function is None:
        return None
    if isinstance(node, exp.Count) and isinstance(argument, exp.Star):
        return "count(1)"
    if isinstance(node, exp.Count) and isinstance(argument, exp.Distinct):
        counted = argument.expressions
        if len(counted) != 1 or not _is_plain_column(counted[0]):
            return None
        return f"count(DISTINCT {counted[0].name})"
    return f"{function}({argument.name})" if _is_plain_column(argument) else None


def _is_plain_column(node: exp.Expr | None) -> bool:
    return isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier)


@dataclass(frozen=True)
class _Piece:
    files: frozenset[str]
    rows: pa.Table


@dataclass(frozen=True)
class _Kept:
    """A tenant's rows of one table at one version, by the groups of files they were read from
    (`rows` None: more than the engine takes)."""

    version: int
    pieces: tuple[_Piece, ...]
    rows: pa.Table | None
    nbytes: int


@dataclass
class TenantRows:
    """Each tenant's rows of each table (tenant None: every tenant's), read once per data file,
    within a byte budget: the least recently queried tenant's rows go first."""

    lake: DeltaLake
    max_bytes: int
    _kept: collections.OrderedDict[tuple[str | None, str], _Kept] = field(
        default_factory=collections.OrderedDict
    )
    _kept_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def of(
        self, tenant: str | None, spec: TableSpec, table: TableFiles | None, max_bytes: int
    ) -> pa.Table | None:
        """`tenant`'s rows of `table`'s version (None: every tenant's), or None if they pass
        `max_bytes`. A table that does not exist (None) has no rows."""
        if table is None:
            return spec.schema.empty_table()
        key, version = (tenant, spec.name), table.version
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                if kept.version == version:
                    return kept.rows
        sizes = table.files_of(tenant)
        if sum(sizes.values()) > max_bytes:  # stored sizes: compressed, so fewer than in memory
            self._keep(key, _Kept(version, (), None, 0))
            return None
        files = frozenset(sizes)
        pieces = [piece for piece in (kept.pieces if kept else ()) if piece.files <= files]
        missing = files.difference(*(piece.files for piece in pieces))
        if missing:
            rows = read_files(
                table.table_uri,
                table.partition_schema,
                sorted(missing),
                spec.schema,
                self.lake.storage_options,
                row_filter=None if tenant is None else pc.field("tenant") == tenant,
            )
            pieces.append(_Piece(frozenset(missing), rows))
        nbytes = sum(piece.rows.nbytes for piece in pieces)
        if nbytes > max_bytes:
            self._keep(key, _Kept(version, (), None, 0))
            return None
        joined = (
            pa.concat_tables(piece.rows for piece in pieces)
            if pieces
            else spec.schema.empty_table()
        )
        self._keep(key, _Kept(version, tuple(pieces), joined, nbytes))
        return joined

    def _keep(self, key: tuple[str | None, str], kept: _Kept) -> None:
        with self._lock:
            previous = self._kept.pop(key, None)
            self._kept_bytes += kept.nbytes - (previous.nbytes if previous else 0)
            self._kept[key] = kept
            while self._kept_bytes > self.max_bytes and len(self._kept) > 1:
                _, evicted = self._kept.popitem(last=False)
                self._kept_bytes -= evicted.nbytes


@dataclass
class LocalSql:
    """Answers small statements in-process (see the module's doc): a tenant's, or with scope
    None the operator's, over every tenant's rows and `deliveries`."""

    lake: DeltaLake
    max_tenant_bytes: int
    cache_bytes: int
    max_databases: int = 256
    _rows: TenantRows = field(init=False)
    _databases: collections.OrderedDict[str | None, duckdb.DuckDBPyConnection] = field(
        default_factory=collections.OrderedDict
    )
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rows = TenantRows(self.lake, self.cache_bytes)

    @classmethod
    def of_settings(cls, lake: DeltaLake, query: QuerySettings) -> LocalSql:
        """The engine with `query.local_max_tenant_bytes` and `query.local_cache_bytes`."""
        return cls(lake, query.local_max_tenant_bytes, query.local_cache_bytes)

    def answer(
        self,
        tenant: str | None,
        tree: exp.Query,
        tables: Mapping[str, TableFiles | None],
        max_joins: int,
        max_rows: int,
        timeout_s: float,
    ) -> pa.Table | None:
        """At most `max_rows` rows of the statement's result over `tables` (their files at the
        versions to read; None: a table not written, which has no rows), as Spark would give
        them; None when Spark must answer. `tenant` None: the operator's views, every tenant's
        rows. `StatementTimeout` when reading the rows and running the statement together take
        longer than `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        specs, kinds = (
            (ALL_TABLES, _KINDS) if tenant is not None else (LAKE_TABLES, _OPERATOR_KINDS)
        )
        sql = local_statement(tree, max_joins, kinds)
        if sql is None:
            return None
        named = _named_tables(tree)
        rows: dict[str, pa.Table] = {}
        for spec in specs:
            if spec.name not in named:
                continue
            table_rows = self._rows.of(tenant, spec, tables[spec.name], self.max_tenant_bytes)
            if table_rows is None:
                return None
            rows[spec.name] = table_rows
        cursor = self._database(tenant).cursor()
        try:
            for name, table in rows.items():
                cursor.register(name, table)
            if not _reads_only(cursor, sql, set(rows) | {WINDOW_CONTENTS} | _cte_names(tree)):
                log.warning("DuckDB reads a statement otherwise than the guard; Spark answers")
                return None
            if any(t.name.lower() == WINDOW_CONTENTS for t in tree.find_all(exp.Table)):
                cursor.sql(WINDOW_CONTENTS_SQL).create_view(WINDOW_CONTENTS)
            answer = _fetch(cursor, sql, max_rows, deadline - time.monotonic())
            if time.monotonic() > deadline:
                raise StatementTimeout()  # as on Spark: a result past the timeout is not sent
            return _as_spark_types(answer)
        except StatementTimeout:
            raise
        except (duckdb.Error, pa.ArrowException) as error:
            log.debug("DuckDB did not answer (%s); Spark answers", error)
            return None
        finally:
            cursor.close()

    def _database(self, tenant: str | None) -> duckdb.DuckDBPyConnection:
        with self._lock:
            database = self._databases.get(tenant)
            if database is not None:
                self._databases.move_to_end(tenant)
                return database
        database = duckdb.connect(":memory:", config=DUCKDB_CONFIG)
        database.execute(f"SET memory_limit = '{_DATABASE_MEMORY}'")
        database.execute(
            "SET TimeZone = 'UTC'"
        )  # Spark's session time zone (streaming.pipeline.spark_session)
        database.execute("SET lock_configuration = true")
        with self._lock:
            self._databases[tenant] = database
            while len(self._databases) > self.max_databases:
                self._databases.popitem(last=False)[1].close()
        return database


def _fetch(
    cursor: duckdb.DuckDBPyConnection, sql: str, max_rows: int, timeout_s: float
) -> pa.Table:
    timed_out = threading.Event()

    def interrupt() -> None:
        timed_out.set()
        cursor.interrupt()

    if timeout_s <= 0:
        raise StatementTimeout()
    timer = threading.Timer(timeout_s, interrupt)
    timer.start()
    try:
        reader = cursor.sql(sql).to_arrow_reader(_FETCH_BATCH_ROWS)
        batches: list[pa.RecordBatch] = []
        fetched = 0
        for batch in reader:
            batches.append(batch)
            fetched += batch.num_rows
            if fetched >= max_rows:
                break
        return pa.Table.from_batches(batches, reader.schema).slice(0, max_rows)
    except duckdb.InterruptException:
        if timed_out.is_set():
            raise StatementTimeout() from None
        raise
    finally:
        timer.cancel()


def _reads_only(cursor: duckdb.DuckDBPyConnection, sql: str, relations: set[str]) -> bool:
    """Whether DuckDB's own parse of `sql` is one SELECT calling only allow-listed functions
    and reading only `relations`."""
    [(parsed,)] = cursor.execute("SELECT json_serialize_sql(?)", [sql]).fetchall()
    tree = orjson.loads(parsed)
    if tree.get("error") or len(tree["statements"]) != 1:
        return False
    for node in _json_nodes(tree["statements"][0]):
        if node.get("class") == "FUNCTION":
            if node.get("schema") or node.get("catalog"):
                return False
            if str(node.get("function_name", "")).lower() not in _DUCKDB_FUNCTIONS:
                return False
        elif node.get("type") == "BASE_TABLE":
            if node.get("schema_name") or node.get("catalog_name"):
                return False
            if str(node.get("table_name", "")).lower() not in relations:
                return False
        elif node.get("type") in ("TABLE_FUNCTION", "SHOW_REF", "PIVOT", "EXPRESSION_LIST"):
            return False
    return True


def _json_nodes(value: Any) -> Iterator[dict[str, Any]]:
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            yield item
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _cte_names(tree: exp.Query) -> set[str]:
    return {cte.alias.lower() for cte in tree.find_all(exp.CTE)}


def _named_tables(tree: exp.Query) -> set[str]:
    """The tables a statement may read: every relation it names (a CTE's name too, which only
    costs a read), and `window_contents`' two."""
    names = {table.name.lower() for table in tree.find_all(exp.Table)}
    if WINDOW_CONTENTS in names:
        names |= {WINDOWS.name, EVENTS.name}
    return names


def _as_spark_types(table: pa.Table) -> pa.Table:
    """DuckDB's result in the Arrow types Spark gives: a sum of integers is a bigint (DuckDB's
    is a 128-bit integer; the cast fails, and Spark answers, where it would overflow), and
    times are in "UTC" (DuckDB names the zone Etc/UTC)."""
    return table.cast(pa.schema([pa.field(f.name, _spark_type(f.type)) for f in table.schema]))


def _spark_type(data_type: pa.DataType) -> pa.DataType:
    if data_type == pa.decimal128(38, 0):
        return pa.int64()
    if pa.types.is_timestamp(data_type) and data_type.tz is not None:
        return pa.timestamp(data_type.unit, tz="UTC")
    return data_type


WINDOW_CONTENTS_SQL = """
SELECT pane.tenant, pane.source, pane.window_id, pane.window_start, pane.window_end,
    pane.window_date, pane.pane_index, pane.timing AS pane_timing, pane.is_final,
    pane.count AS pane_count, record.window_id AS record_window_id,
    record.pane_index AS record_pane_index, record.timing AS record_timing, record.event_time,
    record.event_id, record.topic, record.partition, record.offset, record.payload,
    record.batch_id AS record_batch_id
FROM windows AS pane JOIN events AS record
    ON record.tenant = pane.tenant AND record.source = pane.source
    AND ((record.window_id = pane.window_id AND record.pane_index <= pane.pane_index)
        OR list_contains(pane.merged_window_ids, record.window_id))
"""
"""`sql_views.window_contents` in DuckDB's SQL: the same columns, in the same order."""
