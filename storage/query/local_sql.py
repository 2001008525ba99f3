"""Statements answered in this process by DuckDB, over a tenant's rows only (or, for the
operator's `tenant-windows sql`, every tenant's rows): the runner.

A Spark job costs 130-190 ms for the smallest statement, and eight at once queue on a 2-core
query host (docs/querying.md, "Latency"). Most of a tenant's ad-hoc statements read a few
thousand rows; those the query service and `tenant-windows sql` answer here, in milliseconds.
Three modules, one idea each:

- **Which statements** (`portable_sql.local_statement`): only a statement whose every part means
  the same in both engines runs here; anything else, any DuckDB error, and a tenant whose rows
  pass `max_tenant_bytes`, goes to Spark.
- **Which rows** (`tenant_rows.TenantRows`): a tenant's rows of each table, read once per data
  file, within a byte budget.
- **Running them** (here): scope by construction: each tenant has a DuckDB database of its own
  that holds nothing. A statement's cursor registers that tenant's Arrow tables, only those the
  statement names (`window_contents`: `windows` and `events`), and nothing else. File access,
  extension installs and every setting are switched off and locked before any statement runs.
- **Two parsers still agree:** the guard (`sql_guard.check_query`) has accepted the statement.
  DuckDB never reads the tenant's text, only what sqlglot generates from the accepted tree,
  and its own parse of that must name only the registered tables and allow-listed functions.
- **Rows in the rule's order:** a statement without `ORDER BY` gets its rows sorted by
  `result_order`'s rule, before its `LIMIT`, so they equal Spark's and come in the same order
  from every door.
- **Limits:** the statement timeout interrupts the cursor (408, as on Spark); at most
  `max_result_rows + 1` rows are returned; each tenant's database has a memory limit and one
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
from sqlglot import exp

from storage.lake.delta_lake import DeltaLake
from storage.lake.table_files import TableFiles
from storage.lake.tables import ALL_TABLES, EVENTS, LAKE_TABLES, WINDOWS
from storage.query.portable_sql import DUCKDB_FUNCTIONS, KINDS, OPERATOR_KINDS, local_statement
from storage.query.result_order import order_rows, statement_order
from storage.query.tenant_rows import TenantRows
from storage.query.view_catalog import WINDOW_CONTENTS
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
MAX_UNORDERED_ROWS = 100_000
"""A statement without `ORDER BY` is sorted here by the rule (`result_order`), all its rows at
once: one with more rows than this is left to Spark, which sorts it on its executors."""


class StatementTimeout(Exception):  # noqa: N818 - an outcome, named as the caller reports it
    """The statement ran past its timeout and was interrupted."""


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
        them, in `result_order`'s order where the statement gives none; None when Spark must
        answer. `tenant` None: the operator's views, every tenant's
        rows. `StatementTimeout` when reading the rows and running the statement together take
        longer than `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        specs, kinds = (ALL_TABLES, KINDS) if tenant is not None else (LAKE_TABLES, OPERATOR_KINDS)
        order = statement_order(tree)
        sql = local_statement(order.unlimited, max_joins, kinds)
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
            fetched = max_rows if order.ordered else MAX_UNORDERED_ROWS + 1
            answer = _fetch(cursor, sql, fetched, deadline - time.monotonic())
            if not order.ordered:
                if answer.num_rows > MAX_UNORDERED_ROWS:
                    return None
                answer = order.cut(order_rows(answer)).slice(0, max_rows)
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
            if str(node.get("function_name", "")).lower() not in DUCKDB_FUNCTIONS:
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
"""`spark_views.window_contents` in DuckDB's SQL: the same columns, in the same order."""
