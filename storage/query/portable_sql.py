"""Which Spark statements DuckDB answers exactly as Spark would, and DuckDB's text for them.

Only a statement whose every part means the same in both engines runs in-process
(`local_statement`): a small set of clauses, operators and functions, with comparisons whose
operand types agree, and Spark's names for unaliased aggregates. Anything else goes to Spark:
its refusals, errors and odd cases stay Spark's own. `tests/integration/query/test_local_sql.py`
runs a corpus of statements on both engines and compares rows, names and types.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
from sqlglot import exp

from storage.lake.tables import ALL_TABLES, LAKE_TABLES, TableSpec
from storage.query.view_catalog import WINDOW_CONTENTS

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
        exp.Subquery, exp.Union, exp.Window,
    }
)  # fmt: skip
# Aggregates that mean the same over a window (`_is_portable_window`): ranking functions are
# integers of another width in each engine.
_WINDOW_AGGREGATES = (exp.Count, exp.Sum, exp.Min, exp.Max, exp.Avg)
# Spark's name for an unaliased aggregate of a column, by the node sqlglot reads.
_SPARK_AGGREGATE_NAMES: dict[type[exp.Expr], str] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Min: "min",
    exp.Max: "max",
}
# DuckDB's names for the functions and operators the nodes above become.
DUCKDB_FUNCTIONS = frozenset(
    {"count", "count_star", "sum", "min", "max", "avg", "upper", "lower", "+", "-", "*"}
)
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


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


KINDS = _column_kinds(ALL_TABLES)
OPERATOR_KINDS = _column_kinds(LAKE_TABLES)
"""The operator's views also hold `deliveries`."""


def local_statement(
    tree: exp.Query, max_joins: int, kinds: Mapping[str, str] = KINDS
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
        elif isinstance(node, exp.Window):
            if not _is_portable_window(node):
                return None
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


def _is_portable_window(window: exp.Window) -> bool:
    """An aggregate over `PARTITION BY ... ORDER BY ...` with the default frame, which both
    engines take alike: the whole partition, or with `ORDER BY` the rows up to the current one
    and its peers (`RANGE ... CURRENT ROW`)."""
    extra = {"spec", "alias", "first"} & {k for k, v in window.args.items() if v}
    return not extra and type(window.this) in _WINDOW_AGGREGATES


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
