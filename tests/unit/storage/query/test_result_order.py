"""The order of a result whose statement gives none (`storage.query.result_order`): the same
rule for every door. That Spark's sort (`order_frame`) agrees with it:
tests/integration/query/test_sql_in_process.py."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import sqlglot

from storage.query.result_order import order_rows, statement_order


def tree(statement: str) -> sqlglot.exp.Query:
    parsed = sqlglot.parse_one(statement, read="spark")
    assert isinstance(parsed, sqlglot.exp.Query)
    return parsed


def test_rows_sort_by_every_column_in_turn_nulls_and_nested_values_included() -> None:
    table = pa.table(
        {
            "s": ["b", "a", None, "a", "a"],
            "d": [1.0, float("nan"), 3.0, 2.0, None],
            "t": pa.array([dt.datetime(2026, 1, 1)] * 5, pa.timestamp("us", tz="UTC")),
            "ids": [["x"], ["b"], [], ["a", "b"], None],
        }
    )
    ordered = order_rows(table)
    # NULL first, then values, NaN after every number (as Spark sorts doubles).
    assert ordered["s"].to_pylist() == [None, "a", "a", "a", "b"]
    assert str(ordered["d"].to_pylist()) == "[3.0, None, 2.0, nan, 1.0]"
    assert ordered["ids"].to_pylist() == [[], None, ["a", "b"], ["b"], ["x"]]
    # The same rows in any order give the same result.
    for shuffled in (ordered, table.take([4, 3, 2, 1, 0])):
        assert str(order_rows(shuffled).to_pylist()) == str(ordered.to_pylist())


def test_a_limit_without_order_by_cuts_after_the_rule() -> None:
    order = statement_order(tree("SELECT source FROM events LIMIT 2 OFFSET 1"))
    assert not order.ordered
    assert order.unlimited.sql(dialect="spark") == "SELECT source FROM events"
    rows = pa.table({"source": ["a", "b", "c", "d"]})
    assert order.cut(rows)["source"].to_pylist() == ["b", "c"]


def test_a_statement_with_its_own_order_keeps_it_and_its_limit() -> None:
    statement = tree("SELECT source FROM events ORDER BY source DESC LIMIT 2")
    order = statement_order(statement)
    assert order.ordered and order.unlimited is statement
    unordered = tree("SELECT source, count(*) FROM events GROUP BY source")
    assert statement_order(unordered).unlimited is unordered
