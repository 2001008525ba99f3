"""The composition root: config -> Kafka source -> keyed state -> sink -> Delta, under a lease.

`StreamApp` is the one place that wires the application and owns its lifecycle: it checks the
checkpoint, creates the tables, claims the writer lease, publishes the tenant config, starts
the query, and runs the background threads (lease renewal, config watcher, notifier). `stop()`
stops all of it and joins the threads. `run_stream` is what `tenant-windows run` calls; what
the process does around the query (signals, Spark's log levels, outages, the session's stop)
is `streaming.process`.

Lifecycle, in the order the methods run:
- `claim()`: needs no Spark; checks the config and the checkpoint, creates the tables, claims
  the lease. It raises before any write if the config is invalid, the checkpoint belongs to
  another stream or layout, or a live instance holds the lease.
- or `check()`, then `stand_by(spark)` (`run --standby`): checks as `claim()` does (before
  Spark starts), builds the query's plan and starts the Python workers, then waits for the
  lease, so that a crash of the running instance costs only the query's start and its first
  batch, not a JVM's and a session's.
- `start(spark)`: claims if not yet, publishes the config, starts the query and the threads.
- the query runs; between micro-batches the config is re-read and published.
- `stop()`: idempotent; the query stops, the threads end, the lease is released.
  A graceful stop first calls `wait_between_batches()`: the batch in progress finishes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from storage.lake.commits import FencedError
from storage.lake.delta_lake import DeltaLake
from storage.lake.s3_options import LakeUnavailableError
from storage.lake.writer_lease import StreamLeaseHeldError, WriterLease
from storage.upkeep.compaction import Compaction
from storage.upkeep.settle_policy import SettlePolicy
from storage.upkeep.stream_vacuum import StreamVacuum
from streaming.checkpoint.checkpoint_identity import (
    NEW_CHECKPOINT_STATE_LAYOUT,
    StreamIdentity,
    check_checkpoint,
    claim_checkpoint,
)
from streaming.checkpoint.checkpoint_log import COMMITS_DIR, OFFSETS_DIR, CheckpointLog
from streaming.fault_points import NO_FAULTS, FaultHook
from streaming.kafka.deferral import Deferral
from streaming.kafka.group_offsets import GroupOffsets
from streaming.notify.notifier import Notifier
from streaming.observe.batch_progress import BatchProgress, LastBatchFile, ProgressListener
from streaming.observe.stream_metrics import StreamMetrics
from streaming.pipeline import worker_daemon
from streaming.pipeline.batch_sink import MicroBatchSink
from streaming.pipeline.compaction_schedule import CompactionSchedule
from streaming.pipeline.rehearsal import REHEARSAL_STOP_GRACE_S, Rehearsal
from streaming.pipeline.stream_plan import start_query, windowed_stream
from streaming.pipeline.stream_session import StartingSession
from streaming.process import (
    StopSignals,
    outage_cause,
    quiet_failure_logs,
    quiet_stopping,
    stop_spark,
)
from streaming.records.quarantine_log import QuarantineLog
from streaming.state.configured_status import ConfiguredKeyRows
from tenants.config_store import ConfigSnapshots, ConfigWatcher
from tenants.settings import AppSettings

log = logging.getLogger(__name__)

CONFIG_POLL_INTERVAL_S = 1.0
# How long `stop()` waits for Spark's progress event of the last finished batch.
PROGRESS_DRAIN_S = 5.0
# How often a graceful stop looks at the checkpoint for the batch in progress to be committed.
STOP_POLL_INTERVAL_S = 0.01


class StreamApp:
    """One instance of the stream named in `settings`."""

    def __init__(
        self,
        settings: AppSettings,
        lake: DeltaLake | None = None,
        fault_hook: FaultHook = NO_FAULTS,
        on_batch: Callable[[BatchProgress], None] | None = None,
        notify: bool = True,
    ) -> None:
        """`on_batch` is told about each finished micro-batch (e.g. to draw a progress bar);
        without `notify`, no pane's webhook is delivered (a standby's rehearsal)."""
        self.settings = settings
        self._notify = notify
        self.lake = lake or DeltaLake.from_settings(settings.lake)
        self.fault_hook = fault_hook
        self.identity = StreamIdentity(
            stream_name=settings.stream.name,
            topic=settings.kafka.topic,
            lake_root=settings.lake.root,
            state_layout=NEW_CHECKPOINT_STATE_LAYOUT,
            state_buckets=settings.stream.state_buckets,
            balanced_for_tasks=settings.stream.shuffle_partitions,
        )
        self.snapshots = ConfigSnapshots(
            f"{settings.stream.checkpoint_dir.rstrip('/')}/tenant_config"
        )
        self.checkpoint_log = CheckpointLog(settings.stream.checkpoint_dir)
        self.watcher = ConfigWatcher(
            settings.conf_dir,
            self.snapshots,
            needed_from_ms=self.checkpoint_log.oldest_batch_timestamp_ms,
        )
        self.lease: WriterLease = WriterLease.for_stream(self.lake, settings.stream)
        self.notifier = Notifier(settings, self.lake, self.snapshots, fault_hook)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._query: StreamingQuery | None = None
        self._spark: SparkSession | None = None
        self._compaction: CompactionSchedule | None = None
        self._rows: DataFrame | None = None
        self.deferral = Deferral.for_stream(
            settings.stream, self.lake.root, self.lake.storage_options or {}, self.snapshots
        )
        self.metrics = (
            None
            if settings.stream.metrics_port is None
            else StreamMetrics(
                settings.stream.name,
                self.lake,
                self.lease,
                settings.stream.metrics_tenant_limit,
            )
        )
        kafka = settings.kafka
        self.group_offsets = (
            GroupOffsets(kafka, kafka.group_id or settings.stream.name)
            if kafka.mirror_offsets
            else None
        )
        self.progress = ProgressListener(
            settings.stream.name,
            LastBatchFile(settings.stream.checkpoint_dir),
            _each(on_batch, None if self.metrics is None else self.metrics.observe),
            self.deferral.store,
            tenant_limit=settings.stream.metrics_tenant_limit,
            group_offsets=self.group_offsets,
        )
        # Its rate limit spans the batches of this instance: one object, owned here.
        self.quarantine_log = QuarantineLog(self.lake, settings.quarantine_log)

    @property
    def query(self) -> StreamingQuery:
        if self._query is None:
            raise RuntimeError("the stream has not been started")
        return self._query

    @property
    def lost(self) -> FencedError | None:
        """Why this instance lost the stream to a newer one, if it did."""
        return self.lease.lost

    def claim(self) -> int:
        """Check the checkpoint, create the tables and claim the stream; needs no Spark.

        A foreign checkpoint, and then a second instance of the stream, are refused here, before
        any write and before Spark starts. Returns the writer epoch.
        """
        if self.lease.epoch is None:
            self.check()
            self.lease.acquire()
        assert self.lease.epoch is not None
        return self.lease.epoch

    def check(self) -> None:
        """What `claim()` checks and prepares before it claims: the config (invalid at start is
        fatal), the checkpoint's identity, the tables."""
        self.watcher.check()
        self.identity = check_checkpoint(self.settings.stream.checkpoint_dir, self.identity)
        self.lake.ensure_tables()

    def stand_by(self, spark: SparkSession, stop: threading.Event) -> bool:
        """After `check()`: get ready without the lease, then wait for it. True once this
        instance holds it, False if `stop` was set first. Waits while a live instance holds it
        and while the lake cannot be reached; bounded by `stop` only, as a standby runs until
        needed."""
        if self.settings.stream.standby_rehearsal:
            self._rehearse(spark, stop)
        # After the rehearsal: building the plan registers the Kafka source with this stream's
        # deferral, where the rehearsal's registered its own.
        self._plan(spark)
        worker_daemon.start_workers(spark)
        name = self.settings.stream.name
        log.info("standing by for stream %r: ready, waiting for its lease", name)
        interval_s = self.settings.stream.standby_poll_interval_ms / 1000
        last_outage = ""
        while not stop.is_set():
            try:
                self.lease.acquire()
                return True
            except StreamLeaseHeldError as held:
                last_outage = ""
                self.lease.wait_while_held(held, interval_s, stop)
            except LakeUnavailableError as outage:
                if str(outage) != last_outage:  # once per outage, not every poll
                    log.warning("standing by for stream %r: %s", name, outage)
                last_outage = str(outage)
                stop.wait(interval_s)
        return False

    def _rehearse(self, spark: SparkSession, stop: threading.Event) -> None:
        """Run the stream once on scratch locations (`streaming.pipeline.rehearsal`), so that a
        takeover's first batch finds Spark and the workers warm."""
        rehearsal = Rehearsal.of(self.settings)
        rehearsal.remove()  # what a standby killed mid-rehearsal left
        name = self.settings.stream.name
        log.info("standing by for stream %r: rehearsing on scratch locations", name)
        started = time.monotonic()
        scratch = StreamApp(rehearsal.settings, notify=False)
        try:
            scratch.start(spark)
            with_records = rehearsal.wait_for_records(scratch.query, stop)
            # A batch cut short would log the interrupted state store's trace.
            scratch.wait_between_batches(REHEARSAL_STOP_GRACE_S, stop)
        except Exception as error:  # the rehearsal only saves time: never a reason not to wait
            log.warning("standing by for stream %r without a rehearsal: it failed: %s", name, error)
            return
        finally:
            scratch.stop()
            rehearsal.remove()
        log.info(
            "standing by for stream %r: rehearsed in %.1fs (%s)",
            name,
            time.monotonic() - started,
            "a batch with records" if with_records else "no records came",
        )

    def start(self, spark: SparkSession, available_now: bool = False) -> StreamApp:
        """Claim the stream (if not yet) and start its query; `conf/` must be valid now, and is
        re-read later."""
        writer_epoch = self.claim()
        if self.metrics is not None and self.metrics.port is None:
            port = self.settings.stream.metrics_port
            assert port is not None  # metrics exist only when a port is set
            self.metrics.serve(self.settings.stream.metrics_host, port)
        spark.streams.addListener(self.progress)
        self._spark = spark
        try:
            self._query = self._start_query(spark, writer_epoch, available_now)
        except BaseException:
            self._remove_listener()
            self.lease.release()
            if self.metrics is not None:
                self.metrics.close()
            raise
        self._threads.append(
            self.lease.keep_alive(self._stopping, on_lost=self._stop_query_after_loss)
        )
        return self

    def stop(self) -> None:
        """Stop the query and every thread, then release the stream for the next instance."""
        self._stopping.set()
        if self._query is not None:
            was_active = self._query.isActive
            self._query.stop()
            if was_active:
                self._tell_what_the_stop_cut_short(self._query)
            if self._compaction is not None and self._spark is not None:
                self._compaction.stop(self._spark)
            if not self.progress.drain(PROGRESS_DRAIN_S):
                log.warning("the last batch's progress was not reported")
            # Batches the rate limit held back are summarised now, not lost from the log.
            self.quarantine_log.flush()
        self._remove_listener()
        for thread in self._threads:
            thread.join()
        self._threads.clear()
        self.lease.release()
        if self.metrics is not None:
            self.metrics.close()

    def wait_between_batches(self, grace_s: float, stop_now: threading.Event) -> None:
        """Return once no batch is in progress (the batch Spark planned last is committed), so
        that `stop()` interrupts nothing.

        Waits at most `grace_s`, or until `stop_now` is set; a batch stopped mid-way is safe
        too (its commits are idempotent and it is replayed), only not graceful.
        """
        deadline = time.monotonic() + grace_s
        while self._query is not None and self._query.isActive:
            planned = self.checkpoint_log.latest_batch(OFFSETS_DIR)
            committed = self.checkpoint_log.latest_batch(COMMITS_DIR)
            if planned == committed:
                # The next trigger has not planned a batch yet: nothing is half done.
                log.info("stopping between batches: batch %s is committed", committed)
                break
            if stop_now.is_set():
                log.warning("stopping now: batch %d is interrupted", planned)
                break
            if time.monotonic() > deadline:
                log.warning(
                    "stopping: batch %d did not finish within the grace period of %.0fs",
                    planned,
                    grace_s,
                )
                break
            time.sleep(STOP_POLL_INTERVAL_S)

    def _tell_what_the_stop_cut_short(self, query: StreamingQuery) -> None:
        # The next trigger may plan a batch between `wait_between_batches` and the stop, and a
        # stop past the grace period cuts one short: either is replayed, and the log says so.
        planned = self.checkpoint_log.latest_batch(OFFSETS_DIR)
        if planned is None or planned == self.checkpoint_log.latest_batch(COMMITS_DIR):
            return
        failure = query.exception()
        if failure is None:  # interrupted by the stop, as it should be
            log.info("batch %d had begun as the stream stopped; the next start runs it", planned)
        else:
            log.warning(
                "batch %d failed as the stream stopped; the next start runs it: %s",
                planned,
                failure,
            )

    def _remove_listener(self) -> None:
        if self._spark is not None:
            self._spark.streams.removeListener(self.progress)
            self._spark = None
        if self.group_offsets is not None:
            self.group_offsets.close()

    def _start_query(
        self, spark: SparkSession, writer_epoch: int, available_now: bool
    ) -> StreamingQuery:
        settings = self.settings
        self.identity = claim_checkpoint(settings.stream.checkpoint_dir, self.identity)
        self.watcher.publish_at_start(_now_ms())
        self._compaction = CompactionSchedule(
            Compaction(
                self.lake,
                settings.stream.name,
                writer_epoch,
                tasks=settings.stream.shuffle_partitions,
                log_checkpoint_files=settings.stream.log_checkpoint_files,
                slice_files=settings.stream.settle_slice_files,
                policy=SettlePolicy.of(
                    settings.stream.compact_interval_ms,
                    settings.stream.merge_interval_ms,
                    settings.stream.settle_rows,
                ),
            ),
            self.checkpoint_log,
            self.fault_hook,
            between_batches=available_now,
            yields_cpu=settings.stream.compaction_yields_cpu,
            vacuum=StreamVacuum(
                self.lake,
                retention_ms=settings.lake.vacuum_retention_ms,
                interval_ms=settings.stream.vacuum_interval_ms,
            ),
        )
        sink = MicroBatchSink(
            self.lake,
            app_id=settings.stream.name,
            writer_epoch=writer_epoch,
            # Checked again right after each batch's commits, so a change is in force from the
            # next micro-batch.
            after_batch=self._after_batch,
            fault_hook=self.fault_hook,
            driver_files=ConfiguredKeyRows(self.snapshots, self.checkpoint_log),
            report=self.progress.record,
            compaction=self._compaction,
            quarantine_log=self.quarantine_log,
        )
        query = start_query(self._plan(spark), settings, sink, available_now)
        self._threads.append(
            self.watcher.watch(self._stopping, interval_s=CONFIG_POLL_INTERVAL_S, clock_ms=_now_ms)
        )
        if self._notify:
            # Off the batch path: a slow endpoint never delays a micro-batch.
            self._threads.append(self.notifier.start(self._stopping))
        return query

    def _plan(self, spark: SparkSession) -> DataFrame:
        """The query's plan, built once (`stand_by` builds it before the lease)."""
        if self._rows is None:
            self._rows = windowed_stream(
                spark,
                self.settings,
                self.snapshots,
                self.identity,
                self.fault_hook,
                self.deferral,
                None if self.metrics is None else self.metrics.track_keys(spark.sparkContext),
            )
        return self._rows

    def compact_now(self, spark: SparkSession) -> None:
        """Settle every staged row of this stream now (the end of an `--available-now` run), as
        of the last committed batch."""
        committed = self.checkpoint_log.latest_batch(COMMITS_DIR)
        if self._compaction is not None and committed is not None:
            self._compaction.now(spark, committed)

    def wait_for_notifications(self, abandon: threading.Event) -> bool:
        """Wait until every committed pane's deliveries succeeded or were dead-lettered;
        False if `abandon` was set first."""
        return self.notifier.wait_until_drained(abandon)

    def _after_batch(self, batch_id: int) -> None:
        # No config poll here: the watcher's thread polls (`watch`), and a poll stats every
        # tenant file, which at 100,000 tenants held every batch up for 0.4 s.
        every = self.settings.stream.optimize_every_batches
        if every is not None and (batch_id + 1) % every == 0:
            for table, done in self.lake.optimize().items():
                log.info(
                    "optimized %s: %d small files into %d, version %d",
                    table,
                    done.files_removed,
                    done.files_added,
                    done.version,
                )

    def _stop_query_after_loss(self) -> None:
        # Called from the lease thread: only stop the query; `stop()` joins that thread.
        if self._query is not None:
            self._query.stop()


def run_stream(
    settings: AppSettings,
    session: StartingSession,
    available_now: bool = False,
    fault_hook: FaultHook = NO_FAULTS,
    on_batch: Callable[[BatchProgress], None] | None = None,
    standby: bool = False,
) -> int:
    """Run the stream until it ends, fails or gets SIGTERM/SIGINT; the process's exit code.

    `session` is the stream's session as the caller started it (`start_stream_session`, with
    what ships the code to a cluster's executors). A first signal lets the batch in progress
    finish (at most `stream.stop_grace`), then stops and exits 0; a second one stops at once.
    `on_batch` is told about each finished batch. With `standby`, it first waits, warm, until
    the running instance stops or dies (`StreamApp.stand_by`); a signal while it waits stops it
    at once.
    """
    # The JVM and the session start (2-3 s) while the config, the checkpoint and the lake are
    # checked and the stream claimed, which need no Spark. A start refused there does not wait
    # for the session: the process ends, and its JVM with it.
    app = StreamApp(settings, fault_hook=fault_hook, on_batch=on_batch)
    if standby:
        app.check()
    else:
        app.claim()
    try:
        spark, session_s = session.result()
    except BaseException:
        app.stop()
        raise
    # Where a start's time goes (issue 38 asks for the split): the session here, the query's
    # start below, then the first batch's own progress line.
    log.info("Spark session started in %.1fs", session_s)
    debugging = log.isEnabledFor(logging.DEBUG)
    if not debugging:
        quiet_failure_logs(spark)
    stop = StopSignals(settings.stream.stop_grace_ms / 1000).install()
    try:
        if standby and not app.stand_by(spark, stop.requested):
            return 0
        if not standby:  # a standby started them while it waited
            worker_daemon.start_workers_beside(spark)
        started = time.monotonic()
        app.start(spark, available_now)
        log.info("query started in %.1fs", time.monotonic() - started)
        query = app.query
        while query.isActive and not stop.requested.is_set():
            query.awaitTermination(timeout=1)
        if query.isActive:
            app.wait_between_batches(stop.grace_s, stop.now)
        # A query that ended by itself may have failed; awaitTermination raises if it did.
        if not query.isActive:
            query.awaitTermination()
            if available_now:
                app.compact_now(spark)
                app.wait_for_notifications(stop.requested)
    except StreamingQueryException as failure:
        cause = None if debugging else outage_cause(str(failure))
        log.error("the stream failed: %s", failure if cause is None else cause)
        return 1
    finally:
        with quiet_stopping(spark):
            app.stop()
            stop_spark(spark)
    if app.lost is not None:
        log.error("the stream stopped: %s", app.lost)
        return 1
    return 0


def _now_ms() -> int:
    # Only stamps when a new tenant config takes effect; the data path uses batch timestamps.
    return time.time_ns() // 1_000_000


def _each(
    *observers: Callable[[BatchProgress], None] | None,
) -> Callable[[BatchProgress], None] | None:
    """One observer that tells every given one, in order; None if none is given."""
    present = [observer for observer in observers if observer is not None]
    if not present:
        return None

    def tell_each(progress: BatchProgress) -> None:
        for observer in present:
            observer(progress)

    return tell_each
