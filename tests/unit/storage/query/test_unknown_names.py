"""A misspelled column or view is refused before any engine runs, with the names it could mean;
nothing Spark would accept is refused (`storage.query.unknown_names`, `sql_guard`)."""

from __future__ import annotations

import pytest
import sqlglot

from storage.lake.tables import ALL_TABLES
from storage.query.sql_guard import UnknownRelation, check_query
from storage.query.unknown_names import UnknownColumnError, check_columns
from storage.query.view_catalog import TENANT_VIEW_NAMES, view_columns

VIEWS = view_columns(ALL_TABLES)


def check(statement: str) -> None:
    tree = sqlglot.parse_one(statement, read="spark")
    assert isinstance(tree, sqlglot.exp.Query)
    check_columns(tree, VIEWS)


@pytest.mark.parametrize(
    ("statement", "meant"),
    [
        ("SELECT sourse FROM events", "did you mean 'source'?"),
        ("SELECT e.sourse FROM events e", "did you mean 'source'?"),
        ("SELECT count(*) FROM windows WHERE is_finl", "did you mean 'is_final'?"),
        ("SELECT pane_count FROM window_contents GROUP BY pane_cnt", "'pane_count'"),
    ],
)
def test_a_misspelled_column_is_refused_with_what_it_could_mean(statement: str, meant: str) -> None:
    with pytest.raises(UnknownColumnError, match="unknown column") as refused:
        check(statement)
    assert meant in str(refused.value)


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT source AS s FROM events ORDER BY s",
        "WITH t AS (SELECT source AS s FROM events) SELECT s FROM t",
        "WITH t AS (SELECT count(*) FROM events) SELECT `count(1)` FROM t",
        "SELECT a, b FROM (SELECT 1, 2) AS v(a, b)",
        "SELECT metrics.cpu FROM windows",
        "SELECT transform(merged_window_ids, x -> upper(x)) AS ids FROM windows",
        "SELECT w.count, e.offset FROM windows w JOIN events e ON e.window_id = w.window_id",
        "SELECT current_date, true",
    ],
)
def test_what_spark_accepts_is_not_refused(statement: str) -> None:
    check(statement)


def test_a_misspelled_view_is_refused_with_the_views_it_could_mean() -> None:
    with pytest.raises(UnknownRelation, match="did you mean 'events'"):
        check_query("SELECT count(*) FROM event", TENANT_VIEW_NAMES)
