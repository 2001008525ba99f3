"""The in-process engine's pure parts (`storage.query.portable_sql`, `local_sql`): the
statements it writes for DuckDB, and its timeout. Its answers against Spark's: tests/integration/query/test_local_sql.py."""

from __future__ import annotations

import time

import duckdb
import pyarrow as pa
import pytest
import sqlglot

from storage.query.local_sql import DUCKDB_CONFIG, StatementTimeout, _fetch
from storage.query.portable_sql import local_statement

MAX_JOINS = 3


def local_text(statement: str, max_joins: int = MAX_JOINS) -> str | None:
    return local_statement(sqlglot.parse_one(statement, read="spark"), max_joins)


def test_unaliased_aggregates_get_sparks_names() -> None:
    text = local_text("SELECT count(*), count(DISTINCT source), sum(count) FROM windows")
    assert text == (
        'SELECT COUNT(*) AS "count(1)", COUNT(DISTINCT source) AS "count(DISTINCT source)", '
        'SUM(count) AS "sum(count)" FROM windows'
    )


def test_joins_count_window_contents_as_spark_does() -> None:
    assert local_text("SELECT count(*) AS n FROM window_contents", max_joins=1) is not None
    assert local_text("SELECT count(*) AS n FROM window_contents", max_joins=0) is None


def test_comments_never_reach_duckdb() -> None:
    text = local_text("SELECT count(*) AS n FROM events /* x */ -- y\n")
    assert text == "SELECT COUNT(*) AS n FROM events"


def test_a_statement_past_its_timeout_is_interrupted() -> None:
    database = duckdb.connect(":memory:", config=DUCKDB_CONFIG)
    cursor = database.cursor()
    cursor.register("t", pa.table({"k": [1] * 100_000}))
    started = time.monotonic()
    with pytest.raises(StatementTimeout):
        _fetch(cursor, "SELECT count(*) FROM t a JOIN t b ON a.k = b.k", 10, 0.3)
    assert time.monotonic() - started < 5
    assert _fetch(cursor, "SELECT 1 AS one", 10, 5.0).to_pylist() == [{"one": 1}]


def test_aggregates_over_a_default_window_frame_run_in_process() -> None:
    """Both engines read `OVER (PARTITION BY ... ORDER BY ...)` as the rows up to the current
    one and its peers; an explicit frame, or a ranking function (an int in Spark, a bigint in
    DuckDB), stays on Spark."""
    running = (
        "SELECT source, sum(on_time_records) OVER (PARTITION BY source ORDER BY batch_id) AS s "
        "FROM tenant_status"
    )
    assert local_text(running) == (
        'SELECT source AS "source", SUM(on_time_records) OVER (PARTITION BY source ORDER BY '
        "batch_id NULLS FIRST) AS s FROM tenant_status"
    )
    framed = running.replace("batch_id)", "batch_id ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)")
    assert local_text(framed) is None
    assert local_text("SELECT row_number() OVER (ORDER BY batch_id) AS n FROM events") is None
