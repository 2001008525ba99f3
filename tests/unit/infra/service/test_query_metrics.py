"""The query service's metrics without Spark: the real app and HTTP server over a stand-in
service. Each request is counted once, by the outcome its audit line names, in a registry of
the service's own, served on a listener apart from the API's port."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import re
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import prometheus_client
import pyarrow as pa
import pytest
import requests
from pydantic import SecretStr

from infra.service.query_api import create_app
from infra.service.query_metrics import DURATION_BUCKETS_S, OUTCOMES, QueryMetrics
from infra.service.tenant_access import KeyCheck
from storage.query.query_errors import QueryError
from storage.query.query_service import QueryResult
from tests.support.metrics_scrape import by_outcome, scrape
from tests.support.paths import ROOT
from tests.support.uvicorn_server import serving

OPERATOR_KEY = "operator-key-for-unit-tests"
ROWS = 3
WAIT_S = 30


class _Unanswerable:
    """A result whose answer cannot be built: an exception no handler catches."""

    num_rows = ROWS


class StandInService:
    """Answers as `QueryService` would, by statement, without Spark."""

    def __init__(self) -> None:
        self.slow_started = threading.Event()
        self.slow_may_finish = threading.Event()

    def run(self, _scope: str | None, statement: str, _as_of: int | None = None) -> QueryResult:
        if statement == "refused":
            raise QueryError(400, "refused", "the guard said no")
        if statement == "rate":
            raise QueryError(429, "rate_limited", "too many", retry_after_s=1)
        if statement == "bug":
            raise RuntimeError("a failure inside the service")
        if statement == "unanswerable":
            return QueryResult(_Unanswerable(), False, 1)  # type: ignore[arg-type]
        if statement == "slow":
            self.slow_started.set()
            assert self.slow_may_finish.wait(WAIT_S)
        return QueryResult(pa.table({"n": list(range(ROWS))}), statement == "cut", 1)


@dataclass
class Service:
    api: str
    metrics_url: str
    stand_in: StandInService


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    stand_in = StandInService()
    metrics = QueryMetrics()
    app = create_app(
        stand_in,  # type: ignore[arg-type]
        KeyCheck(tmp_path, SecretStr(OPERATOR_KEY), 60.0),
        lambda tenant: [],
        metrics,
    )
    port = metrics.serve("127.0.0.1", 0)
    try:
        with serving(app) as api:
            yield Service(api, f"http://127.0.0.1:{port}/metrics", stand_in)
    finally:
        metrics.close()


def post(api: str, body: Any, key: str | None = OPERATOR_KEY) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    if isinstance(body, str):
        headers["Content-Type"] = "application/json"
        return requests.post(f"{api}/v1/query", data=body, headers=headers, timeout=WAIT_S)
    return requests.post(f"{api}/v1/query", json=body, headers=headers, timeout=WAIT_S)


def test_each_request_is_counted_once_by_the_outcome_of_its_audit_line(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    sent = [
        ({"sql": "ok"}, OPERATOR_KEY, 200, "ok"),
        ({"sql": "ok", "format": "csv"}, OPERATOR_KEY, 200, "ok"),
        ({"sql": "cut"}, OPERATOR_KEY, 200, "ok"),
        ({"sql": "refused"}, OPERATOR_KEY, 400, "refused"),
        ({"sql": "rate"}, OPERATOR_KEY, 429, "rate_limited"),
        ({"sql": "bug"}, OPERATOR_KEY, 500, "internal"),
        ({"sql": "unanswerable"}, OPERATOR_KEY, 500, "internal"),
        ({"sql": "ok"}, None, 401, "unauthorized"),
        ({"sql": "ok"}, "tw.acme.0000000000000000.guess", 401, "unauthorized"),
        ({"format": "json"}, OPERATOR_KEY, 400, "bad_request"),
        ({"sql": "ok", "format": "xml"}, None, 400, "bad_request"),
        ('{"sql": ', OPERATOR_KEY, 400, "bad_request"),
    ]
    with caplog.at_level(logging.INFO, logger="tenant_windows.audit"):
        statuses = [post(service.api, body, key).status_code for body, key, _, _ in sent]
    assert statuses == [status for _, _, status, _ in sent]
    # Not query requests: neither audited nor counted.
    assert requests.get(f"{service.api}/healthz", timeout=WAIT_S).status_code == 200
    assert requests.get(f"{service.api}/v1/query", timeout=WAIT_S).status_code == 405

    audits = [
        json.loads(record.getMessage())
        for record in caplog.records
        if record.name == "tenant_windows.audit"
    ]
    expected = Counter(outcome for *_, outcome in sent)
    assert Counter(audit["outcome"] for audit in audits) == expected
    samples = scrape(service.metrics_url, check_content_type=True, timeout_s=WAIT_S)
    counted = by_outcome(samples, "tenant_windows_queries_total")
    assert counted == {outcome: expected.get(outcome, 0) for outcome in OUTCOMES}
    timed = by_outcome(samples, "tenant_windows_query_duration_seconds_count")
    assert timed == counted
    # Rows and truncation of the answers that reached the caller only (not `unanswerable`).
    assert samples[("tenant_windows_query_result_rows_total", ())] == 3 * ROWS
    assert sum(audit["rows"] for audit in audits) == 3 * ROWS
    assert samples[("tenant_windows_query_results_truncated_total", ())] == 1
    assert [audit["truncated"] for audit in audits].count(True) == 1
    assert samples[("tenant_windows_queries_in_flight", ())] == 0
    bad_body = [audit for audit in audits if audit["outcome"] == "bad_request"]
    assert all(audit["tenant"] is None for audit in bad_body)  # refused before any key check


def test_the_latency_buckets_bound_the_targets_and_the_timeout() -> None:
    assert {0.3, 1} <= set(DURATION_BUCKETS_S)  # p50 and p95 targets, read without interpolation
    assert list(DURATION_BUCKETS_S) == sorted(DURATION_BUCKETS_S)
    assert DURATION_BUCKETS_S[-1] > 30 + 5  # the default statement timeout and its cancel grace


def test_a_request_is_in_flight_until_it_is_answered(service: Service) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        slow = pool.submit(post, service.api, {"sql": "slow"})
        try:
            assert service.stand_in.slow_started.wait(WAIT_S)
            during = scrape(service.metrics_url, check_content_type=True, timeout_s=WAIT_S)
        finally:
            service.stand_in.slow_may_finish.set()
        assert slow.result(timeout=WAIT_S).status_code == 200
    assert during[("tenant_windows_queries_in_flight", ())] == 1
    assert by_outcome(during, "tenant_windows_queries_total")["ok"] == 0
    after = scrape(service.metrics_url, check_content_type=True, timeout_s=WAIT_S)
    assert after[("tenant_windows_queries_in_flight", ())] == 0
    assert by_outcome(after, "tenant_windows_queries_total")["ok"] == 1


def test_metrics_live_on_their_own_port_and_in_the_services_own_registry(
    service: Service,
) -> None:
    assert post(service.api, {"sql": "ok"}).status_code == 200
    # Tenants reach the API's port: it never shows the operator's metrics.
    assert requests.get(f"{service.api}/metrics", timeout=WAIT_S).status_code == 404
    assert (
        by_outcome(
            scrape(service.metrics_url, check_content_type=True, timeout_s=WAIT_S),
            "tenant_windows_queries_total",
        )["ok"]
        == 1
    )
    other = QueryMetrics()
    assert other.registry.get_sample_value("tenant_windows_queries_total", {"outcome": "ok"}) == 0
    global_ok = prometheus_client.REGISTRY.get_sample_value(
        "tenant_windows_queries_total", {"outcome": "ok"}
    )
    assert global_ok is None


def test_the_endpoint_closes_and_port_zero_binds_a_free_port() -> None:
    metrics = QueryMetrics()
    port = metrics.serve("127.0.0.1", 0)
    assert port > 0 and metrics.endpoint.port == port
    assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S).status_code == 200
    metrics.close()
    assert metrics.endpoint.port is None
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S)


def test_every_outcome_is_a_documented_error_code() -> None:
    querying = (ROOT / "docs" / "querying.md").read_text()
    errors = querying[querying.index("- **Errors**") :].split("\n- **", 2)[0]
    documented = set(re.findall(r"`([a-z_]+)`", errors))
    assert set(OUTCOMES) - {"ok"} <= documented, set(OUTCOMES) - {"ok"} - documented
