"""`tenant-windows serve` end to end: a lake written by the real stream, the real HTTP server
(uvicorn on loopback), Spark and Delta. A tenant's key sees that tenant's rows only, and no
statement gets past the limits."""

from __future__ import annotations

import concurrent.futures
import io
import json
import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
import requests
from pydantic import SecretStr

from infra.dev.local_process import LocalProcess
from infra.dev.local_stack import find_free_loopback_port
from infra.service.query_api import create_app
from infra.service.query_metrics import OUTCOMES, QueryMetrics
from infra.service.tenant_access import KeyCheck, TenantLimits, resolved_operator_key
from storage.lake.delta_lake import DeltaLake
from storage.query.local_sql import LocalSql
from storage.query.portable_sql import local_statement
from storage.query.query_service import QueryService
from storage.query.sql_guard import check_query
from storage.query.view_catalog import TENANT_VIEW_NAMES
from streaming.observe.stream_status import tenant_key_status
from tenants.api_keys import issue_key, revoke_key
from tenants.conf_reader import ConfReader
from tenants.models import QueryLimits
from tenants.registry import ConfigError
from tenants.settings import LakeSettings, S3Settings, load_settings
from tests.support.metrics_scrape import by_outcome, scrape
from tests.support.paths import ROOT
from tests.support.pipeline_harness import Pipeline
from tests.support.served_lake import MINUTE_MS, with_query_limits
from tests.support.sql_escapes import ESCAPES_REFUSED, ESCAPES_SEEING_ONLY_THE_TENANT, PASSWD_MARK
from tests.support.timestamps import T0_MS, epoch_ms
from tests.support.uvicorn_server import serving

pytestmark = pytest.mark.integration

OPERATOR_KEY = "operator-secret-for-tests"
# acme's ordinary statements must finish well inside it on a machine the suite's workers keep
# busy; the statements that must not run at all are refused before any of it is spent.
TIMEOUT_S = 10
# What issue 19 found running forever or dying in stack traces: refused before any job runs.
HEAVY = [
    "SELECT count(*) AS n FROM " + ", ".join(f"events e{n}" for n in range(5)),
    "SELECT count(*) AS n FROM events e0"
    + "".join(f" JOIN events e{n} ON e{n}.tenant = e0.tenant" for n in range(1, 5)),
    "SELECT size(sequence(1, 2000000000)) AS n",
    "SELECT max(length(repeat(payload, 50000000))) AS n FROM events",
]
RECHECK_S = 1.0


@pytest.fixture(scope="module")
def pipeline(served_lake: Pipeline, tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    limits = {
        "acme": {"statement_timeout": f"{TIMEOUT_S}s", "max_queries_per_minute": 100_000},
        "globex": {"max_queries_per_minute": 100_000, "max_result_rows": 2},
        "initech": {"max_queries_per_minute": 3},
        "umbrella": {"statement_timeout": "1ms"},
    }
    return with_query_limits(served_lake, tmp_path_factory.mktemp("serve"), limits)


@pytest.fixture(scope="module")
def lake_conf(pipeline: Pipeline) -> Path:
    return pipeline.conf_dir


@pytest.fixture(scope="module")
def query_metrics() -> Iterator[QueryMetrics]:
    """The server's metrics, served on a port of their own (as `serve --metrics-port 0`)."""
    metrics = QueryMetrics()
    metrics.serve("127.0.0.1", 0)
    yield metrics
    metrics.close()


@pytest.fixture(scope="module")
def server(
    pipeline: Pipeline, spark: Any, lake_conf: Path, query_metrics: QueryMetrics
) -> Iterator[str]:
    settings = pipeline.settings
    lake = pipeline.lake
    limits = TenantLimits(QueryLimits(), ConfReader(lake_conf), RECHECK_S)
    # Statements the in-process engine takes run there; the rest (and every refusal) on Spark.
    local = LocalSql(lake, max_tenant_bytes=64 << 20, cache_bytes=256 << 20)
    app = create_app(
        QueryService(spark, lake, limits, local),
        KeyCheck(lake_conf, SecretStr(OPERATOR_KEY), RECHECK_S),
        lambda tenant: tenant_key_status(lake, tenant),
        query_metrics,
        limits.window_rules,
    )
    assert settings.lake.root == lake.root
    with serving(app) as url:
        yield url


@pytest.fixture(scope="module")
def keys(lake_conf: Path) -> dict[str, str]:
    tenants = ("acme", "globex", "initech", "umbrella", "wayne")
    return {tenant: issue_key(lake_conf, tenant) for tenant in tenants}


def post(server: str, key: str | None, sql: str, **body: Any) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return requests.post(
        f"{server}/v1/query", json={"sql": sql, **body}, headers=headers, timeout=60
    )


def rows(response: requests.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    body = response.json()
    names = [column["name"] for column in body["columns"]]
    return [dict(zip(names, row, strict=True)) for row in body["rows"]]


def test_the_engine_warms_on_the_lake_and_starts_on_one_not_written_yet_or_out_of_reach(
    spark: Any, pipeline: Pipeline, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    limits = QueryLimits()
    # An S3 endpoint on a loopback port nobody listens on.
    out_of_reach = LakeSettings(
        root="s3://lake/none",
        s3=S3Settings.model_validate(
            {
                "endpoint_url": f"http://127.0.0.1:{find_free_loopback_port()}",
                "allow_http": True,
                "access_key_id": "key",
                "secret_access_key": "secret",
                "timeout": "500ms",
            }
        ),
    )
    for lake, declined_at in (
        (pipeline.lake, []),
        (DeltaLake(str(tmp_path / "lake")), ["INFO"]),
        (DeltaLake.from_settings(out_of_reach), ["WARNING"]),
    ):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="storage.query.query_service"):
            QueryService(spark, lake, lambda _scope: limits).warm()
        declined = [
            record.levelname
            for record in caplog.records
            if record.getMessage().startswith("the query engine was not warmed: ")
        ]
        assert declined == declined_at, caplog.text


def test_health_needs_no_key_and_the_api_is_described(server: str) -> None:
    assert requests.get(f"{server}/healthz", timeout=10).json() == {"status": "ok"}
    paths = requests.get(f"{server}/openapi.json", timeout=10).json()["paths"]
    assert {"/v1/query", "/v1/status", "/healthz"} <= set(paths)


def test_a_tenant_counts_its_own_final_windows(
    server: str, keys: dict[str, str], pipeline: Pipeline
) -> None:
    windows = pipeline.table("windows")
    expected = int(((windows["tenant"] == "acme") & windows["is_final"]).sum())
    answer = post(server, keys["acme"], "SELECT count(*) AS n FROM windows WHERE is_final")
    assert rows(answer) == [{"n": expected}]
    assert answer.json()["truncated"] is False
    assert answer.json()["columns"] == [{"name": "n", "type": "int64"}]


@pytest.mark.parametrize("statement", ESCAPES_REFUSED)
def test_escapes_get_a_4xx_and_no_rows(
    server: str, keys: dict[str, str], pipeline: Pipeline, statement: str
) -> None:
    answer = post(server, keys["acme"], statement.format(lake=pipeline.lake.root))
    assert 400 <= answer.status_code < 500, answer.text
    assert set(answer.json()) == {"error"}
    assert "globex" not in answer.text and PASSWD_MARK not in answer.text
    assert "\n\tat " not in answer.text  # no Java stack trace


def test_a_misspelt_name_gets_the_names_it_could_mean_as_sql_says_them(
    server: str, keys: dict[str, str]
) -> None:
    column = post(server, keys["acme"], "SELECT sourse, count(*) AS n FROM windows GROUP BY 1")
    assert column.status_code == 422, column.text
    error = column.json()["error"]
    assert error["code"] == "analysis_error"
    assert error["message"].startswith("unknown column 'sourse': did you mean 'source'?")
    relation = post(server, keys["acme"], "SELECT source FROM windoes")
    assert relation.status_code == 422, relation.text
    error = relation.json()["error"]
    assert error["code"] == "analysis_error"
    assert error["message"].startswith("unknown relation 'windoes': did you mean 'windows'")


@pytest.mark.parametrize("statement", ESCAPES_SEEING_ONLY_THE_TENANT)
def test_accepted_tricks_see_only_the_callers_rows(
    server: str, keys: dict[str, str], statement: str
) -> None:
    assert rows(post(server, keys["acme"], statement)) == [{"tenant": "acme"}]


def test_missing_changed_and_revoked_keys_get_401(
    server: str, keys: dict[str, str], lake_conf: Path
) -> None:
    doomed = issue_key(lake_conf, "globex", "doomed")
    assert post(server, doomed, "SELECT 1 AS one").status_code == 200
    revoke_key(lake_conf, "globex", "doomed")
    time.sleep(RECHECK_S + 0.2)  # the server remembers a verified key this long

    changed = keys["acme"][:-1] + ("x" if keys["acme"][-1] != "x" else "y")
    for key in (None, "", changed, doomed, "tw.acme.0000000000000000.guess"):
        answer = post(server, key, "SELECT 1 AS one")
        assert answer.status_code == 401, key
        assert answer.json()["error"]["code"] == "unauthorized"


def test_the_operator_key_reads_every_tenant_and_the_outbox(server: str) -> None:
    tenants = rows(post(server, OPERATOR_KEY, "SELECT DISTINCT tenant FROM events ORDER BY 1"))
    assert tenants == [{"tenant": "acme"}, {"tenant": "globex"}, {"tenant": "wayne"}]
    assert post(server, OPERATOR_KEY, "SELECT count(*) FROM deliveries").status_code == 200
    assert post(server, OPERATOR_KEY, "DROP VIEW events").status_code == 400


def test_results_over_the_row_limit_are_cut_and_say_so(
    server: str, keys: dict[str, str], pipeline: Pipeline
) -> None:
    answer = post(server, keys["globex"], "SELECT * FROM events ORDER BY event_time")
    assert len(rows(answer)) == 2
    assert answer.json()["truncated"] is True
    assert (pipeline.table("events")["tenant"] == "globex").sum() == 3


def test_csv_and_arrow_carry_the_same_rows(server: str, keys: dict[str, str]) -> None:
    statement = "SELECT source, count(*) AS n FROM events GROUP BY source ORDER BY source"
    expected = rows(post(server, keys["acme"], statement))
    csv_text = post(server, keys["acme"], statement, format="csv").text
    assert csv_text.splitlines() == ["source,n"] + [f"{r['source']},{r['n']}" for r in expected]
    arrow = post(server, keys["acme"], statement, format="arrow")
    assert arrow.headers["content-type"] == "application/vnd.apache.arrow.stream"
    assert pa.ipc.open_stream(io.BytesIO(arrow.content)).read_all().to_pylist() == expected


def test_clean_errors_for_bad_sql_long_statements_and_bad_bodies(
    server: str, keys: dict[str, str]
) -> None:
    unknown = post(server, keys["acme"], "SELECT no_such_column FROM events")
    assert unknown.status_code == 422
    assert "\n" not in unknown.json()["error"]["message"]
    too_long = post(server, keys["acme"], "SELECT 1 AS one" + " " * 20_000)
    assert (too_long.status_code, too_long.json()["error"]["code"]) == (
        413,
        "statement_too_large",
    )
    bad = requests.post(
        f"{server}/v1/query",
        json={"sql": "SELECT 1", "format": "xml"},
        headers={"Authorization": f"Bearer {keys['acme']}"},
        timeout=30,
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_request"


def test_a_body_that_is_not_json_is_told_what_is_wrong_in_words(
    server: str, keys: dict[str, str]
) -> None:
    broken = requests.post(
        f"{server}/v1/query",
        data='{"sql": "SELECT 1",\n "format": json}',
        headers={"Authorization": f"Bearer {keys['acme']}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert broken.status_code == 400
    assert broken.json()["error"] == {
        "code": "bad_request",
        "message": "the request body is not valid JSON: expecting value at line 2 column 12",
    }


@pytest.mark.parametrize("statement", HEAVY)
def test_statements_that_would_not_fit_are_refused_up_front_while_others_answer(
    server: str, keys: dict[str, str], statement: str
) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        started = time.monotonic()
        heavy = pool.submit(post, server, keys["acme"], statement)
        small = [post(server, keys["globex"], "SELECT count(*) AS n FROM windows")]
        answer = heavy.result(timeout=TIMEOUT_S + 30)
    assert time.monotonic() - started < TIMEOUT_S + 5
    assert (answer.status_code, answer.json()["error"]["code"]) == (400, "resource_limit")
    assert "\n" not in answer.json()["error"]["message"]
    assert [response.status_code for response in small] == [200]


def test_a_statement_past_its_timeout_is_cancelled_and_the_server_goes_on(
    server: str, keys: dict[str, str]
) -> None:
    started = time.monotonic()
    answer = post(server, keys["umbrella"], "SELECT count(*) AS n FROM events")
    assert answer.status_code == 408, answer.text
    assert answer.json()["error"]["code"] == "statement_timeout"
    assert time.monotonic() - started < 5 + 5
    assert rows(post(server, keys["acme"], "SELECT 1 AS one")) == [{"one": 1}]


def test_over_the_concurrency_or_rate_limit_a_tenant_gets_429_and_others_do_not(
    server: str, keys: dict[str, str]
) -> None:
    def acme() -> requests.Response:
        return post(server, keys["acme"], "SELECT count(*) AS n FROM events a, events b")

    def globex() -> requests.Response:
        return post(server, keys["globex"], "SELECT count(*) AS n FROM events")

    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        acme_answers = [pool.submit(acme) for _ in range(50)]
        # globex, one statement at a time (within its own limits), all through acme's burst.
        globex_statuses = [globex().status_code for _ in range(5)]
        statuses = [future.result(timeout=120).status_code for future in acme_answers]
    assert globex_statuses == [200] * 5
    assert set(statuses) <= {200, 429} and 429 in statuses and 200 in statuses
    limited = [post(server, keys["initech"], "SELECT 1 AS one") for _ in range(4)]
    assert [answer.status_code for answer in limited] == [200, 200, 200, 429]
    assert limited[-1].json()["error"]["code"] == "rate_limited"
    assert int(limited[-1].headers["Retry-After"]) >= 1


def test_status_shows_the_callers_own_keys(server: str, keys: dict[str, str]) -> None:
    answer = requests.get(
        f"{server}/v1/status", headers={"Authorization": f"Bearer {keys['acme']}"}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["tenant"] == "acme"
    assert {row["source"] for row in body["keys"]} == {"web", "billing"}
    assert {row["tenant"] for row in body["keys"]} == {"acme"}
    # The rules its windows are made with, as the console's chart needs them.
    assert body["sources"] == [
        {
            "source": "billing",
            "window": {"kind": "tumbling", "size_ms": 5 * MINUTE_MS},
            "accumulation": "discarding",
            "emit": "every_pane",
        },
        {
            "source": "web",
            "window": {"kind": "tumbling", "size_ms": MINUTE_MS},
            "accumulation": "accumulating",
            "emit": "every_pane",
        },
    ]


def test_every_request_is_audited_and_no_key_is_ever_logged(
    server: str, keys: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        post(server, keys["acme"], "SELECT 1 AS one")
        post(server, keys["acme"] + "x", "SELECT 1 AS one")
    audits = [
        json.loads(r.getMessage()) for r in caplog.records if r.name == "tenant_windows.audit"
    ]
    assert [(a["tenant"], a["outcome"], a["rows"]) for a in audits[-2:]] == [
        ("acme", "ok", 1),
        (None, "unauthorized", 0),
    ]
    assert all(len(a["statement_sha256"]) == 64 for a in audits)
    for line in caplog.text.splitlines():
        assert keys["acme"] not in line and keys["acme"].rsplit(".", 1)[1] not in line


def test_the_metrics_count_each_outcome_as_the_audit_log_does(
    server: str,
    keys: dict[str, str],
    query_metrics: QueryMetrics,
    caplog: pytest.LogCaptureFixture,
) -> None:
    acme = keys["acme"]
    sent = [
        (acme, {"sql": "SELECT count(*) AS n FROM windows"}, "ok"),
        # globex may have 2 rows; it has 3 events: cut, and counted as truncated.
        (keys["globex"], {"sql": "SELECT * FROM events ORDER BY event_time"}, "ok"),
        (None, {"sql": "SELECT 1 AS one"}, "unauthorized"),
        (acme + "x", {"sql": "SELECT 1 AS one"}, "unauthorized"),
        (acme, {"sql": "DROP VIEW events"}, "refused"),
        (acme, {"sql": "SELECT no_such_column FROM events"}, "analysis_error"),
        (acme, {"sql": "SELECT 1 AS one", "format": "xml"}, "bad_request"),
        (acme, {"sql": "SELECT 1 AS one" + " " * 20_000}, "statement_too_large"),
        (acme, {"sql": HEAVY[0]}, "resource_limit"),
        (OPERATOR_KEY, {"sql": "SELECT 1 AS one", "as_of_version": 999}, "bad_version"),
        (keys["umbrella"], {"sql": "SELECT count(*) AS n FROM events"}, "statement_timeout"),
    ]
    before = scrape(f"http://127.0.0.1:{query_metrics.endpoint.port}/metrics")
    with caplog.at_level(logging.INFO, logger="tenant_windows.audit"):
        answers = [post(server, key, **body) for key, body, _ in sent]
    after = scrape(f"http://127.0.0.1:{query_metrics.endpoint.port}/metrics")
    codes = [
        answer.json()["error"]["code"] if answer.status_code != 200 else "ok" for answer in answers
    ]
    assert codes == [outcome for *_, outcome in sent]

    expected = Counter(outcome for *_, outcome in sent)
    audited = Counter(
        json.loads(r.getMessage())["outcome"]
        for r in caplog.records
        if r.name == "tenant_windows.audit"
    )
    assert audited == expected
    counted = Counter(by_outcome(after, "tenant_windows_queries_total"))
    counted.subtract(by_outcome(before, "tenant_windows_queries_total"))
    assert set(counted) == set(OUTCOMES)
    assert +counted == expected  # every other outcome: no change
    timed = Counter(by_outcome(after, "tenant_windows_query_duration_seconds_count"))
    timed.subtract(by_outcome(before, "tenant_windows_query_duration_seconds_count"))
    assert +timed == expected

    def grew(name: str) -> float:
        return after[(name, ())] - before[(name, ())]

    assert grew("tenant_windows_query_result_rows_total") == 1 + 2
    assert grew("tenant_windows_query_results_truncated_total") == 1
    assert after[("tenant_windows_queries_in_flight", ())] == 0
    # Tenants reach this port: it never shows the operator's metrics.
    assert requests.get(f"{server}/metrics", timeout=30).status_code == 404


def test_the_operator_key_may_come_from_a_secret_file(tmp_path: Path) -> None:
    (tmp_path / "operator.key").write_text("from-a-file\n")
    from_file = load_settings(
        None, {"TW_QUERY__OPERATOR_KEY": "secret:operator.key"}, {"conf_dir": str(tmp_path)}
    )
    assert resolved_operator_key(from_file) == SecretStr("from-a-file")
    missing = load_settings(
        None, {"TW_QUERY__OPERATOR_KEY": "secret:nope.key"}, {"conf_dir": str(tmp_path)}
    )
    with pytest.raises(ConfigError, match=r"query\.operator_key"):
        resolved_operator_key(missing)
    assert resolved_operator_key(load_settings(None, {})) is None


class ServeProcess(LocalProcess):
    """`tenant-windows serve` as an operator starts it: a process of its own, whose output is
    the server's log; ready once `/healthz` answers."""

    name = "tenant-windows serve"
    ready_deadline_s = 120.0
    probe_interval_s = 0.5

    def __init__(self, pipeline: Pipeline, conf: Path, log_path: Path) -> None:
        super().__init__(log_path)
        self.url = f"http://127.0.0.1:{find_free_loopback_port()}"
        self.command = [
            sys.executable, "-m", "infra.cli", "serve",
            "--conf", str(conf),
            "--lake-root", pipeline.settings.lake.root,
            "--port", self.url.rsplit(":", 1)[1],
        ]  # fmt: skip
        self.environ = pipeline.process_environ(TW_QUERY__OPERATOR_KEY=OPERATOR_KEY)

    @property
    def address(self) -> str:
        return self.url

    def start(self) -> ServeProcess:
        self._launch(self.command, cwd=ROOT, env=self.environ)
        return self

    def _probe(self) -> None:
        requests.get(f"{self.url}/healthz", timeout=2).raise_for_status()


def test_a_tenants_mistake_is_one_audit_line_in_the_servers_log_and_pools_are_configured(
    pipeline: Pipeline, lake_conf: Path, keys: dict[str, str], tmp_path: Path
) -> None:
    log_path = tmp_path / "serve.log"
    with ServeProcess(pipeline, lake_conf, log_path) as served:
        mistake = post(served.url, keys["acme"], "SELECT no_such_column FROM events")
        # Spark jobs in a tenant's pool and in the operator's (`LIKE` is Spark's alone), for a
        # tenant with the default statement timeout: the server's first Spark job is slow on
        # a slow host, and acme's short one is another test's.
        on_spark = "SELECT count(*) AS n FROM events WHERE payload LIKE '%globex%'"
        answered = [post(served.url, key, on_spark) for key in (keys["globex"], OPERATOR_KEY)]
    assert mistake.status_code == 422 and mistake.json()["error"]["code"] == "analysis_error"
    assert [answer.status_code for answer in answered] == [200, 200], answered[0].text
    log = log_path.read_text(errors="replace")
    audited = [line for line in log.splitlines() if "tenant_windows.audit" in line]
    mistakes = [line for line in audited if '"analysis_error"' in line]
    assert len(audited) == 3 and len(mistakes) == 1, audited
    assert re.search(r" (INFO|WARNING) tenant_windows\.audit: ", mistakes[0]), mistakes[0]
    # The tenant's mistake is not the server's: no ERROR, no Java frames, and no warning that
    # the pools its statements ran in were never configured.
    assert "ERROR" not in log and "at org.apache" not in log, log[-4_000:]
    assert "FairSchedulableBuilder" not in log and "has not been configured" not in log


ARTIFACTS = ROOT / "data" / "test-artifacts"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    driver.set_window_size(1200, 900)
    yield driver
    driver.quit()


def expected_window_counts(pipeline: Pipeline, tenant: str) -> dict[tuple[str, int, int], int]:
    """(source, start ms, end ms) -> records of each of the tenant's windows, from the table as
    delta-rs reads it: the latest pane's count where the source accumulates, the sum of its
    panes' counts where it discards (contract §3)."""
    windows = pipeline.table("windows")
    registry = pipeline.registry()
    counts: dict[tuple[str, int, int], int] = {}
    for (source, _window_id), panes in windows[windows["tenant"] == tenant].groupby(
        ["source", "window_id"]
    ):
        resolved = registry.resolve(tenant, source)
        assert resolved is not None
        start, end = epoch_ms(panes["window_start"].min()), epoch_ms(panes["window_end"].max())
        if resolved.rules.accumulation.value == "discarding":
            counts[(source, start, end)] = int(panes["count"].sum())
        else:
            counts[(source, start, end)] = int(panes.sort_values("pane_index")["count"].iloc[-1])
    return counts


def test_the_console_runs_sql_draws_window_counts_and_shows_status(
    server: str, keys: dict[str, str], pipeline: Pipeline, browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def cells(selector: str) -> list[list[str]]:
        rows = browser.find_elements(By.CSS_SELECTOR, f"{selector} tr")
        return [
            [cell.text for cell in row.find_elements(By.CSS_SELECTOR, "th, td")] for row in rows
        ]

    wait = WebDriverWait(browser, 60)
    browser.get(f"{server}/")
    # The page's own statements are ones the in-process engine answers: no Spark job.
    for statement in (
        browser.find_element(By.ID, "sql").get_property("value"),
        browser.execute_script("return COUNTS_SQL"),
    ):
        tree = check_query(statement, TENANT_VIEW_NAMES)
        assert local_statement(tree, QueryLimits().max_joins) is not None, statement
    browser.find_element(By.ID, "key").send_keys(keys["wayne"])
    browser.find_element(By.ID, "run").click()
    wait.until(lambda _: len(cells("#result")) > 1)
    windows = pipeline.table("windows")
    wayne = windows[windows["tenant"] == "wayne"]
    per_source = wayne.groupby("source").agg(
        panes=("count", "size"), first=("window_start", "min"), last=("window_end", "max")
    )
    assert cells("#result") == [["source", "panes", "first_window_start", "last_window_end"]] + [
        [source, str(row["panes"]), *(iso_text(row[name]) for name in ("first", "last"))]
        for source, row in per_source.sort_index().iterrows()
    ]

    browser.find_element(By.ID, "chart").click()
    wait.until(lambda _: browser.find_elements(By.CSS_SELECTOR, "#plot svg rect.window"))
    bars = browser.execute_script(
        """return [...document.querySelectorAll('#plot svg rect.window')].map(bar => ({
            source: bar.dataset.source, start: Number(bar.dataset.startMs),
            end: Number(bar.dataset.endMs), count: Number(bar.dataset.count),
            x: bar.x.baseVal.value, y: bar.y.baseVal.value,
            width: bar.width.baseVal.value, height: bar.height.baseVal.value}))"""
    )
    # What it draws is what the rows say: one bar per window of each source, of that window's
    # records, web's 1-minute windows beside billing's 5-minute ones.
    expected = expected_window_counts(pipeline, "wayne")
    drawn = {(bar["source"], bar["start"], bar["end"]): bar["count"] for bar in bars}
    assert len(drawn) == len(bars)
    assert drawn == expected
    assert drawn[("billing", T0_MS, T0_MS + 5 * MINUTE_MS)] == 3  # panes of 2 and 1, summed
    assert {bar["end"] - bar["start"] for bar in bars if bar["source"] == "web"} == {MINUTE_MS}
    assert {bar["end"] - bar["start"] for bar in bars if bar["source"] == "billing"} == {
        5 * MINUTE_MS
    }
    # Where it draws them: one time scale for both series, one count scale from one baseline,
    # so a gap between windows (web's 00:02 to 00:04) is empty space of its length.
    first = min(bar["start"] for bar in bars)
    left = min(bar["x"] for bar in bars)
    px_per_ms = max(bar["width"] / (bar["end"] - bar["start"]) for bar in bars)
    baseline = max(bar["y"] + bar["height"] for bar in bars)
    px_per_record = max(bar["height"] / bar["count"] for bar in bars)
    for bar in bars:
        assert bar["x"] == pytest.approx(left + (bar["start"] - first) * px_per_ms, abs=0.01)
        assert bar["width"] == pytest.approx((bar["end"] - bar["start"]) * px_per_ms, abs=0.01)
        assert bar["y"] + bar["height"] == pytest.approx(baseline, abs=0.01)
        assert bar["height"] == pytest.approx(bar["count"] * px_per_record, abs=0.01)
    web_starts = sorted(start for source, start, _ in drawn if source == "web")
    assert T0_MS + 2 * MINUTE_MS not in web_starts and T0_MS + 3 * MINUTE_MS not in web_starts
    assert {T0_MS + MINUTE_MS, T0_MS + 4 * MINUTE_MS} <= set(web_starts)
    # Axes: counts up the side from 0 past the largest; time along the bottom, in UTC.
    y_ticks = browser.execute_script(
        "return [...document.querySelectorAll('#plot .y-axis text[data-value]')]"
        ".map(t => Number(t.dataset.value))"
    )
    assert y_ticks[0] == 0 and y_ticks[-1] >= max(drawn.values())
    x_ticks = browser.find_elements(By.CSS_SELECTOR, "#plot .x-axis text[data-ms]")
    assert [tick.text for tick in x_ticks][:2] == ["00:00", "00:01"]
    legend = [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#plot .legend text")]
    assert legend == [
        "billing: 5 min windows, panes summed (discarding)",
        "web: 1 min windows, latest pane (accumulating)",
    ]

    browser.find_element(By.ID, "status").click()
    wait.until(lambda _: "status of wayne" in browser.find_element(By.ID, "meta").text)
    assert sorted(row[0] for row in cells("#result")[1:]) == ["billing", "web"]

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "console.png"))
    # The key stays in the page's memory.
    assert browser.execute_script("return window.localStorage.length") == 0
    assert browser.execute_script("return document.cookie") == ""
    assert browser.get_cookies() == []

    browser.find_element(By.ID, "key").clear()
    browser.find_element(By.ID, "key").send_keys("tw.acme.0000000000000000.wrong")
    browser.find_element(By.ID, "run").click()
    wait.until(lambda _: "401 unauthorized" in browser.find_element(By.ID, "message").text)


def iso_text(value: Any) -> str:
    """A timestamp as the console shows the JSON answer's: ISO 8601 with the UTC offset."""
    return str(pd.Timestamp(value).tz_convert("UTC").isoformat())
