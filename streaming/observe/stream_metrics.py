"""The stream's Prometheus metrics (`run --metrics-port`), in Prometheus's text format.

Each finished micro-batch (`progress.BatchProgress`, on the driver, from Spark's listener bus)
updates the batch metrics; nothing is read back from the tables for them: the counts come from
what the write tasks report of the files they wrote. What lives outside a batch (the writer
lease, the notifier's backlog and dead letters) is read when Prometheus scrapes, the lake's
part at most every `LAKE_READ_INTERVAL_S`.

Where the keys stand (open windows, watermark delay) comes from the state buckets themselves:
each reports a summary of its keys to a Spark accumulator when it runs (`key_summary`), and a
scrape merges the latest one per bucket.

Labels stay bounded whatever the number of tenants: a table, an outcome, a quarantine reason, a
Kafka partition, and a `tenant` label only for the top N tenants by watermark delay and by
backlog, with `tenant="_other"` for the rest (docs/operations.md, "Metrics").

The registry belongs to one `StreamMetrics`, never prometheus_client's global one: two streams
in one process (the tests) must not count into each other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from deltalake.exceptions import TableNotFoundError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pyspark import SparkContext
from pyspark.accumulators import Accumulator

from storage.lake.delivery_outbox import DeliveryOutbox, dead_letter_summary
from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import WINDOWS
from storage.lake.writer_lease import WriterLease
from streaming.observe.batch_progress import BatchProgress
from streaming.observe.metrics_endpoint import PREFIX, MetricsEndpoint
from streaming.state.bucket_processor import KeySummaries, LatestSummaries
from streaming.state.key_summary import BucketSummary, merge

log = logging.getLogger(__name__)

LAKE_READ_INTERVAL_S = 30.0
"""The notification backlog and dead letters are Delta reads: a scrape every few seconds must
not turn into a read of the deliveries table every few seconds."""
BATCH_DURATION_BUCKETS_S = (0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
UNREADABLE_TENANT = "_unreadable"
"""The backlog's label for records without a readable tenant (admission's queue "")."""


class StreamMetrics:
    """One stream's metrics: updated by `observe` per batch, served by `serve`."""

    def __init__(
        self, stream: str, lake: DeltaLake, lease: WriterLease, tenant_limit: int | None
    ) -> None:
        """`tenant_limit`: how many tenants get series of their own (None: all)."""
        self.registry = CollectorRegistry()
        self.tenant_limit = tenant_limit
        self.endpoint = MetricsEndpoint(self.registry)
        self.batch_duration = Histogram(
            f"{PREFIX}_batch_duration_seconds",
            "Wall time of a micro-batch, from its trigger to its commit.",
            buckets=BATCH_DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.records_read = Counter(
            f"{PREFIX}_records_read", "Kafka records read and windowed.", registry=self.registry
        )
        self.rows_written = Counter(
            f"{PREFIX}_rows_written",
            "Rows committed, per table.",
            ["table"],
            registry=self.registry,
        )
        self.record_windows = Counter(
            f"{PREFIX}_record_windows",
            "(record, window) pairs by outcome: on_time and late were accepted (events), "
            "too_late went to late_events.",
            ["outcome"],
            registry=self.registry,
        )
        self.quarantined = Counter(
            f"{PREFIX}_quarantined_records",
            "Records quarantined, per reason.",
            ["reason"],
            registry=self.registry,
        )
        self.deferred = Counter(
            f"{PREFIX}_deferred_records",
            "Records read and deferred (a tenant over its quota or fair share).",
            registry=self.registry,
        )
        self.released = Counter(
            f"{PREFIX}_released_records",
            "Deferred records windowed in a later batch.",
            registry=self.registry,
        )
        self.offset_mirror_failures = Counter(
            f"{PREFIX}_kafka_offset_mirror_failures",
            "Batches whose end offsets did not reach the consumer group (kafka.group_id).",
            registry=self.registry,
        )
        self.kafka_lag = Gauge(
            f"{PREFIX}_kafka_lag_records",
            "Records in the topic after the last batch's end offsets, per partition.",
            ["partition"],
            registry=self.registry,
        )
        self.last_batch = Gauge(
            f"{PREFIX}_last_committed_batch",
            "The id of the last micro-batch committed to the tables.",
            registry=self.registry,
        )
        self.last_batch_time = Gauge(
            f"{PREFIX}_last_committed_batch_timestamp_seconds",
            "When the last committed micro-batch finished (Unix time); its age is "
            "time() minus this.",
            registry=self.registry,
        )
        self.backlog = Gauge(
            f"{PREFIX}_deferred_backlog_records",
            "Deferred records waiting after the last batch, all tenants.",
            registry=self.registry,
        )
        self.tenant_backlog = Gauge(
            f"{PREFIX}_tenant_deferred_backlog_records",
            "Deferred records waiting after the last batch, for the tenants with most waiting; "
            'tenant="_other" sums the rest, tenant="_unreadable" is records without a tenant.',
            ["tenant"],
            registry=self.registry,
        )
        self.registry.register(_LeaseCollector(lease))
        self.registry.register(_NotificationCollector(lake, stream))
        self._keys = _KeyCollector(tenant_limit)
        self.registry.register(self._keys)

    def track_keys(self, spark: SparkContext) -> KeySummaries:
        """Where the stream's buckets report their keys: give it to the query."""
        accumulator = spark.accumulator({}, LatestSummaries())
        self._keys.accumulator = accumulator
        return KeySummaries(accumulator, self.tenant_limit)

    def observe(self, progress: BatchProgress) -> None:
        """Count one finished micro-batch."""
        self.batch_duration.observe(progress.duration_ms / 1000)
        self.last_batch.set(progress.batch_id)
        self.last_batch_time.set(time.time())
        self.kafka_lag.clear()  # partitions a topic no longer reports do not linger
        for partition, lag in progress.kafka_lag.items():
            self.kafka_lag.labels(partition=str(partition)).set(lag)
        self.backlog.set(progress.backlog)
        if progress.offsets_mirrored is False:
            self.offset_mirror_failures.inc()
        self.tenant_backlog.clear()  # a tenant whose backlog is gone leaves no stale series
        for tenant, waiting in progress.tenant_backlog.items():
            self.tenant_backlog.labels(tenant=tenant or UNREADABLE_TENANT).set(waiting)
        if progress.already_committed:
            return  # a replay: its rows were counted by the run that committed them
        self.records_read.inc(progress.records_read)
        for table, rows in progress.rows.items():
            self.rows_written.labels(table=table).inc(rows)
        for outcome, count in progress.record_windows.items():
            self.record_windows.labels(outcome=outcome).inc(count)
        for reason, count in progress.quarantined.items():
            self.quarantined.labels(reason=reason).inc(count)
        self.deferred.inc(progress.deferred)
        self.released.inc(progress.released)

    @property
    def port(self) -> int | None:
        """The metrics endpoint's port while it serves."""
        return self.endpoint.port

    def serve(self, host: str, port: int) -> int:
        """Serve `/metrics` on `host:port` from a daemon thread; the port bound."""
        return self.endpoint.start(host, port)

    def close(self) -> None:
        self.endpoint.close()


class _KeyCollector(Collector):
    """Keys, open windows and the tenants' watermark delays, from every bucket's latest
    summary. A bucket reports when it runs; one with state runs at least every
    `stream.config_recheck_interval`, so after a restart every bucket is counted within it."""

    def __init__(self, tenant_limit: int | None) -> None:
        self.tenant_limit = tenant_limit
        self.accumulator: Accumulator[dict[int, BucketSummary]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        summaries = {} if self.accumulator is None else self.accumulator.value
        gauges = merge(summaries.values(), self.tenant_limit)
        yield GaugeMetricFamily(
            f"{PREFIX}_keys", "(tenant, source) keys holding state.", value=gauges.keys
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_open_windows",
            "Windows open in the state, all keys.",
            value=gauges.open_windows,
        )
        watermarks = GaugeMetricFamily(
            f"{PREFIX}_watermark_timestamp_seconds",
            "The watermark of the tenant's slowest key (Unix time; `time() - ` it is how far "
            "its results trail), for the tenants with the oldest; "
            'tenant="_other": the oldest among the rest.',
            labels=["tenant"],
        )
        delays = GaugeMetricFamily(
            f"{PREFIX}_watermark_delay_seconds",
            "The newest event time minus the watermark, the tenant's largest over its keys, for "
            'the same tenants; tenant="_other": the largest among the rest.',
            labels=["tenant"],
        )
        for tenant, slowest in sorted(gauges.slowest.items()):
            watermarks.add_metric([tenant], slowest.watermark_ms / 1000)
            delays.add_metric([tenant], slowest.delay_ms / 1000)
        yield watermarks
        yield delays


class _LeaseCollector(Collector):
    def __init__(self, lease: WriterLease) -> None:
        self.lease = lease

    def collect(self) -> Iterator[GaugeMetricFamily]:
        held = self.lease.epoch is not None and self.lease.lost is None
        yield GaugeMetricFamily(
            f"{PREFIX}_writer_lease_held",
            "1 while this instance holds the stream's writer lease; 0 before it has, after it "
            "lost it to a newer instance, or after it released it.",
            value=1 if held else 0,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_writer_epoch",
            "The writer epoch of this instance's lease (-1 before it has one).",
            value=-1 if self.lease.epoch is None else self.lease.epoch,
        )


class _NotificationCollector(Collector):
    """The notifier's backlog and dead letters, read from the lake at most every
    LAKE_READ_INTERVAL_S; a read that fails leaves the last values (logged)."""

    def __init__(
        self, lake: DeltaLake, stream: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.lake = lake
        self.stream = stream
        self.clock = clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._values: tuple[float, float] = (0.0, 0.0)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        backlog, dead_letters = self._current()
        yield GaugeMetricFamily(
            f"{PREFIX}_notification_backlog_batches",
            "Committed windows batches whose pane notifications are not all finished.",
            value=backlog,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_dead_letter_notifications",
            "Notifications that used up their retries (`tenant-windows notify retry`).",
            value=dead_letters,
        )

    def _current(self) -> tuple[float, float]:
        with self._lock:
            now = self.clock()
            if self._read_at is None or now - self._read_at >= LAKE_READ_INTERVAL_S:
                self._read_at = now
                try:
                    self._values = self._read()
                except Exception:
                    log.warning("metrics: notifications could not be read", exc_info=True)
            return self._values

    def _read(self) -> tuple[float, float]:
        try:
            delivered_through = DeliveryOutbox(self.lake, self.stream).delivered_through()
            dead_letters = sum(c.deliveries for c in dead_letter_summary(self.lake, self.stream))
        except TableNotFoundError:
            return 0.0, 0.0  # a lake from before notifications
        windows_batch = self.lake.committed_batch(WINDOWS, self.stream)
        backlog = 0 if windows_batch is None else max(windows_batch - delivered_through, 0)
        return float(backlog), float(dead_letters)
