"""A real Prometheus scrapes a running stream (`run --metrics-port 0`) and a running query
service (`serve --metrics-port 0`), each its own `tenant-windows` process, with the alert rules
of `infra/observability/alerts.yml` loaded: what Prometheus stored matches the tables and the
requests sent, and every rule evaluates.

Prometheus is Debian's package, which infra/test.sh installs: a missing binary fails these
tests with the command that installs it, it never skips them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from infra.dev.load_generator import LoadSpec
from infra.dev.local_process import LocalProcess
from infra.dev.local_stack import find_free_loopback_port
from streaming.checkpoint.checkpoint_log import COMMITS_DIR, CheckpointLog
from tenants.conf_reader import load_registry
from tests.support.datasets import sample_records
from tests.support.local_prometheus import LocalPrometheus, debian_binary
from tests.support.paths import ROOT
from tests.support.pipeline_harness import Pipeline
from tests.support.sample_conf import copy_conf
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

ALERTS = ROOT / "infra" / "observability" / "alerts.yml"
RECORDS = 600
TABLES = ("events", "windows", "late_events", "quarantine", "tenant_status")
OPERATOR_KEY = "operator-key-for-the-scrape-test"
STREAM_JOB, QUERY_JOB = "tenant-windows-stream", "tenant-windows-query"
# Bounds for what the processes and Prometheus do in the background (scrapes every second).
CATCH_UP_S = 120.0
SCRAPED_S = 30.0
METRICS_LOGGED = re.compile(r"Prometheus metrics on http://127\.0\.0\.1:(\d+)/metrics")


class CliProcess(LocalProcess):
    """A `tenant-windows` command in a session of its own, stopped by its PID (and its JVM's);
    ready once it has logged the port its metrics took (and `health_url` answers, if given)."""

    ready_deadline_s = 120.0
    probe_interval_s = 0.5

    def __init__(
        self,
        command: Sequence[str],
        environ: Mapping[str, str],
        log_path: Path,
        health_url: str | None = None,
    ) -> None:
        self.command = list(command)
        self.environ = dict(environ)
        self.health_url = health_url
        self.metrics_port: int | None = None
        self.name = f"tenant-windows {self.command[self.command.index('infra.cli') + 1]}"
        super().__init__(log_path)

    @property
    def address(self) -> str:
        return self.health_url or "its metrics port"

    def start(self) -> CliProcess:
        self._launch(self.command, cwd=ROOT, env=self.environ)
        return self

    def _probe(self) -> None:
        logged = METRICS_LOGGED.search(self.log_path.read_text(errors="replace"))
        if logged is None:
            raise RuntimeError("no metrics port logged yet")
        if self.health_url is not None:
            requests.get(self.health_url, timeout=2).raise_for_status()
        self.metrics_port = int(logged[1])


@dataclass(frozen=True)
class Observed:
    """What ran, and what the test did, for the tests to hold Prometheus's numbers against."""

    pipeline: Pipeline
    prometheus: LocalPrometheus
    stream_port: int
    query_port: int
    table_rows: dict[str, int]
    """Rows per table, counted through the running query service (operator key)."""
    outcomes_sent: Counter[str]
    rows_answered: int


def _query(api: str, key: str | None, body: dict[str, Any]) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return requests.post(f"{api}/v1/query", json=body, headers=headers, timeout=60)


def _single(found: Mapping[Any, float]) -> float | None:
    return next(iter(found.values())) if len(found) == 1 else None


@pytest.fixture(scope="module")
def observed(
    kafka: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Observed]:
    workdir = tmp_path_factory.mktemp("scrape")
    conf = copy_conf(conf_dir, workdir)
    pipeline = Pipeline.create(
        kafka,
        workdir,
        conf,
        partitions=2,
        max_offsets_per_trigger=RECORDS // 3,
        trigger_interval="500ms",
    )
    registry = load_registry(conf)
    spec = LoadSpec(count=RECORDS, malformed_share=0.05, late_share=0.05, seed=5)
    pipeline.produce_samples(sample_records(registry, spec))
    api_port = find_free_loopback_port()
    api = f"http://127.0.0.1:{api_port}"
    serve_command = [
        sys.executable, "-m", "infra.cli", "serve",
        "--conf", str(conf),
        "--lake-root", pipeline.settings.lake.root,
        "--port", str(api_port),
        "--metrics-port", "0",
    ]  # fmt: skip
    with ExitStack() as running:
        stream = running.enter_context(
            CliProcess(
                pipeline.cli_run("--metrics-port", "0"),
                pipeline.process_environ(),
                workdir / "stream.log",
            )
        )
        serve = running.enter_context(
            CliProcess(
                serve_command,
                pipeline.process_environ(TW_QUERY__OPERATOR_KEY=OPERATOR_KEY),
                workdir / "serve.log",
                health_url=f"{api}/healthz",
            )
        )
        assert stream.metrics_port is not None and serve.metrics_port is not None
        prometheus = running.enter_context(
            LocalPrometheus(
                workdir / "prometheus",
                {
                    STREAM_JOB: f"127.0.0.1:{stream.metrics_port}",
                    QUERY_JOB: f"127.0.0.1:{serve.metrics_port}",
                },
                [ALERTS],
            )
        )
        # The stream has caught up once Prometheus has seen it read every record.
        wait_until(
            lambda: prometheus.query("tenant_windows_records_read_total"),
            CATCH_UP_S,
            "Prometheus to see the stream read every record",
            done=lambda seen: _single(seen) == RECORDS,
        )
        outcomes: Counter[str] = Counter()
        table_rows: dict[str, int] = {}
        for table in TABLES:
            answer = _query(api, OPERATOR_KEY, {"sql": f"SELECT count(*) AS n FROM {table}"})
            assert answer.status_code == 200, answer.text
            table_rows[table] = answer.json()["rows"][0][0]
            outcomes["ok"] += 1
        for key, body, outcome in (
            (None, {"sql": "SELECT 1 AS one"}, "unauthorized"),
            ("tw.acme.0000000000000000.guess", {"sql": "SELECT 1 AS one"}, "unauthorized"),
            (OPERATOR_KEY, {"sql": "DROP VIEW events"}, "refused"),
            (OPERATOR_KEY, {"sql": "SELECT 1 AS one", "format": "xml"}, "bad_request"),
        ):
            answer = _query(api, key, body)
            assert answer.json()["error"]["code"] == outcome, answer.text
            outcomes[outcome] += 1
        yield Observed(
            pipeline,
            prometheus,
            stream.metrics_port,
            serve.metrics_port,
            table_rows,
            outcomes,
            rows_answered=len(TABLES),
        )


def test_prometheus_scrapes_the_stream_and_the_query_service(observed: Observed) -> None:
    def targets() -> dict[str, tuple[str, str]]:
        active = observed.prometheus.api("targets", state="active")["activeTargets"]
        return {t["labels"]["job"]: (t["health"], t["scrapeUrl"]) for t in active}

    seen = wait_until(
        targets,
        SCRAPED_S,
        "both targets up",
        done=lambda seen: {health for health, _ in seen.values()} == {"up"} and len(seen) == 2,
    )
    assert seen == {
        STREAM_JOB: ("up", f"http://127.0.0.1:{observed.stream_port}/metrics"),
        QUERY_JOB: ("up", f"http://127.0.0.1:{observed.query_port}/metrics"),
    }


def test_what_prometheus_stored_of_the_stream_matches_its_tables(observed: Observed) -> None:
    pipeline, prometheus = observed.pipeline, observed.prometheus
    # The query service and delta-rs read the same committed rows.
    assert observed.table_rows == {table: len(pipeline.table(table)) for table in TABLES}
    assert observed.table_rows["quarantine"] > 0 and observed.table_rows["late_events"] > 0

    def rows_written() -> dict[str, float]:
        found = prometheus.query(f'tenant_windows_rows_written_total{{job="{STREAM_JOB}"}}')
        return {dict(labels)["table"]: value for labels, value in found.items()}

    # Scrapes that landed while the last batch was being counted catch up within a scrape.
    wait_until(
        rows_written,
        SCRAPED_S,
        "rows written per table as the tables hold them",
        done=lambda seen: seen == observed.table_rows,
    )
    assert _single(prometheus.query("tenant_windows_records_read_total")) == RECORDS
    # A running stream commits a batch every trigger, data or not: what Prometheus stored last
    # is a batch the checkpoint has committed since the records were read (batches 0-2).
    stored = _single(prometheus.query("tenant_windows_last_committed_batch"))
    committed = CheckpointLog(pipeline.settings.stream.checkpoint_dir).latest_batch(COMMITS_DIR)
    assert stored is not None and committed is not None
    assert 2 <= stored <= committed
    assert _single(prometheus.query("sum(tenant_windows_kafka_lag_records)")) == 0
    assert _single(prometheus.query("tenant_windows_writer_lease_held")) == 1


def test_what_prometheus_stored_of_the_query_service_matches_the_requests_sent(
    observed: Observed,
) -> None:
    prometheus = observed.prometheus

    def counted() -> Counter[str]:
        found = prometheus.query("tenant_windows_queries_total > 0")
        return Counter({dict(labels)["outcome"]: int(value) for labels, value in found.items()})

    wait_until(
        counted,
        SCRAPED_S,
        "queries per outcome as sent",
        done=lambda seen: seen == observed.outcomes_sent,
    )
    every_outcome = prometheus.query(f'tenant_windows_queries_total{{job="{QUERY_JOB}"}}')
    assert len(every_outcome) > len(observed.outcomes_sent)  # the others are there, at 0
    rows = _single(prometheus.query("tenant_windows_query_result_rows_total"))
    assert rows == observed.rows_answered
    # The label docs/operations.md's SLO query names: the bucket bound as prometheus_client
    # writes it.
    answered_within_1s = prometheus.query(
        'tenant_windows_query_duration_seconds_bucket{outcome="ok", le="1.0"}'
    )
    assert _single(answered_within_1s) is not None
    timed = _single(prometheus.query('tenant_windows_query_duration_seconds_count{outcome="ok"}'))
    assert timed == observed.outcomes_sent["ok"]
    assert _single(prometheus.query("tenant_windows_queries_in_flight")) == 0


def test_the_alert_rules_load_and_evaluate_with_health_ok(observed: Observed) -> None:
    def rules() -> dict[str, str]:
        groups = observed.prometheus.api("rules", type="alert")["groups"]
        return {rule["name"]: rule["health"] for group in groups for rule in group["rules"]}

    written = yaml.safe_load(ALERTS.read_text())["groups"]
    names = {rule["alert"] for group in written for rule in group["rules"]}
    health = wait_until(
        rules,
        SCRAPED_S,
        "every rule evaluated with health ok",
        done=lambda seen: set(seen.values()) == {"ok"},
    )
    assert set(health) == names
    # The stream runs and holds its lease, and no query failed inside the service.
    active = {alert["labels"]["alertname"] for alert in observed.prometheus.api("alerts")["alerts"]}
    quiet = {
        "TenantWindowsNotRunning",
        "TenantWindowsLeaseLost",
        "TenantWindowsDeadLetters",
        "TenantWindowsQueryInternalErrors",
    }
    assert not active & quiet, active


def _promtool(*arguments: str) -> str:
    checked = subprocess.run(
        [debian_binary("promtool"), *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = checked.stdout + checked.stderr
    assert checked.returncode == 0, output
    return output


def test_promtool_accepts_the_alert_rules() -> None:
    written = yaml.safe_load(ALERTS.read_text())["groups"]
    rules = sum(len(group["rules"]) for group in written)
    assert f"SUCCESS: {rules} rules found" in _promtool("check", "rules", str(ALERTS))


def test_promtool_accepts_the_generated_config(observed: Observed) -> None:
    assert "SUCCESS" in _promtool("check", "config", str(observed.prometheus.config_path))
