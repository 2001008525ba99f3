"""The in-process engine of the query service (`storage.query.local_sql`) gives Spark's answer or
none: a corpus of statements runs on both engines over a lake written by the real stream, and
every statement it takes must match Spark's rows, column names and types."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.lake.table_files import TableFiles
from storage.lake.tables import ALL_TABLES
from storage.query.local_sql import LocalSql
from storage.query.query_service import QueryService
from storage.query.scoped_sql import TenantSql
from storage.query.sql_guard import check_query
from storage.query.view_catalog import TENANT_VIEW_NAMES
from tenants.models import QueryLimits
from tests.support.pipeline_harness import Pipeline, record
from tests.support.sql_escapes import ESCAPES_SEEING_ONLY_THE_TENANT, PASSWD_MARK
from tests.support.timestamps import T0_MS

TENANT = "acme"
MAX_JOINS = 3

# Statements the in-process engine answers; each must equal Spark's answer.
ANSWERED_LOCALLY = [
    "SELECT count(*) AS final_windows FROM windows WHERE is_final",
    "SELECT count(*) FROM windows WHERE is_final AND count > -3",
    "SELECT COUNT(*) FROM windows",
    "SELECT count(window_id), count(DISTINCT source), sum(count), min(window_start), "
    "max(watermark) FROM windows",
    "SELECT source, count(*) AS panes, sum(count) AS records, avg(count) AS mean_count "
    "FROM windows GROUP BY source ORDER BY source",
    "SELECT source, window_start, max(pane_index) AS last_pane FROM windows "
    "GROUP BY source, window_start HAVING count(*) > 1 ORDER BY 1, 2",
    "SELECT * FROM windows WHERE source = 'web' ORDER BY window_start, pane_index",
    "SELECT * FROM events",
    "SELECT * FROM late_events",
    "SELECT * FROM tenant_status",
    "SELECT * FROM quarantine",
    "SELECT * FROM window_contents ORDER BY window_start, pane_index, offset",
    "SELECT tenant, source, window_id FROM windows WHERE window_start >= '2026-01-01 00:01:00' "
    "ORDER BY window_id",
    "SELECT offset, payload FROM events WHERE window_date = '2026-01-01' ORDER BY offset",
    "SELECT upper(source) AS s, lower(timing) AS t, pane_index + 1 AS next_pane, "
    "-pane_index * 2 AS minus FROM windows ORDER BY s, t, next_pane",
    "SELECT DISTINCT timing FROM events ORDER BY timing DESC",
    "SELECT source FROM windows WHERE timing IN ('ON_TIME', 'LATE') AND count BETWEEN 1 AND 3 "
    "AND NOT is_final OR watermark IS NULL ORDER BY source LIMIT 2",
    "SELECT coalesce(lifecycle, 'unknown') AS lifecycle, on_time_records FROM tenant_status "
    "ORDER BY on_time_records",
    "SELECT e.offset, w.count AS panes_count FROM events e JOIN windows w "
    "ON e.window_id = w.window_id AND e.pane_index = w.pane_index ORDER BY e.offset, panes_count",
    "SELECT e.offset, l.lateness_ms FROM events e LEFT JOIN late_events l "
    "ON e.window_id = l.window_id ORDER BY e.offset, l.lateness_ms",
    "WITH finals AS (SELECT source, count FROM windows WHERE is_final) "
    "SELECT source, sum(count) AS records FROM finals GROUP BY source ORDER BY source",
    "SELECT n FROM (SELECT count(*) AS n FROM events UNION ALL SELECT count(*) AS n FROM windows) "
    "ORDER BY n",
    "SELECT source FROM events UNION SELECT source FROM windows ORDER BY source",
    "SELECT max(event_time), min(payload) FROM events",
    "SELECT Source, COUNT(Event_Id) FROM Events GROUP BY Source ORDER BY Source",
    "SELECT source, count(*) AS n FROM events GROUP BY 1 ORDER BY n DESC, source LIMIT 1",
    "SELECT 'it\\'s' AS quoted, 'a\\\\b' AS escaped, count(*) AS n FROM events "
    "WHERE payload <> 'it\\'s'",
    *ESCAPES_SEEING_ONLY_THE_TENANT[:3],
    *ESCAPES_SEEING_ONLY_THE_TENANT[4:6],
    ESCAPES_SEEING_ONLY_THE_TENANT[-1],
]
# Statements whose meaning or output names the engines may not share: Spark answers.
LEFT_TO_SPARK = [
    "SELECT avg(count) FROM windows",  # Spark names it after the word used: avg or mean
    "SELECT count / 2 AS half FROM windows",  # division by zero: NULL in DuckDB, error in Spark
    "SELECT count(*) AS n FROM windows WHERE tenant = 5",  # text beside a number
    "SELECT count(*) AS n FROM windows WHERE count = '5'",
    "SELECT count(*) AS n FROM events a, events b",  # a join without an equality
    "SELECT count(*) AS n FROM events a JOIN events b ON a.event_time < b.event_time",
    "SELECT * FROM events e JOIN windows w ON e.window_id = w.window_id",  # duplicate names
    "SELECT CAST(count AS INT) AS n FROM windows",
    "SELECT count(*) AS n FROM events WHERE payload LIKE '%a%'",
    "SELECT count(*) AS n FROM events WHERE payload = 'it''s'",  # Spark: 'it' 's' is "its"
    "SELECT count(*) + 1 FROM windows",  # an unaliased expression: Spark's name is its own
    "SELECT sha2(payload, 256) AS digest FROM events",
    "SELECT count(*) AS n FROM window_contents a JOIN window_contents b ON a.tenant = b.tenant "
    "JOIN events c ON c.tenant = a.tenant",  # 4 joins, views included: Spark refuses it
    "SELECT count(*) AS n FROM events WHERE tenant IN (SELECT tenant FROM windows)",
    "SELECT count(*) AS n FROM events FULL OUTER JOIN windows ON events.tenant = windows.tenant",
    "SELECT merged_window_ids FROM windows WHERE merged_window_ids = array('a')",
]


@pytest.fixture(scope="module")
def pipeline(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Pipeline:
    """Two tenants on both sources; acme has a late pane, a too-late record and odd payloads."""
    pipeline = Pipeline.create(
        kafka, tmp_path_factory.mktemp("local_sql"), conf_dir, max_offsets_per_trigger=8
    )
    pipeline.produce(
        [
            *(record("acme", "web", T0_MS + seconds * 1000, level="INFO") for seconds in (0, 15)),
            record("acme", "web", T0_MS + 45_000, level="ERROR", note="it's"),
            record("acme", "web", T0_MS + 75_000, note="a\\b"),
            record("globex", "web", T0_MS + 10_000),
            record("acme", "billing", T0_MS + 1_000, amount=5),
            record("globex", "billing", T0_MS + 2_000, amount=7),
            record("acme", "web", T0_MS + 200_000),
            record("acme", "web", T0_MS + 20_000),  # too late: W passed 60 s + 1 min
            record("acme", "web", T0_MS + 130_000),
            record("acme", "web", T0_MS + 150_000),  # late: W is 190 s, the window ends at 180 s
            record("globex", "web", T0_MS + 80_000),
        ]
    )
    pipeline.produce([b"{broken", b'{"tenant": "acme", "source": "nope"}'])
    pipeline.run_available_now(spark)
    return pipeline


@pytest.fixture(scope="module")
def local(pipeline: Pipeline) -> LocalSql:
    return LocalSql(pipeline.lake, max_tenant_bytes=64 << 20, cache_bytes=256 << 20)


def local_answer(local: LocalSql, pipeline: Pipeline, statement: str) -> pa.Table | None:
    tables = {spec.name: TableFiles.of_table(pipeline.lake.open(spec)) for spec in ALL_TABLES}
    tree = check_query(statement, TENANT_VIEW_NAMES)
    return local.answer(TENANT, tree, tables, MAX_JOINS, 10_001, 30.0)


def spark_answer(spark: Any, pipeline: Pipeline, statement: str) -> pa.Table:
    table: pa.Table = TenantSql.open(spark, pipeline.lake, TENANT).query(statement).toArrow()
    return table


def comparable_rows(table: pa.Table, ordered: bool) -> list[tuple[Any, ...]]:
    """Rows with floats to 12 significant digits (the engines sum in different orders)."""

    def value(cell: Any) -> Any:
        if isinstance(cell, float) and math.isfinite(cell):
            return float(f"{cell:.12g}")
        return cell

    rows = [tuple(value(cell) for cell in row.values()) for row in table.to_pylist()]
    return rows if ordered else sorted(rows, key=repr)


@pytest.mark.parametrize("statement", ANSWERED_LOCALLY)
def test_the_local_engine_answers_as_spark_does(
    spark: Any, pipeline: Pipeline, local: LocalSql, statement: str
) -> None:
    expected = spark_answer(spark, pipeline, statement)
    answer = local_answer(local, pipeline, statement)
    assert answer is not None, "the in-process engine left it to Spark"
    assert [(f.name, f.type) for f in answer.schema] == [(f.name, f.type) for f in expected.schema]
    ordered = "ORDER BY" in statement.upper()
    assert comparable_rows(answer, ordered) == comparable_rows(expected, ordered)


# Columns of one table by kind, for generated statements; values near those the lake holds.
_COLUMNS = {
    "number": ["count", "pane_index", "batch_id"],
    "string": ["source", "timing", "window_id"],
    "time": ["window_start", "window_end", "watermark"],
    "bool": ["is_final"],
}
_LITERALS = {
    "number": st.integers(-2, 3).map(str),
    "string": st.sampled_from(["'web'", "'billing'", "'LATE'", "'ON_TIME'", "''", "'Web'"]),
    "time": st.sampled_from(["'2026-01-01 00:01:00'", "'2026-01-01'", "'2025-12-31 23:59:59'"]),
    "bool": st.sampled_from(["true", "false"]),
}


@st.composite
def conditions(draw: st.DrawFn, depth: int = 0) -> str:
    kind = draw(st.sampled_from(sorted(_COLUMNS)))
    column = draw(st.sampled_from(_COLUMNS[kind]))
    literal = _LITERALS[kind]
    simple = draw(
        st.sampled_from(["compare", "in", "between", "null"] if kind != "bool" else ["bool"])
    )
    if simple == "compare":
        operator = draw(st.sampled_from(["=", "<>", "<", "<=", ">", ">="]))
        text = f"{column} {operator} {draw(literal)}"
    elif simple == "in":
        text = f"{column} IN ({', '.join(draw(st.lists(literal, min_size=1, max_size=3)))})"
    elif simple == "between":
        text = f"{column} BETWEEN {draw(literal)} AND {draw(literal)}"
    elif simple == "null":
        text = f"{column} IS {draw(st.sampled_from(['NULL', 'NOT NULL']))}"
    else:
        text = column if draw(st.booleans()) else f"NOT {column}"
    if depth < 2 and draw(st.booleans()):
        joiner = draw(st.sampled_from(["AND", "OR"]))
        text = f"({text} {joiner} {draw(conditions(depth + 1))})"
    return text


@st.composite
def statements(draw: st.DrawFn) -> str:
    """A grouped or plain SELECT over `windows`, ordered by every output column."""
    keys = draw(st.lists(st.sampled_from(_COLUMNS["string"] + ["is_final"]), max_size=2))
    keys = list(dict.fromkeys(keys))
    aggregates = draw(
        st.lists(
            st.sampled_from(
                [
                    "count(*)",
                    "count(DISTINCT timing)",
                    "sum(count)",
                    "min(window_start)",
                    "max(watermark)",
                    "max(pane_index) + 1 AS next_pane",
                    "avg(count) AS mean",
                    "min(upper(source)) AS first_source",
                ]
            ),
            min_size=0 if keys else 1,
            max_size=3,
            unique=True,
        )
    )
    where = f" WHERE {draw(conditions())}" if draw(st.booleans()) else ""
    if not aggregates:
        columns = ", ".join(keys)
        return f"SELECT DISTINCT {columns} FROM windows{where} ORDER BY {columns}"
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    having = f" HAVING count(*) > {draw(st.integers(0, 2))}" if keys and draw(st.booleans()) else ""
    outputs = ", ".join([*keys, *aggregates])
    order = ", ".join(str(n + 1) for n in range(len(keys) + len(aggregates)))
    return f"SELECT {outputs} FROM windows{where}{group}{having} ORDER BY {order}"


@settings(
    max_examples=40,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(statement=statements())
def test_generated_statements_get_sparks_answer_or_none(
    spark: Any, pipeline: Pipeline, local: LocalSql, statement: str
) -> None:
    answer = local_answer(local, pipeline, statement)
    assert answer is not None, statement  # the grammar holds only parts the engine takes
    expected = spark_answer(spark, pipeline, statement)
    assert [(f.name, f.type) for f in answer.schema] == [(f.name, f.type) for f in expected.schema]
    assert comparable_rows(answer, True) == comparable_rows(expected, True)


def test_the_corpus_reads_rows_of_every_table(pipeline: Pipeline) -> None:
    """The comparisons above are only worth what the lake holds: every table has acme rows."""
    for spec in ALL_TABLES:
        rows = pipeline.table(spec.name)
        assert (rows["tenant"] == TENANT).any(), spec.name
    assert (pipeline.table("windows")["timing"] == "LATE").any()


@pytest.mark.parametrize("statement", LEFT_TO_SPARK)
def test_statements_the_engines_may_read_differently_are_left_to_spark(
    pipeline: Pipeline, local: LocalSql, statement: str
) -> None:
    assert local_answer(local, pipeline, statement) is None


def test_a_database_reaches_nothing_but_the_tenants_rows(
    pipeline: Pipeline, local: LocalSql
) -> None:
    """Defence in depth: statements that skipped the guard, run straight on a tenant's
    database, read no file, load nothing and change no setting."""
    assert local_answer(local, pipeline, "SELECT count(*) AS n FROM events") is not None
    cursor = local._database(TENANT).cursor()
    for statement in (
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/passwd')",
        f"SELECT * FROM read_parquet('{pipeline.lake.root}/events/**/*.parquet')",
        "COPY (SELECT 1) TO '/tmp/tw-escape.csv'",
        "ATTACH '/tmp/tw-escape.db'",
        "INSTALL httpfs",
        "SET enable_external_access = true",
        "SET memory_limit = '100GB'",
        "SELECT count(*) FROM events",  # registered per statement, on that statement's cursor
    ):
        with pytest.raises(duckdb.Error):
            cursor.execute(statement).fetchall()
    assert not Path("/tmp/tw-escape.csv").exists() and not Path("/tmp/tw-escape.db").exists()


def test_escapes_through_the_local_engine_see_only_the_tenant(
    pipeline: Pipeline, local: LocalSql
) -> None:
    for statement in ESCAPES_SEEING_ONLY_THE_TENANT:
        answer = local_answer(local, pipeline, statement)
        if answer is not None:
            assert answer.to_pylist() == [{"tenant": TENANT}], statement
            assert PASSWD_MARK not in str(answer.to_pylist())


def test_a_new_table_version_reads_only_its_new_files(
    spark: Any, kafka: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    pipeline = Pipeline.create(kafka, tmp_path_factory.mktemp("local_sql_versions"), conf_dir)
    local = LocalSql(pipeline.lake, max_tenant_bytes=64 << 20, cache_bytes=256 << 20)
    statement = "SELECT count(*) AS n FROM events"
    pipeline.produce([record(TENANT, "web", T0_MS + n * 1000) for n in range(3)])
    pipeline.run_available_now(spark)
    first = local_answer(local, pipeline, statement)
    assert first is not None and first.to_pylist() == [{"n": 3}]
    pipeline.produce([record(TENANT, "web", T0_MS + n * 1000) for n in range(3, 5)])
    pipeline.run_available_now(spark)  # compaction replaces files: kept pieces must go
    second = local_answer(local, pipeline, statement)
    assert second is not None and second.to_pylist() == [{"n": 5}]
    assert second.to_pylist() == spark_answer(spark, pipeline, statement).to_pylist()


def test_a_service_following_the_tables_sees_each_run_and_every_row_once_meanwhile(
    spark: Any, kafka: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`serve` reads new commits in a thread (`NewestTables.follow`): each batch's rows reach
    its statements, and no version it reads (a batch's, or a compaction's swap of files) shows
    a row twice or loses one."""
    pipeline = Pipeline.create(kafka, tmp_path_factory.mktemp("local_sql_follow"), conf_dir)
    local = LocalSql(pipeline.lake, max_tenant_bytes=64 << 20, cache_bytes=256 << 20)
    service = QueryService(spark, pipeline.lake, lambda _: QueryLimits(), local)
    statement = "SELECT count(*) AS n FROM events"
    seen: list[int] = []

    def count_reaches(expected: int) -> bool:
        for _ in range(200):  # bounded: 10 s at most
            answer = service.run(TENANT, statement).table.to_pylist()
            seen.append(answer[0]["n"])
            if seen[-1] == expected:
                return True
            time.sleep(0.05)
        return False

    service.follow_tables(0.02)
    try:
        pipeline.produce([record(TENANT, "web", T0_MS + n * 1000) for n in range(3)])
        pipeline.run_available_now(spark)  # batches, then compaction's swap of their files
        assert count_reaches(3)
        pipeline.produce([record(TENANT, "web", T0_MS + n * 1000) for n in range(3, 5)])
        pipeline.run_available_now(spark)
        assert count_reaches(5)
    finally:
        service.close()
    assert set(seen) <= {3, 5}, seen


def test_a_tenant_past_its_byte_budget_is_left_to_spark(pipeline: Pipeline) -> None:
    small = LocalSql(pipeline.lake, max_tenant_bytes=10, cache_bytes=256 << 20)
    assert local_answer(small, pipeline, "SELECT count(*) AS n FROM events") is None
