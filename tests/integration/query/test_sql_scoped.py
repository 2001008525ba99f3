"""`tenant-windows sql --tenant T` end to end: a lake written by the real stream, the real CLI,
Spark and Delta. Whatever the statement, only T's rows come back (contract §6)."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from infra.cli.main import main
from storage.lake.tables import ALL_TABLES
from storage.query.scoped_sql import TenantSql
from storage.query.spark_views import register_views
from tests.support.pipeline_harness import Pipeline, record
from tests.support.sql_escapes import ESCAPES_REFUSED, ESCAPES_SEEING_ONLY_THE_TENANT, PASSWD_MARK
from tests.support.timestamps import T0_MS

pytestmark = pytest.mark.integration

TENANT = "acme"


@pytest.fixture(scope="module")
def pipeline(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Pipeline:
    """Two batches of six records: acme's first web window fires ON_TIME in the first and a
    LATE pane in the second; globex writes to the same tables."""
    pipeline = Pipeline.create(
        kafka, tmp_path_factory.mktemp("sql_scoped"), conf_dir, max_offsets_per_trigger=6
    )
    first_batch = [
        *(record("acme", "web", T0_MS + seconds * 1000, level="INFO") for seconds in (0, 15, 30)),
        record("acme", "web", T0_MS + 45_000, level="ERROR", note='says "hi", twice'),
        record("acme", "web", T0_MS + 75_000),
        record("globex", "web", T0_MS + 10_000),
    ]
    second_batch = [
        record("acme", "web", T0_MS + 20_000),  # late: W is 65 s, the window ended at 60 s
        record("globex", "web", T0_MS + 20_000),
        record("globex", "web", T0_MS + 80_000),
        record("acme", "billing", T0_MS + 1_000, amount=5),
        record("globex", "billing", T0_MS + 2_000, amount=7),
    ]
    pipeline.produce([*first_batch, *second_batch, b"{broken"])
    pipeline.run_available_now(spark)
    return pipeline


def run_sql(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    code = main(["sql", *args, "--lake-root", pipeline.lake.root])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def scoped_json(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str], statement: str, *args: str
) -> list[dict[str, Any]]:
    code, out, err = run_sql(
        pipeline, capsys, statement, "--tenant", TENANT, "--format", "json", *args
    )
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def acme_rows(pipeline: Pipeline, table: str) -> pd.DataFrame:
    rows = pipeline.table(table)
    return rows[rows["tenant"] == TENANT]


@pytest.mark.parametrize("statement", ESCAPES_REFUSED)
def test_escape_attempts_are_refused_with_exit_2_and_print_no_rows(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str], statement: str
) -> None:
    code, out, err = run_sql(
        pipeline, capsys, statement.format(lake=pipeline.lake.root), "--tenant", TENANT
    )
    assert code == 2
    assert err.startswith("refused: ")
    assert "globex" not in out and PASSWD_MARK not in out and str(Path.home()) not in out
    assert not Path("/tmp/tw-escape").exists()


@pytest.mark.parametrize("statement", ESCAPES_SEEING_ONLY_THE_TENANT)
def test_accepted_tricks_see_only_the_tenants_rows(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str], statement: str
) -> None:
    assert scoped_json(pipeline, capsys, statement) == [{"tenant": TENANT}]


def test_the_scoped_session_itself_reaches_nothing_else(pipeline: Pipeline, spark: Any) -> None:
    """Defence in depth: even a statement that skipped the guard, run straight on the scoped
    session, finds no unscoped view, no file relation and no ${} substitution."""
    register_views(spark, pipeline.lake)  # unscoped views in the caller's session
    scoped = TenantSql.open(spark, pipeline.lake, TENANT)
    session = scoped.session
    assert {table.name for table in session.catalog.listTables()} == set(scoped.views)
    tenants = session.sql("SELECT DISTINCT tenant FROM events").collect()
    assert [row["tenant"] for row in tenants] == [TENANT]
    with pytest.raises(Exception, match=r"events|parquet"):
        session.sql(f"SELECT * FROM parquet.`{pipeline.lake.root}/events`").collect()
    [row] = session.sql("SELECT '${env:HOME}' AS home").collect()
    assert row["home"] == "${env:HOME}"
    # The caller's own session keeps its settings and its unscoped views.
    assert spark.conf.get("spark.sql.runSQLOnFiles") == "true"


def test_scoped_views_read_only_the_tenants_partition_files(pipeline: Pipeline, spark: Any) -> None:
    scoped = TenantSql.open(spark, pipeline.lake, TENANT)
    for table in ("events", "windows", "late_events"):
        actions = DeltaTable(f"{pipeline.lake.root}/{table}").get_add_actions(flatten=True)
        files = pa.table(actions).to_pandas()
        # The stream settled every row at its end: nothing is staged.
        tenant_files = files[files["partition.layout_tenant"] == TENANT]
        read = [path for path in scoped.readable_files if f"/{table}/" in path]
        assert len(read) == len(tenant_files)
        assert all(f"layout_tenant={TENANT}/" in path for path in read)
    all_events = DeltaTable(f"{pipeline.lake.root}/events").file_uris()
    assert len([p for p in scoped.readable_files if "/events/" in p]) < len(all_events)


def test_joins_aggregates_and_window_functions_match_delta_rs(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = scoped_json(
        pipeline,
        capsys,
        "SELECT e.source, count(*) AS records, max(w.pane_index) AS last_pane, "
        "sum(count(*)) OVER (ORDER BY e.source) AS running "
        "FROM events e JOIN windows w ON e.window_id = w.window_id AND e.source = w.source "
        "AND w.is_final = false AND w.pane_index = 0 GROUP BY e.source ORDER BY e.source",
    )
    events = acme_rows(pipeline, "events")
    windows = acme_rows(pipeline, "windows")
    pane0 = windows[(windows["pane_index"] == 0) & ~windows["is_final"]]
    joined = events.merge(pane0, on=["window_id", "source"], suffixes=("", "_pane"))
    expected = joined.groupby("source").size().sort_index()
    assert [(row["source"], row["records"]) for row in rows] == list(expected.items())
    assert [row["running"] for row in rows] == list(expected.cumsum())
    assert rows and all(row["last_pane"] == 0 for row in rows)


def test_events_read_by_spark_sql_equal_delta_rs_to_pandas(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = scoped_json(
        pipeline, capsys, "SELECT offset, window_id, pane_index, payload FROM events"
    )
    expected = acme_rows(pipeline, "events")[["offset", "window_id", "pane_index", "payload"]]
    key = ["offset", "window_id"]
    got = pd.DataFrame(rows).sort_values(key).reset_index(drop=True)
    want = expected.sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def delta_rs_sql_rows(table: DeltaTable) -> pd.DataFrame:
    """docs/querying.md, "Other readers": delta-rs's SQL with a `tenant` filter, as printed."""
    query = QueryBuilder().register("events", table)
    statement = f"SELECT * FROM events WHERE tenant = '{TENANT}'"
    return pa.table(query.execute(statement).read_all()).to_pandas()


@pytest.mark.parametrize(
    "read",
    [
        delta_rs_sql_rows,
        lambda table: table.to_pandas(filters=[("tenant", "=", TENANT)]),
    ],
    ids=["QueryBuilder", "to_pandas-filters"],
)
def test_the_docs_delta_rs_readers_return_the_scoped_views_rows(
    pipeline: Pipeline,
    capsys: pytest.CaptureFixture[str],
    read: Callable[[DeltaTable], pd.DataFrame],
) -> None:
    rows = scoped_json(pipeline, capsys, "SELECT offset, window_id, pane_index FROM events")
    got = read(DeltaTable(f"{pipeline.lake.root}/events"))
    assert set(got["tenant"]) == {TENANT}
    key = ["offset", "window_id"]
    got = got[["offset", "window_id", "pane_index"]].sort_values(key).reset_index(drop=True)
    want = pd.DataFrame(rows).sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_the_docs_delta_rs_reader_holds_at_every_version_staged_ones_included(
    pipeline: Pipeline,
) -> None:
    """Before compaction a staged file holds every tenant's rows: the row filter still keeps
    only the tenant's, where a `partitions=` filter on `tenant` (what the docs once printed)
    kept whole files and with them other tenants' rows."""
    uri = f"{pipeline.lake.root}/events"
    key = ["offset", "window_id"]
    leaked = 0
    for version in range(DeltaTable(uri).version() + 1):
        at_version = DeltaTable(uri, version=version)
        every_row = at_version.to_pandas()
        want = every_row[every_row["tenant"] == TENANT].sort_values(key).reset_index(drop=True)
        for read in (
            at_version.to_pandas(filters=[("tenant", "=", TENANT)]),
            delta_rs_sql_rows(at_version),
        ):
            got = read.sort_values(key).reset_index(drop=True)
            pd.testing.assert_frame_equal(got[want.columns], want, check_dtype=False)
        leaked += len(at_version.to_pandas(partitions=[("tenant", "=", TENANT)])) - len(want)
    assert leaked > 0, "no staged version: the test no longer covers what the docs warn of"


def test_window_contents_holds_each_panes_records(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    """web accumulates: a pane's count is the number of records it holds, late ones included."""
    panes = scoped_json(
        pipeline,
        capsys,
        "SELECT window_id, pane_index, pane_timing, first(pane_count) AS pane_count, "
        "count(*) AS records, max(record_pane_index) AS newest FROM window_contents "
        "WHERE source = 'web' GROUP BY window_id, pane_index, pane_timing "
        "ORDER BY window_id, pane_index",
    )
    assert [pane["records"] for pane in panes] == [pane["pane_count"] for pane in panes]
    assert {(pane["pane_index"], pane["pane_timing"]) for pane in panes} >= {
        (0, "ON_TIME"),
        (1, "LATE"),
    }
    assert all(pane["newest"] == pane["pane_index"] for pane in panes)


def test_as_of_version_reads_each_table_at_that_version(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    events_uri = f"{pipeline.lake.root}/events"
    assert DeltaTable(events_uri).version() >= 2  # created, then one commit per batch
    for version in (0, 1):
        snapshot = DeltaTable(events_uri, version=version).to_pandas()
        [row] = scoped_json(
            pipeline,
            capsys,
            "SELECT count(*) AS n FROM events",
            "--as-of-version",
            f"events={version}",
        )
        assert row["n"] == int((snapshot["tenant"] == TENANT).sum())
    [current] = scoped_json(pipeline, capsys, "SELECT count(*) AS n FROM events")
    assert current["n"] == len(acme_rows(pipeline, "events")) > row["n"]
    code, _, err = run_sql(pipeline, capsys, "SELECT 1", "--as-of-version", "999")
    assert code == 2 and "not 999" in err


def test_csv_output_has_a_header_and_quotes_what_needs_it(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    statement = "SELECT offset, payload, event_time, pane_index FROM events ORDER BY offset"
    code, out, err = run_sql(pipeline, capsys, statement, "--tenant", TENANT, "--format", "csv")
    assert code == 0, err
    header, *rows = list(csv.reader(io.StringIO(out)))
    assert header == ["offset", "payload", "event_time", "pane_index"]
    as_json = scoped_json(pipeline, capsys, statement)
    assert [row[:2] for row in rows] == [[str(r["offset"]), r["payload"]] for r in as_json]
    assert any('says \\"hi\\", twice' in row[1] for row in rows)


def test_the_prompt_runs_each_piped_statement_through_the_guard(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = (
        "SELECT count(*) AS n\n  FROM events;\n"
        "SELECT value FROM text.`/etc/passwd`;\n"
        "SELECT DISTINCT tenant FROM windows;\n"
        "quit\n"
        "SELECT 'after quit' AS never;\n"
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO(script))
    code, out, err = run_sql(pipeline, capsys, "--tenant", TENANT, "--format", "json")
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines == [{"n": len(acme_rows(pipeline, "events"))}, {"tenant": TENANT}]
    assert err.count("refused: ") == 1 and PASSWD_MARK not in out
    assert code == 2  # one statement was refused


@pytest.mark.parametrize(
    ("tenant", "message"),
    [("nobody", "no such tenant"), ("ACME", "not a tenant id"), ("../acme", "not a tenant id")],
)
def test_an_unknown_or_malformed_tenant_is_a_clear_error(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str], tenant: str, message: str
) -> None:
    code, out, err = run_sql(pipeline, capsys, "SELECT 1", "--tenant", tenant)
    assert code == 2 and message in err and out == ""


def test_every_table_has_a_view(pipeline: Pipeline, spark: Any) -> None:
    scoped = TenantSql.open(spark, pipeline.lake, TENANT)
    assert {spec.name for spec in ALL_TABLES} < set(scoped.views)


@pytest.mark.parametrize(
    ("environ", "statement", "message"),
    [
        ({"TW_QUERY__MAX_STATEMENT_CHARS": "10"}, "SELECT 1 AS one", "statement_too_large: "),
        (
            {"TW_QUERY__MAX_JOINS": "0"},
            "SELECT count(*) AS n FROM events a JOIN events b ON a.tenant = b.tenant",
            "resource_limit: the statement joins 1 times",
        ),
        (
            {},
            "SELECT size(sequence(1, 2000000000)) AS n",
            "refused: sequence of 1,999,999,999 elements",
        ),
        (
            {"TW_QUERY__STATEMENT_TIMEOUT": "1ms"},
            "SELECT count(*) AS n FROM events",
            "statement_timeout: ",
        ),
    ],
)
def test_the_query_services_limits_hold_for_sql_tenant_too(
    pipeline: Pipeline,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    environ: dict[str, str],
    statement: str,
    message: str,
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    code, out, err = run_sql(pipeline, capsys, statement, "--tenant", TENANT)
    assert code == 2
    assert err.startswith(message), err
    assert err.count("\n") == 1 and out == ""


def test_sql_tenant_prints_at_most_the_tenants_row_limit(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TW_QUERY__MAX_RESULT_ROWS", "2")
    rows = scoped_json(pipeline, capsys, "SELECT event_id FROM events")
    assert len(rows) == 2 < len(acme_rows(pipeline, "events"))
