"""Ad-hoc Spark SQL over the Delta output: views named after the tables, scoped per tenant."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from infra.cli.main import main
from tests.support.pipeline_harness import Pipeline, record
from tests.support.timestamps import T0_MS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pipeline(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Pipeline:
    pipeline = Pipeline.create(kafka, tmp_path_factory.mktemp("sql"), conf_dir)
    pipeline.produce(
        [record("acme", "web", T0_MS + i * 15_000) for i in range(20)]
        + [record("globex", "billing", T0_MS + i * 15_000) for i in range(10)]
        + [b"{broken"]
    )
    pipeline.run_available_now(spark)
    return pipeline


def sql_json(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str], *args: str
) -> list[dict[str, Any]]:
    code = main(["sql", *args, "--lake-root", pipeline.lake.root, "--format", "json"])
    assert code == 0
    return [
        json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")
    ]


def test_sql_command_reads_every_table_by_name(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = sql_json(
        pipeline,
        capsys,
        "SELECT tenant, count(*) AS n FROM events GROUP BY tenant ORDER BY tenant",
    )
    assert rows == [{"tenant": "acme", "n": 20}, {"tenant": "globex", "n": 10}]
    [quarantined] = sql_json(
        pipeline, capsys, "SELECT reason, CAST(value AS STRING) AS v FROM quarantine"
    )
    assert quarantined == {"reason": "malformed_json", "v": "{broken"}
    [late] = sql_json(pipeline, capsys, "SELECT count(*) AS n FROM late_events")
    assert late == {"n": 0}


def test_tenant_scoped_query_sees_only_that_tenant(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = sql_json(
        pipeline,
        capsys,
        "SELECT DISTINCT tenant FROM (SELECT tenant FROM events UNION ALL SELECT tenant FROM windows)",
        "--tenant",
        "globex",
    )
    assert rows == [{"tenant": "globex"}]


def test_views_read_the_current_snapshot_not_removed_files(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    events_uri = f"{pipeline.lake.root}/events"
    files_before = len(list(Path(events_uri).rglob("*.parquet")))
    DeltaTable(events_uri).delete("tenant = 'globex'")
    rows = sql_json(pipeline, capsys, "SELECT tenant, count(*) AS n FROM events GROUP BY tenant")
    assert rows == [{"tenant": "acme", "n": 20}]
    # The removed files are still on disk: a plain Parquet read of the folder would count them.
    assert len(list(Path(events_uri).rglob("*.parquet"))) >= files_before


def test_window_columns_are_utc_timestamps_and_dates(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    [first] = sql_json(
        pipeline,
        capsys,
        "SELECT CAST(window_start AS STRING) AS s, CAST(window_date AS STRING) AS d, count "
        "FROM windows WHERE tenant = 'acme' AND pane_index = 0 ORDER BY window_start LIMIT 1",
    )
    assert first == {"s": "2026-01-01 00:00:00", "d": "2026-01-01", "count": 4}


def test_a_lake_without_output_is_refused_clearly(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["sql", "SELECT count(*) FROM events", "--lake-root", str(tmp_path / "empty")])
    assert code == 2
    error = capsys.readouterr().err
    assert f"no table events at {tmp_path / 'empty'}/events" in error
    assert "Traceback" not in error


def test_a_lake_from_before_notifications_has_an_empty_deliveries_view(
    pipeline: Pipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    older = tmp_path / "lake"
    shutil.copytree(pipeline.lake.root, older)
    shutil.rmtree(older / "deliveries")
    code = main(
        [
            "sql",
            "SELECT count(*) AS n FROM deliveries",
            "--lake-root",
            str(older),
            "--format",
            "json",
        ]
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {"n": 0}
    code = main(["sql", "SELECT count(*) AS n FROM deliveries", "--lake-root", str(older),
                 "--tenant", "acme"])  # fmt: skip
    assert code == 2
    assert "unknown relation 'deliveries'" in capsys.readouterr().err


def test_a_statement_spark_cannot_analyse_is_one_line_without_java_frames(
    pipeline: Pipeline, capfd: pytest.CaptureFixture[str]
) -> None:
    # An unknown function: refused by Spark's analysis, not before it (a misspelt column is
    # refused before Spark starts; `test_sql_in_process.py`).
    code = main(
        ["sql", "SELECT no_such_function(tenant) FROM events", "--lake-root", pipeline.lake.root]
    )
    assert code == 2
    error = capfd.readouterr().err
    # PySpark would log its own ERROR with the JVM's stack before the CLI's line.
    assert "at org.apache" not in error and " ERROR " not in error, error[-3_000:]
    [line] = [line for line in error.splitlines() if "no_such_function" in line]
    assert line.startswith("query failed: ") and "UNRESOLVED_ROUTINE" in line, line
