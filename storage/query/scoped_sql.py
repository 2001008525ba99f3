"""Tenant-scoped Spark SQL: a session that can reach one tenant's rows only, and the checks every
statement passes before it runs (contract §6: a security boundary, not a convenience filter).

Defence in depth, each layer on its own enough for the escapes we know:
1. `storage.query.sql_guard` accepts one read-only query over the views, with allow-listed parts.
2. Spark's own parser reads the same text; its plan must be made of query operators only,
   name only the views (or the statement's CTEs) and call only allow-listed functions. sqlglot
   and Spark may disagree on an odd statement: both must accept it.
3. The session itself reaches nothing else: a fresh session (its own temp views and settings)
   holding only the scoped views, with SQL on files and `${}` substitution switched off.
4. The planned query may read only files the scoped views read; and those are only the
   tenant's own partition files, staged files (shared by all tenants until compaction settles
   them; the view's filter keeps the tenant's rows) and files of tables not partitioned by
   tenant (checked when the session opens).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import LAYOUT_PREFIX, STAGED
from storage.query.spark_views import register_views
from storage.query.sql_guard import ALLOWED_FUNCTIONS, QueryRefused, check_query

SCOPED_SESSION_CONF = {
    # `SELECT * FROM parquet.`/any/path`` would otherwise read any file the process can.
    "spark.sql.runSQLOnFiles": "false",
    # Spark substitutes ${env:NAME} and ${system:NAME} into a statement before parsing it.
    "spark.sql.variable.substitute": "false",
}
# Logical plan operators of a query as Spark's parser builds them. Commands (SET, CACHE,
# CREATE, INSERT...), script transforms and table-valued functions are not among them.
QUERY_PLAN_NODES = frozenset(
    {
        "Project", "Filter", "Aggregate", "Join", "Generate", "Sort", "GlobalLimit",
        "LocalLimit", "Offset", "Distinct", "Deduplicate", "Union", "Intersect", "Except",
        "SubqueryAlias", "UnresolvedWith", "UnresolvedRelation",
        "UnresolvedSubqueryColumnAliases", "OneRowRelation", "LocalRelation",
        "UnresolvedInlineTable", "Sample", "WithWindowDefinition", "Window", "Pivot",
        "UnresolvedHaving", "UnresolvedQualify", "LateralJoin", "Expand", "Tail",
    }
)  # fmt: skip


@dataclass(frozen=True)
class TenantSql:
    """A session holding one tenant's views; `query` runs a statement through every check."""

    session: SparkSession
    tenant: str
    views: tuple[str, ...]
    readable_files: frozenset[str]

    @classmethod
    def open(
        cls,
        spark: SparkSession,
        lake: DeltaLake,
        tenant: str,
        use_delta_spark: bool = False,
        versions: Mapping[str, int] | None = None,
    ) -> TenantSql:
        # A new session shares the SparkContext but not temp views or SQL settings, so nothing
        # registered on `spark` (unscoped views, the caller's settings) is reachable from here.
        session = spark.newSession()
        for key, value in SCOPED_SESSION_CONF.items():
            session.conf.set(key, value)
        frames = register_views(session, lake, tenant, use_delta_spark, versions)
        files = frozenset(path for frame in frames.values() for path in frame.inputFiles())
        foreign = sorted(path for path in files if not _in_scope(path, tenant))
        if foreign:
            raise QueryRefused(
                f"tenant {tenant}'s views would read {len(foreign)} files of other tenants' "
                f"partitions, e.g. {foreign[0]}"
            )
        return cls(session, tenant, tuple(frames), files)

    def query(self, statement: str) -> DataFrame:
        check_query(statement, self.views)
        check_spark_plan(self.session, statement, self.views)
        # Parsing above executed nothing; this analyses the query (commands were refused).
        frame = self.session.sql(statement)
        check_constant_sizes(frame)  # before anything optimizes (and so folds) the plan
        outside = set(frame.inputFiles()) - self.readable_files
        if outside:
            raise QueryRefused(
                f"the query would read {len(outside)} files outside tenant {self.tenant}'s views"
            )
        return frame


def _in_scope(path: str, tenant: str) -> bool:
    """Whether a file's partition folders allow it in `tenant`'s views."""
    for folder in path.split("/"):
        column, _, value = folder.partition("=")
        if column == "tenant":  # a lake from before the staged layout
            return value == tenant
        if column == f"{LAYOUT_PREFIX}tenant":
            return value in (tenant, STAGED)
    return True


class ResourceRefused(QueryRefused):
    """A statement refused because of what it would take to run, not what it reads."""


MAX_CONSTANT_SIZE = 1_000_000
_SIZED_FUNCTIONS = {"StringRepeat": "repeat", "Sequence": "sequence"}


def check_constant_sizes(frame: DataFrame) -> None:
    """Refuse `repeat` and `sequence` whose sizes are constants too big to build.

    Spark's optimizer evaluates constant expressions while it plans, in the driver: `SELECT
    size(sequence(1, 2000000000))` ran the driver out of memory before any job or timeout. The
    analysed plan still holds them unevaluated, with their arguments resolved.
    """
    for node in plan_nodes(frame._jdf.queryExecution().analyzed()):
        for expression in scala_seq(node.expressions()):
            for part in tree_nodes(expression):
                name = _SIZED_FUNCTIONS.get(part.getClass().getSimpleName())
                if name is None:
                    continue
                numbers = [_constant_int(child) for child in scala_seq(part.children())]
                if name == "repeat":
                    size = numbers[-1] or 0
                else:  # sequence(start, stop[, step])
                    start, stop = numbers[0], numbers[1]
                    size = abs(stop - start) if start is not None and stop is not None else 0
                if size > MAX_CONSTANT_SIZE:
                    raise ResourceRefused(
                        f"{name} of {size:,} elements; the limit is {MAX_CONSTANT_SIZE:,}"
                    )


def _constant_int(expression: Any) -> int | None:
    if not expression.foldable():
        return None
    value = expression.eval(None)
    return value if isinstance(value, int) else None


def check_spark_plan(session: SparkSession, statement: str, views: tuple[str, ...]) -> None:
    """Spark's own parse of `statement` (nothing runs) must be a query over `views` only."""
    parser = session._jsparkSession.sessionState().sqlParser()
    try:
        plan = parser.parsePlan(statement)
    except Exception as error:  # py4j wraps Spark's ParseException
        raise QueryRefused(f"Spark cannot parse the statement: {error}") from error
    nodes = list(plan_nodes(plan))
    ctes = {name.lower() for node in nodes for name in _cte_names(node)}
    allowed_relations = {name.lower() for name in views} | ctes
    for node in nodes:
        kind = node.getClass().getSimpleName()
        if kind not in QUERY_PLAN_NODES:
            raise QueryRefused(f"Spark reads the statement as {kind}, which is not a query step")
        if kind == "UnresolvedRelation":
            parts = [str(part) for part in scala_seq(node.multipartIdentifier())]
            if len(parts) != 1 or parts[0].lower() not in allowed_relations:
                raise QueryRefused(f"Spark reads a relation {'.'.join(parts)!r}: not a view")
        for expression in scala_seq(node.expressions()):
            _check_spark_expression(expression)


def _check_spark_expression(expression: Any) -> None:
    for node in tree_nodes(expression):
        kind = node.getClass().getSimpleName()
        if kind == "UnresolvedFunction":
            parts = [str(part) for part in scala_seq(node.nameParts())]
        elif kind == "UnresolvedGenerator":
            parts = [str(node.name().funcName())]
        else:
            continue
        if len(parts) != 1 or parts[0].lower() not in ALLOWED_FUNCTIONS:
            raise QueryRefused(
                f"Spark reads a call of {'.'.join(parts)!r}: not an allow-listed function"
            )


def plan_nodes(plan: Any) -> Iterator[Any]:
    """Every plan node, including CTE bodies and subqueries inside expressions."""
    pending = [plan]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(scala_seq(node.children()))
        pending.extend(
            child
            for child in scala_seq(node.innerChildren())
            if _is_plan(child)  # UnresolvedWith holds its CTE bodies here
        )
        for expression in scala_seq(node.expressions()):
            pending.extend(
                sub.plan()
                for sub in tree_nodes(expression)
                if sub.getClass().getSimpleName() in _SUBQUERY_EXPRESSIONS
            )


_SUBQUERY_EXPRESSIONS = frozenset({"ScalarSubquery", "ListQuery", "Exists", "LateralSubquery"})


def tree_nodes(root: Any) -> Iterator[Any]:
    """Every node of a Catalyst tree (an expression, or a physical plan) by its children."""
    pending = [root]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(scala_seq(node.children()))


def _cte_names(node: Any) -> list[str]:
    if node.getClass().getSimpleName() != "UnresolvedWith":
        return []
    return [str(pair._1()) for pair in scala_seq(node.cteRelations())]


def _is_plan(node: Any) -> bool:
    return bool(
        node.getClass().getName().startswith("org.apache.spark.sql.catalyst.plans.logical.")
    )


def scala_seq(scala_seq: Any) -> list[Any]:
    return [scala_seq.apply(index) for index in range(scala_seq.size())]
