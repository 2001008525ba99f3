"""The query service's engine: one warm Spark session answering every tenant's SQL, with limits.

Free of HTTP (`infra.service.query_api` is the door). Every statement of a tenant goes through all
four layers of `scoped_sql.TenantSql`; the operator's through the guard and Spark's plan check,
over the unscoped views. What a statement may use is bounded per tenant (`QueryLimits`):

- length, checked before anything parses it;
- concurrency and rate, checked before it reaches Spark (429 with a retry hint);
- time: its Spark jobs run in a job group of their own, cancelled at the timeout;
- size: Spark collects at most `max_result_rows + 1` rows, and the result is cut to the row and
  byte limits (`truncated`);
- each tenant's jobs run in one of `QUERY_POOLS` FAIR scheduler pools (`scheduler_pool`), so one
  tenant's heavy statement shares the executors with another's small one instead of queueing
  it. The pools are declared up front (`fair_scheduler_conf`): Spark never forgets a pool, so
  one per tenant would grow with every tenant that ever queried, and Spark warns about each
  pool it was not told of.

Views are opened once per tenant and kept while no table has a new version: a small query pays
for its own plan only, not for listing the lake. A result is remembered for the same scope,
statement, table versions and limits, so a dashboard polling a statement costs one Spark job per
new table version, not one per poll.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.logger import PySparkLogger
from pyspark.sql import DataFrame, SparkSession
from sqlglot import exp

from storage.lake.delta_lake import DeltaLake
from storage.lake.newest_tables import NewestTables
from storage.lake.s3_options import LakeUnavailableError
from storage.lake.table_files import TableFiles
from storage.lake.tables import ALL_TABLES, LAKE_TABLES
from storage.query.local_sql import LocalSql, StatementTimeout
from storage.query.query_errors import (
    UNDEFINED_COLUMN,
    UNDEFINED_TABLE,
    QueryError,
    check_statement_length,
    statement_timeout,
    unknown_name,
)
from storage.query.result_order import order_frame, statement_order
from storage.query.scoped_sql import (
    ResourceRefused,
    TenantSql,
    check_constant_sizes,
    check_spark_plan,
    plan_nodes,
    tree_nodes,
)
from storage.query.spark_views import register_views
from storage.query.sql_guard import QueryRefused, UnknownRelation, check_query
from storage.query.unknown_names import UnknownColumnError, check_columns
from storage.query.view_catalog import (
    OPERATOR_VIEW_NAMES,
    TENANT_VIEW_NAMES,
    LakeNotWrittenError,
    TableVersionError,
    view_columns,
)
from tenants.models import QueryLimits

log = logging.getLogger(__name__)
_Result = TypeVar("_Result")

OPERATOR = None
"""The scope of the operator's key: every tenant, and `deliveries`."""
_CANCEL_GRACE_S = 5.0
_REMEMBERED_RESULTS = 1_024
_REMEMBERED_RESULT_BYTES = 1024 * 1024
_NESTED_LOOP_JOINS = frozenset({"BroadcastNestedLoopJoinExec", "CartesianProductExec"})
_NESTED_LOOP_MAX_BYTES = 256 * 1024 * 1024
# Spark's own words for a statement that would not fit in memory.
_RESOURCE_ERRORS = ("exceeding the array size limit", "OutOfMemoryError", "too large")
QUERY_POOLS = 32
"""FAIR scheduler pools the tenants are spread over, by a hash of their id: a fixed number, as
Spark keeps every pool it made for the life of the session and sorts them all at each scheduling
round. Within a pool, jobs share FAIRly too, so tenants that hash alike still share."""
OPERATOR_POOL = "operator"
# The partition column is never null: Spark plans and runs the job, and reads no file.
_WARM_UP_STATEMENT = "SELECT count(*) AS n FROM events WHERE tenant IS NULL"
# PySpark logs every Spark error that carries a query context at ERROR, with the JVM's stack
# trace, when it builds the Python exception: before anyone could tell a tenant's typo from a
# failure of the service.
_QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


@dataclass(frozen=True)
class QueryResult:
    table: pa.Table
    """The rows, cut to the limits."""
    truncated: bool
    elapsed_ms: int


@dataclass(frozen=True)
class _Scope:
    query: Callable[[str], DataFrame]


class _TenantGate:
    """A tenant's running statements and its recent ones, for concurrency and rate limits."""

    def __init__(self) -> None:
        self.running = 0
        self.started_s: collections.deque[float] = collections.deque()


@dataclass
class QueryService:
    spark: SparkSession
    lake: DeltaLake
    limits_of: Callable[[str | None], QueryLimits]
    """A tenant's limits (the operator's: None); re-read by the caller's config watch."""
    local: LocalSql | None = None
    """Answers small statements of a tenant in-process (`local_sql`); None: Spark only."""
    max_cached_scopes: int = 256
    _scopes: collections.OrderedDict[tuple[str | None, tuple[int, ...]], _Scope] = field(
        default_factory=collections.OrderedDict
    )
    _results: collections.OrderedDict[Any, tuple[pa.Table, bool]] = field(
        default_factory=collections.OrderedDict
    )
    """Recent results by (scope, statement, table versions, limits): a dashboard that polls
    the same statement gets it again without a Spark job until a table has a new version."""
    _gates: dict[str | None, _TenantGate] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _newest: NewestTables = field(init=False)

    def __post_init__(self) -> None:
        self._newest = NewestTables(self.lake)

    def run(
        self, scope: str | None, statement: str, as_of_version: int | None = None
    ) -> QueryResult:
        started = time.monotonic()
        limits = self.limits_of(scope)
        check_statement_length(statement, limits)
        with self._admitted(scope, limits):
            tables = {} if scope is OPERATOR else self._tables(scope, as_of_version)
            data_version = (
                (-1 - as_of_version,)  # negative: never the same as a current snapshot's
                if as_of_version is not None
                else self._versions(scope, tables)
            )
            result_key = (scope, statement, data_version, limits)
            with self._lock:
                remembered = self._results.get(result_key)
            if remembered is None:
                with _as_query_errors():
                    tree = check_query(
                        statement, OPERATOR_VIEW_NAMES if scope is OPERATOR else TENANT_VIEW_NAMES
                    )
                    # A misspelt column is named here, with what it could mean, as `sql`
                    # names it: Spark would say it later and without the hint.
                    check_columns(
                        tree, view_columns(LAKE_TABLES if scope is OPERATOR else ALL_TABLES)
                    )
                local = self._answer_locally(scope, tree, tables, limits)
                if local is None:
                    with _as_query_errors():
                        query = self._scope(scope, as_of_version, data_version).query
                        frame = spark_frame_in_order(query, statement, tree)
                    local = self._collect(scope, frame, limits)
                remembered = _cut(local, limits)
                if remembered[0].nbytes <= _REMEMBERED_RESULT_BYTES:
                    with self._lock:
                        self._results[result_key] = remembered
                        while len(self._results) > _REMEMBERED_RESULTS:
                            self._results.popitem(last=False)
        table, truncated = remembered
        return QueryResult(table, truncated, int((time.monotonic() - started) * 1000))

    def warm(self) -> float:
        """Seconds spent running one statement on Spark that reads no file, before any tenant's:
        the session's first job loads and compiles what every later one reuses (the Delta log's
        reader, the planner's rules, generated code), and no tenant's statement timeout should
        pay for it. A lake not written yet leaves nothing to warm, and one out of reach fails
        the warm-up, not the start: statements then say so, each in turn, as they did before
        the warm-up existed."""
        started = time.monotonic()
        try:
            self.run(OPERATOR, _WARM_UP_STATEMENT)
        except QueryError as error:
            log.info("the query engine was not warmed: %s", error.message)
        except LakeUnavailableError as outage:
            log.warning("the query engine was not warmed: %s", outage)
        return time.monotonic() - started

    def follow_tables(self, interval_s: float) -> None:
        """Read the tables' new commits in a thread every `interval_s`, so that no statement
        waits for them (`NewestTables.follow`), until `close`."""
        self._newest.follow(interval_s)

    def close(self) -> None:
        self._newest.close()

    def _tables(self, tenant: str, as_of_version: int | None) -> dict[str, TableFiles | None]:
        """The tenant's tables' files at the versions the statement reads (None: a table not
        written yet, or without that version; Spark's views say so)."""
        tables: dict[str, TableFiles | None] = {}
        for spec in ALL_TABLES:
            try:
                if as_of_version is None:
                    files = self._newest.files(spec, tenant)
                else:
                    table = self.lake.open(spec)
                    table.load_as_version(as_of_version)
                    files = TableFiles.of_table(table, only_tenant=tenant)
            except Exception:
                files = None
            tables[spec.name] = files
        return tables

    def _versions(self, scope: str | None, tables: dict[str, TableFiles | None]) -> tuple[int, ...]:
        """The newest versions of the scope's tables (-1: not written yet): a tenant's, those
        of its files; the operator's, read without indexing a file, since Spark reads them."""
        if scope is not OPERATOR:
            return tuple(-1 if table is None else table.version for table in tables.values())
        versions = []
        for spec in LAKE_TABLES:
            try:
                versions.append(self._newest.version(spec))
            except Exception:
                versions.append(-1)
        return tuple(versions)

    def _answer_locally(
        self,
        scope: str | None,
        tree: exp.Query,
        tables: dict[str, TableFiles | None],
        limits: QueryLimits,
    ) -> pa.Table | None:
        """The statement's rows from the in-process engine, where it answers as Spark would."""
        if self.local is None or scope is OPERATOR or None in tables.values():
            return None
        try:
            return self.local.answer(
                scope,
                tree,
                tables,
                limits.max_joins,
                limits.max_result_rows + 1,
                limits.statement_timeout_ms / 1000,
            )
        except StatementTimeout:
            raise statement_timeout(limits) from None

    @contextmanager
    def _admitted(self, scope: str | None, limits: QueryLimits) -> Iterator[None]:
        now = time.monotonic()
        with self._lock:
            gate = self._gates.setdefault(scope, _TenantGate())
            while gate.started_s and gate.started_s[0] <= now - 60:
                gate.started_s.popleft()
            if gate.running >= limits.max_concurrent_queries:
                raise QueryError(
                    429,
                    "too_many_concurrent",
                    f"{gate.running} statements of this tenant are running; the limit is "
                    f"{limits.max_concurrent_queries}",
                    retry_after_s=1,
                )
            if len(gate.started_s) >= limits.max_queries_per_minute:
                wait_s = int(gate.started_s[0] + 60 - now) + 1
                raise QueryError(
                    429,
                    "rate_limited",
                    f"{limits.max_queries_per_minute} statements a minute is this tenant's limit",
                    retry_after_s=wait_s,
                )
            gate.running += 1
            gate.started_s.append(now)
        try:
            yield
        finally:
            with self._lock:
                gate.running -= 1

    def _scope(
        self, scope: str | None, as_of_version: int | None, data_version: tuple[int, ...]
    ) -> _Scope:
        """The scope's views, opened again only when one of its tables has a new version."""
        if as_of_version is not None:
            tables = LAKE_TABLES if scope is OPERATOR else ALL_TABLES
            return self._open(scope, dict.fromkeys((t.name for t in tables), as_of_version))
        with self._lock:
            cached = self._scopes.get((scope, data_version))
            if cached is not None:
                self._scopes.move_to_end((scope, data_version))
                return cached
        opened = self._open(scope, None)
        with self._lock:
            self._scopes[(scope, data_version)] = opened
            while len(self._scopes) > self.max_cached_scopes:
                self._scopes.popitem(last=False)
        return opened

    def _open(self, scope: str | None, versions: dict[str, int] | None) -> _Scope:
        if scope is not OPERATOR:
            return _Scope(TenantSql.open(self.spark, self.lake, scope, versions=versions).query)
        # The operator reads every tenant, but still only through one read-only query.
        session = self.spark.newSession()
        views = tuple(register_views(session, self.lake, None, versions=versions))

        def query(statement: str) -> DataFrame:
            check_query(statement, views)
            check_spark_plan(session, statement, views)
            frame = session.sql(statement)
            check_constant_sizes(frame)
            return frame

        return _Scope(query)

    def _collect(self, scope: str | None, frame: DataFrame, limits: QueryLimits) -> pa.Table:
        """At most `max_result_rows + 1` rows, within the scope's limits."""
        return run_within_limits(
            self.spark,
            scope,
            frame,
            limits,
            lambda: frame.limit(limits.max_result_rows + 1).toArrow(),
        )


def spark_frame_in_order(
    query: Callable[[str], DataFrame], statement: str, tree: exp.Query
) -> DataFrame:
    """`statement`'s frame from `query`, in `result_order`'s order where `tree` (its guarded
    tree) gives none, ordered before its `LIMIT`/`OFFSET`: the rows the in-process engine
    returns."""
    order = statement_order(tree)
    if order.ordered:
        return query(statement)
    if order.unlimited is tree:
        return order_frame(query(statement))
    # The statement without its outermost LIMIT/OFFSET, as sqlglot writes the guarded tree.
    frame = order_frame(query(order.unlimited.sql(dialect="spark")))
    if order.offset:
        frame = frame.offset(order.offset)
    return frame if order.limit is None else frame.limit(order.limit)


def run_within_limits(
    spark: SparkSession,
    scope: str | None,
    frame: DataFrame,
    limits: QueryLimits,
    action: Callable[[], _Result],
) -> _Result:
    """`action`'s jobs over `frame`, checked first (`check_resources`), in a job group of their
    own and the scope's FAIR pool, cancelled at the statement timeout. Failures are
    `QueryError`s of one line."""
    check_resources(frame, limits)
    context = spark.sparkContext
    group = f"tw-query-{uuid.uuid4().hex}"
    outcome: dict[str, Any] = {}

    def run() -> None:
        # Pinned threads: these properties hold for the jobs this thread starts only.
        context.setJobGroup(group, f"query of {scope or 'the operator'}", True)
        context.setLocalProperty("spark.scheduler.pool", scheduler_pool(scope))
        try:
            outcome["result"] = action()
        except Exception as error:  # handed to the caller's thread below
            outcome["error"] = error

    worker = threading.Thread(target=run, name=group, daemon=True)
    worker.start()
    worker.join(limits.statement_timeout_ms / 1000)
    if worker.is_alive():
        context.cancelJobGroup(group)
        worker.join(_CANCEL_GRACE_S)
        log.warning(
            "cancelled a statement of %s after %g s (job group %s)%s",
            scope or "the operator",
            limits.statement_timeout_ms / 1000,
            group,
            "; it is still running" if worker.is_alive() else "",
        )
        raise statement_timeout(limits)
    error = outcome.get("error")
    if error is not None:
        message = _one_line(error)
        if any(marker in str(error) for marker in _RESOURCE_ERRORS):
            raise QueryError(400, "resource_limit", message)
        raise QueryError(422, "query_failed", message)
    result: _Result = outcome["result"]
    return result


def scheduler_pool(scope: str | None) -> str:
    """The FAIR pool of a scope's jobs: the operator's own, or one of `QUERY_POOLS` by a hash of
    the tenant that is the same in every process (`hash()` is salted per process)."""
    if scope is OPERATOR:
        return OPERATOR_POOL
    return f"tenants-{zlib.crc32(scope.encode()) % QUERY_POOLS:02d}"


def fair_scheduler_conf(directory: Path) -> dict[str, str]:
    """Spark settings that declare every pool `scheduler_pool` names, FAIR within each, in an
    allocation file written to `directory`: Spark reads it once, when the session starts."""
    pools = [OPERATOR_POOL, *(f"tenants-{number:02d}" for number in range(QUERY_POOLS))]
    path = directory / "fair-scheduler.xml"
    path.write_text(
        '<?xml version="1.0"?>\n<allocations>\n'
        + "".join(
            f'  <pool name="{pool}"><schedulingMode>FAIR</schedulingMode>'
            "<weight>1</weight><minShare>0</minShare></pool>\n"
            for pool in pools
        )
        + "</allocations>\n",
        encoding="utf-8",
    )
    return {"spark.scheduler.mode": "FAIR", "spark.scheduler.allocation.file": str(path)}


def leave_statement_errors_to_the_service() -> None:
    """Stop PySpark logging each failed statement at ERROR with the JVM's frames.

    The query service answers each failure itself: a tenant's mistake (`QueryError`) is its
    one-line audit record, and anything else is logged with its trace by the caller. Process-wide,
    so only a process that serves statements calls it.
    """
    for name in _QUERY_CONTEXT_LOGGERS:
        # PySpark's own logger class: a plain `logging.Logger` registered under the name first
        # would break PySpark's keyword arguments to it.
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


def check_resources(frame: DataFrame, limits: QueryLimits) -> None:
    """Refuse, before any job runs, what the plan shows would outgrow memory or time.

    Spark cancels a job by flagging its tasks, and a task looks at the flag between input rows:
    a join that multiplies rows (a cross join, or an equi-join on a column every row shares)
    can produce billions of rows from one input row and never look, so no timeout stops it and
    it holds its executor cores. Such statements are refused up front: more joins than the
    tenant's `max_joins`, or a nested-loop join whose estimated output passes
    `_NESTED_LOOP_MAX_BYTES`. (`scoped_sql.check_constant_sizes` has already refused constants
    too big to build.)
    """
    execution = frame._jdf.queryExecution()
    joins = sum(
        node.getClass().getSimpleName() == "Join" for node in plan_nodes(execution.analyzed())
    )
    if joins > limits.max_joins:
        raise QueryError(
            400,
            "resource_limit",
            f"the statement joins {joins} times (views included); the limit is {limits.max_joins}",
        )
    physical = [node.getClass().getSimpleName() for node in tree_nodes(execution.executedPlan())]
    if any(name in _NESTED_LOOP_JOINS for name in physical):
        estimated = int(str(execution.optimizedPlan().stats().sizeInBytes()))
        if estimated > _NESTED_LOOP_MAX_BYTES:
            raise QueryError(
                400,
                "resource_limit",
                f"the statement has a join without an equality condition whose output Spark "
                f"estimates at {estimated:,} bytes; the limit is {_NESTED_LOOP_MAX_BYTES:,}",
            )


@contextmanager
def _as_query_errors() -> Iterator[None]:
    """What Spark or the guard says about a statement, as the `QueryError` the caller gets."""
    try:
        yield
    except ResourceRefused as refused:
        raise QueryError(400, "resource_limit", refused.reason) from None
    except UnknownRelation as unknown:
        raise unknown_name(unknown.reason, UNDEFINED_TABLE) from None
    except UnknownColumnError as unknown:
        raise unknown_name(str(unknown), UNDEFINED_COLUMN) from None
    except QueryRefused as refused:
        raise QueryError(400, "refused", refused.reason) from None
    except (TableVersionError, LakeNotWrittenError) as error:
        raise QueryError(400, "bad_version", str(error)) from None
    except AnalysisException as error:
        raise QueryError(
            422, "analysis_error", _one_line(error), sqlstate=error.getSqlState()
        ) from None


def _cut(table: pa.Table, limits: QueryLimits) -> tuple[pa.Table, bool]:
    """The table cut to the row limit, then to the byte limit of its rows as JSON."""
    truncated = table.num_rows > limits.max_result_rows
    table = table.slice(0, limits.max_result_rows)
    size = 0
    for number, batch in enumerate(_row_sizes(table)):
        size += batch
        if size > limits.max_result_bytes:
            return table.slice(0, number), True
    return table, truncated


def _row_sizes(table: pa.Table) -> Iterator[int]:
    for row in table.to_pylist():
        yield len(orjson.dumps(list(row.values()), default=str))


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    return first[:500]
