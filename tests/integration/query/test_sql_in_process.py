"""`tenant-windows sql` answers without a JVM what it can: refusals, unknown tenants and missing
lakes before Spark starts, and statements the in-process engine answers as Spark would, printed
exactly as the Spark path prints them."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from infra.cli import sql_commands
from infra.cli.main import main
from infra.cli.sql_shell import render_frame
from storage.query.spark_text import NotPrintable, java_double, render_rows
from tests.support.paths import ROOT
from tests.support.pipeline_harness import Pipeline, record
from tests.support.timestamps import T0_MS

pytestmark = pytest.mark.integration

TENANT = "acme"
# Statements the in-process engine answers, each with a total order: both paths print the same
# rows in the same order (for rows that tie, neither engine promises one).
EVENTS_ORDER = "tenant, source, window_id, pane_index, partition, offset, batch_id"
CORPUS = [
    f"SELECT * FROM events ORDER BY {EVENTS_ORDER}",
    "SELECT * FROM windows ORDER BY tenant, source, window_id, pane_index, batch_id",
    "SELECT * FROM late_events ORDER BY tenant, source, partition, offset, window_id",
    "SELECT * FROM quarantine ORDER BY partition, offset",
    "SELECT * FROM tenant_status ORDER BY tenant, source, batch_id",
    "SELECT source, window_id, pane_index, pane_timing, record_window_id, offset, payload "
    "FROM window_contents ORDER BY source, window_id, pane_index, offset, record_window_id",
    "SELECT tenant, source, count(*) AS panes, sum(count) AS records, avg(count) AS mean_count, "
    "min(window_start), max(watermark) FROM windows GROUP BY tenant, source "
    "ORDER BY tenant, source",
    "SELECT count(*) FROM events WHERE payload IS NULL OR event_id IS NULL",
    "SELECT DISTINCT timing FROM events ORDER BY timing DESC",
    "SELECT upper(source) AS s, pane_index + 1 AS next_pane, is_final, window_date "
    "FROM windows WHERE window_start >= '2026-01-01 00:01:00' ORDER BY s, next_pane, "
    "window_date, is_final",
    "SELECT e.offset, e.payload, w.count AS pane_count FROM events e JOIN windows w "
    "ON e.window_id = w.window_id AND e.pane_index = w.pane_index AND e.tenant = w.tenant "
    "ORDER BY e.offset, pane_count, e.payload",
    "SELECT coalesce(lifecycle, 'unknown') AS lifecycle, on_time_records FROM tenant_status "
    "ORDER BY on_time_records, lifecycle",
    "SELECT count(*) AS none FROM events WHERE tenant = 'nobody'",
    "SELECT source FROM events WHERE tenant = 'nobody' ORDER BY source",
]
OPERATOR_ONLY = ["SELECT * FROM deliveries ORDER BY idempotency_key, attempt"]


@pytest.fixture(scope="module")
def pipeline(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Pipeline:
    """Two tenants on both sources: late panes, a too-late record, malformed records, and
    payloads with quotes, backslashes, control characters and wide characters."""
    pipeline = Pipeline.create(
        kafka, tmp_path_factory.mktemp("sql_in_process"), conf_dir, max_offsets_per_trigger=8
    )
    pipeline.produce(
        [
            *(record("acme", "web", T0_MS + seconds * 1000, level="INFO") for seconds in (0, 15)),
            record("acme", "web", T0_MS + 45_000, level="ERROR", note='it\'s "quoted"'),
            record("acme", "web", T0_MS + 75_000, note="a\\b\ttab\nnew line \x01 日本語 😀"),
            record("globex", "web", T0_MS + 10_000),
            record("acme", "billing", T0_MS + 1_000, amount=5),
            record("globex", "billing", T0_MS + 2_000, amount=7.25),
            record("acme", "web", T0_MS + 200_000),
            record("acme", "web", T0_MS + 20_000),  # too late
            record("acme", "web", T0_MS + 130_000),
            record("acme", "web", T0_MS + 150_000),  # late
            record("globex", "web", T0_MS + 80_000),
        ]
    )
    pipeline.produce([b"{broken", b'{"tenant": "acme", "source": "nope"}'])
    pipeline.run_available_now(spark)
    return pipeline


def run_cli(
    pipeline: Pipeline,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    arguments: list[str],
    in_process: bool,
) -> tuple[int, str, str]:
    """`sql` in this process: in-process (and failing if Spark would start), or on Spark."""
    with monkeypatch.context() as patch:
        patch.setenv("TW_QUERY__LOCAL_ENGINE", "true" if in_process else "false")
        if in_process:

            def no_spark(self: Any) -> bool:
                raise AssertionError("the statement went to Spark")

            patch.setattr(sql_commands._OnSpark, "open", no_spark)
        code = main(
            ["sql", *arguments, "--lake-root", pipeline.lake.root, "--conf", str(pipeline.conf_dir)]
        )
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("output_format", ["table", "csv", "json"])
@pytest.mark.parametrize(
    "scope", [["--tenant", TENANT], []], ids=["scoped", "operator"]
)  # fmt: skip
def test_in_process_answers_print_exactly_what_spark_prints(
    pipeline: Pipeline,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    scope: list[str],
    output_format: str,
) -> None:
    statements = CORPUS if scope else [*CORPUS, *OPERATOR_ONLY]
    # A limit below the rows: the table format says so, the others print fewer rows.
    limits = ("1000", "2") if output_format == "table" else ("1000",)
    for statement in statements:
        for limit in limits:
            arguments = [statement, *scope, "--format", output_format, "--limit", limit]
            on_spark = run_cli(pipeline, capsys, monkeypatch, arguments, in_process=False)
            in_process = run_cli(pipeline, capsys, monkeypatch, arguments, in_process=True)
            assert in_process == on_spark, statement
            assert on_spark[0] == 0, on_spark[2]


def test_the_tenant_row_limit_and_timeout_hold_in_process(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TW_QUERY__MAX_RESULT_ROWS", "3")
    arguments = [CORPUS[0], "--tenant", TENANT]
    in_process = run_cli(pipeline, capsys, monkeypatch, arguments, in_process=True)
    assert in_process == run_cli(pipeline, capsys, monkeypatch, arguments, in_process=False)
    assert "only showing top 3 rows" in in_process[1]
    monkeypatch.setenv("TW_QUERY__STATEMENT_TIMEOUT", "1ms")
    code, out, err = run_cli(pipeline, capsys, monkeypatch, arguments, in_process=True)
    assert (code, out) == (2, "")
    assert err.startswith("statement_timeout: the statement ran longer than 0.001 s")


def test_what_the_engine_leaves_still_runs_on_spark(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement outside the in-process engine's parts, and an operator's statement the
    tenant guard would refuse: Spark answers both, as before."""
    monkeypatch.delenv("TW_QUERY__LOCAL_ENGINE", raising=False)
    lake = ["--lake-root", pipeline.lake.root, "--conf", str(pipeline.conf_dir)]
    statement = "SELECT sha2(payload, 256) IS NOT NULL AS hashed FROM events LIMIT 1"
    assert main(["sql", statement, "--tenant", TENANT, *lake]) == 0
    assert "|true  |" in capsys.readouterr().out
    assert main(["sql", "SHOW TABLES", *lake]) == 0
    assert "window_contents" in capsys.readouterr().out


def test_rows_in_no_order_come_in_the_documented_order_from_both_engines(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ORDER BY, both paths print the rows sorted by every column (`result_order`),
    and a LIMIT keeps the first rows of that order: the same text in-process and on Spark."""
    statements = [
        "SELECT source, count(*) AS n FROM events GROUP BY source",
        "SELECT * FROM windows LIMIT 3",
        "SELECT * FROM events LIMIT 4 OFFSET 1",
        "SELECT timing, payload FROM events",
        "SELECT source, batch_id, sum(on_time_records) OVER (PARTITION BY source ORDER BY "
        "batch_id) AS on_time_so_far FROM tenant_status",
    ]
    for statement in statements:
        for scope in (["--tenant", TENANT], []):
            arguments = [statement, *scope, "--format", "csv"]
            in_process = run_cli(pipeline, capsys, monkeypatch, arguments, in_process=True)
            on_spark = run_cli(pipeline, capsys, monkeypatch, arguments, in_process=False)
            assert in_process == on_spark, statement
            assert in_process[0] == 0, in_process[2]
            rows = list(csv.reader(io.StringIO(in_process[1])))[1:]
            assert rows == sorted(rows, key=_sort_key) or "payload" not in statement
    code, out, _ = run_cli(
        pipeline, capsys, monkeypatch, [statements[0], "--tenant", TENANT, "--format", "json"], True
    )
    assert code == 0 and [json.loads(line)["source"] for line in out.splitlines()] == [
        "billing",
        "web",
    ]


def _sort_key(row: list[str]) -> list[tuple[bool, str]]:
    """A CSV row as the rule sorts text: NULL (an empty field) first."""
    return [(cell != "", cell) for cell in row]


def test_a_misspelled_column_or_view_is_refused_before_spark_with_what_it_could_mean(
    pipeline: Pipeline,
) -> None:
    lake = ["--lake-root", pipeline.lake.root, "--conf", str(pipeline.conf_dir)]
    code, out, err, spark = cli_process("SELECT sourse FROM events", "--tenant", TENANT, *lake)
    assert (code, out, spark) == (2, "", False)
    assert err.startswith("query failed: unknown column 'sourse': did you mean 'source'?")
    code, out, err, spark = cli_process("SELECT count(*) FROM event", *lake)
    assert (code, out, spark) == (2, "", False)
    assert "unknown relation 'event': did you mean 'events'" in err


def cli_process(*arguments: str) -> tuple[int, str, str, bool]:
    """`sql` as a new process: its exit code, output, errors, and whether it loaded pyspark."""
    probe = (
        "import sys\n"
        "from infra.cli.main import main\n"
        "code = main(sys.argv[1:])\n"
        "sys.stdout.flush()\n"
        "print('pyspark loaded' if 'pyspark' in sys.modules else 'no pyspark', file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, "sql", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    *errors, loaded = done.stderr.rstrip("\n").split("\n")
    return done.returncode, done.stdout, "\n".join(errors), loaded == "pyspark loaded"


def test_a_refusal_an_unknown_tenant_and_a_missing_lake_start_no_spark(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    lake = ["--lake-root", pipeline.lake.root, "--conf", str(pipeline.conf_dir)]
    code, out, err, spark = cli_process(
        "SELECT value FROM text.`/etc/passwd`", "--tenant", TENANT, *lake
    )
    assert (code, out, spark) == (2, "", False)
    assert err.startswith("refused: ") and err.count("\n") == 0
    code, out, err, spark = cli_process("SELECT 1", "--tenant", "nobody", *lake)
    assert (code, out, spark) == (2, "", False) and "no such tenant" in err
    for root in (tmp_path / "nowhere", tmp_path):  # no root at all; a root with no table
        code, out, err, spark = cli_process(
            "SELECT count(*) FROM events",
            "--lake-root",
            str(root),
            "--conf",
            str(pipeline.conf_dir),
        )
        assert (code, out, spark) == (2, "", False)
        assert err == (
            f"no table events at {root}/events: no stream has written to the lake {root} yet "
            "(check lake.root, TW_LAKE__ROOT or --lake-root)"
        )
    code, out, err, spark = cli_process("SELECT 1", "--as-of-version", "999", *lake)
    assert (code, out, spark) == (2, "", False) and "not 999" in err


def test_small_statements_are_answered_without_a_jvm(pipeline: Pipeline) -> None:
    lake = ["--lake-root", pipeline.lake.root, "--conf", str(pipeline.conf_dir)]
    events = pipeline.table("events")
    statement = "SELECT tenant, count(*) AS n FROM events GROUP BY tenant ORDER BY tenant"
    code, out, err, spark = cli_process(statement, "--tenant", TENANT, "--format", "json", *lake)
    assert (code, spark) == (0, False), err
    assert [json.loads(line) for line in out.splitlines()] == [
        {"tenant": TENANT, "n": int((events["tenant"] == TENANT).sum())}
    ]
    code, out, err, spark = cli_process(statement, "--format", "json", *lake)
    assert (code, spark) == (0, False), err
    counts = events.groupby("tenant").size()
    assert [json.loads(line) for line in out.splitlines()] == [
        {"tenant": tenant, "n": int(n)} for tenant, n in sorted(counts.items())
    ]


def test_spark_text_prints_values_as_spark_does(spark: Any) -> None:
    """Values the lake's rows do not hold: every kind of type, NULLs, escapes, wide text."""
    texts = ["a", None, 'q"u\\o\nte\tx\x01\x7f\r\f\b\v\a', "日本語", "😀x", "", "e\u0301", "a,b"]
    texts += ["\u1100\u115f\u1160\u2e80\ua4cf\ua4d0\uac00\ud7a3\ud7a4\uf900\ufaff\ufe10\ufe19"]
    texts += ["\ufe1a\ufe30\ufe6f\uff00\uff60\uff61\uffe0\uffe6\uffe7\u3000\u2028\x00\x1f"]
    rows = len(texts)
    moments = [dt.datetime(2026, 1, 1, 0, 0, 0, n * 100_007 % 1_000_000) for n in range(rows)]
    moments[1] = dt.datetime(1, 1, 1)
    table = pa.table(
        {
            "s": pa.array(texts),
            "i": pa.array([None if n == 2 else n * 7_919 - 20 for n in range(rows)], pa.int64()),
            "i32": pa.array([-(2**31), *range(rows - 1)], pa.int32()),
            "d": pa.array([None, 0.0, -0.0, 1.5, 2 / 3, 9_999_999.5, 0.001, -123.456, 1e-3, 42.0]),
            "b": pa.array([True, False, None, True, False, True, True, False, True, False]),
            "ts": pa.array([None, *moments[1:]], pa.timestamp("us", tz="UTC")),
            "day": pa.array([dt.date(2026, 1, n + 1) for n in range(rows)], pa.date32()),
            "arr": pa.array([["a", None], None, [], *([[t or "x"] for t in texts[3:]])]),
            "m": pa.array(
                [[("k", 1.0)], None, [], [("a", None), ("b", 2.5)], *([[("x", 0.1)]] * (rows - 4))],
                pa.map_(pa.string(), pa.float64()),
            ),
            "bin": pa.array(
                [b"ab", None, b"", b"\x00\xff", b"x" * 57, b"y" * 58, b"z" * 114, b"w" * 120]
                + [b"{broken"] * (rows - 8)
            ),
            "odd name\n\t,": pa.array(range(rows), pa.int64()),
        }
    )
    assert table.num_rows == rows
    frame = spark.createDataFrame(table)
    for output_format in ("table", "csv", "json"):
        for limit in (1, 4, rows, rows + 5):
            expected = render_frame(frame, output_format, limit)
            assert render_rows(table.slice(0, limit + 1), output_format, limit) == expected
        empty = frame.limit(0)
        assert render_rows(table.slice(0, 0), output_format, 3) == render_frame(
            empty, output_format, 3
        )


def test_doubles_print_as_java_does_where_they_are_printed(spark: Any) -> None:
    generator = random.Random(7)
    values = [n / d for n in range(0, 400) for d in range(1, 30)]
    values += [generator.uniform(1e-3, 1e7) for _ in range(5_000)]
    values += [generator.uniform(1e-3, 1) for _ in range(5_000)]
    frame = spark.createDataFrame([(value,) for value in values], "d double")
    cast = frame.select(F.col("d").cast("string").alias("text")).collect()
    for value, row in zip(values, cast, strict=True):
        assert java_double(value) == row["text"], value
    for declined in (1e7, 1.5e-4, math.inf, math.nan, 2.82879384806159e17):
        with pytest.raises(NotPrintable):
            java_double(declined)
