"""The query service's Prometheus metrics (`serve --metrics-port`): queries, latency, results.

Every `POST /v1/query` is counted once, by the outcome its audit line names (`query_api`
decides it in one place and hands it to both). Labels stay bounded: the outcome is one of
`OUTCOMES`, a closed set; there is no tenant label, for the reason the stream has none
(docs/operations.md, "Metrics for Prometheus").

The registry belongs to one `QueryMetrics`, never prometheus_client's global one: two services
in one process (the tests) must not count into each other.
"""

from __future__ import annotations

from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from storage.query.query_errors import QUERY_ERROR_CODES, QueryErrorCode
from streaming.observe.metrics_endpoint import PREFIX, MetricsEndpoint

RequestOutcome = Literal["ok", "unauthorized", "bad_request", "internal"]
"""What the door itself decides: an answer, no valid key, a body that is not a `QueryRequest`,
or a failure inside the service."""
Outcome = RequestOutcome | QueryErrorCode
OUTCOMES: tuple[Outcome, ...] = (*get_args(RequestOutcome), *QUERY_ERROR_CODES)
# Bucket bounds at 0.3 s and 1 s, the targets for p50 and p95 of answered statements: the share
# of answers within a target is one bucket over the count, with no interpolation. Above 1 s
# the bounds reach past the default statement timeout (30 s) and its cancel grace.
DURATION_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 30, 60)


class QueryMetrics:
    """One query service's metrics: counted by `record` per request, served by `serve`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.endpoint = MetricsEndpoint(self.registry)
        self.queries = Counter(
            f"{PREFIX}_queries",
            "POST /v1/query requests by outcome: ok, or the error code the caller got.",
            ["outcome"],
            registry=self.registry,
        )
        # By outcome: refusals answer in milliseconds and a timeout takes the whole timeout;
        # mixed into one histogram they would hide how long answered statements take.
        self.duration = Histogram(
            f"{PREFIX}_query_duration_seconds",
            "Time from a request's arrival to its answer, by outcome.",
            ["outcome"],
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.result_rows = Counter(
            f"{PREFIX}_query_result_rows",
            "Rows answered (ok), after the row and byte limits cut them.",
            registry=self.registry,
        )
        self.truncated = Counter(
            f"{PREFIX}_query_results_truncated",
            "Answers cut to max_result_rows or max_result_bytes (`truncated: true`).",
            registry=self.registry,
        )
        self.in_flight = Gauge(
            f"{PREFIX}_queries_in_flight",
            "POST /v1/query requests received and not yet answered.",
            registry=self.registry,
        )
        # Every outcome's series exists from the start at 0, so rate() and increase() see the
        # first request of an outcome too.
        for outcome in OUTCOMES:
            self.queries.labels(outcome=outcome)
            self.duration.labels(outcome=outcome)

    def record(self, outcome: Outcome, elapsed_s: float, rows: int, truncated: bool) -> None:
        """Count one answered request."""
        self.queries.labels(outcome=outcome).inc()
        self.duration.labels(outcome=outcome).observe(elapsed_s)
        self.result_rows.inc(rows)
        if truncated:
            self.truncated.inc()

    def serve(self, host: str, port: int) -> int:
        """Serve `/metrics` on `host:port`, apart from the API's port; the port bound."""
        return self.endpoint.start(host, port)

    def close(self) -> None:
        self.endpoint.close()
