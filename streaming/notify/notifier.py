"""The notifier: committed `windows` panes become deliveries, recorded in the outbox.

It runs in its own threads beside the stream, off the batch path. Only committed output is
announced: it reads the `windows` table's rows of batches this stream has committed there
(`batch_id` above the outbox's high-water mark), never the stream's state. Each pane is checked
against the `notify` rules of the config in force at its batch (the batch timestamp comes from
Spark's offset log), and sent to each qualifying endpoint. The high-water mark moves past a
batch only once every delivery of it and of the batches before it is recorded as succeeded or
dead-lettered, so a restart resumes every unfinished delivery: at least once, under a stable
idempotency key, which the receiver deduplicates.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from storage.lake.batch_file_index import BatchFileIndex
from storage.lake.delivery_outbox import AttemptRow, DeliveryOutbox, Outcome, Progress
from storage.lake.delta_lake import DeltaLake
from storage.lake.log_head import LogHeads
from storage.lake.s3_options import reaching
from storage.lake.snapshot_reader import batch_files, partition_columns, read_files
from storage.lake.tables import WINDOWS
from streaming.checkpoint.checkpoint_log import CheckpointLog
from streaming.fault_points import NO_FAULTS, FaultHook
from streaming.notify.delivery import Delivery, EndpointScheduler, Send
from streaming.notify.endpoints import Endpoint, post, resolve_endpoint
from streaming.notify.payloads import PaneFacts, body_for, idempotency_key, qualifies
from tenants.conf_reader import load_registry
from tenants.config_store import ConfigSnapshots
from tenants.models import NotifyTarget
from tenants.registry import TenantRegistry
from tenants.settings import AppSettings

log = logging.getLogger(__name__)

# The high-water mark is committed with attempt rows; with none to record, at most this often.
HIGH_WATER_COMMIT_INTERVAL_S = 10.0
_PANE_COLUMNS = [
    "tenant", "source", "window_start", "window_end", "pane_index", "timing", "is_final",
    "count", "metrics", "batch_id",
]  # fmt: skip


def notify_targets(registry: TenantRegistry, tenant: str, source: str) -> tuple[NotifyTarget, ...]:
    """A key's endpoints: the tenant's override of the source's `notify`, else the source's."""
    source_config = registry.sources.get(source)
    tenant_config = registry.tenants.get(tenant)
    if source_config is None or tenant_config is None or source not in tenant_config.sources:
        return ()
    return source_config.notify_targets(tenant_config.sources[source])


class Notifier:
    """Delivers the panes of one stream's committed `windows` rows; see the module doc."""

    def __init__(
        self,
        settings: AppSettings,
        lake: DeltaLake,
        snapshots: ConfigSnapshots,
        fault_hook: FaultHook = NO_FAULTS,
        send: Send = post,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.stream = settings.stream.name
        self.settings = settings.notify
        self.conf_dir = settings.conf_dir
        self.checkpoint_log = CheckpointLog(settings.stream.checkpoint_dir)
        self.lake = lake
        self.snapshots = snapshots
        self.fault_hook = fault_hook
        self.send = send
        self.environ = os.environ if environ is None else environ
        self.outbox = DeliveryOutbox(lake, self.stream)
        self._has_notify: dict[str, bool] = {}  # by config fingerprint
        self._progress = threading.Condition()
        self._recorded_through: int | None = None
        # Set by a waiter: commit the high-water mark now rather than at the next interval.
        self.flush_requested = threading.Event()

    def start(self, stopping: threading.Event) -> threading.Thread:
        """Deliver in threads until `stopping` is set; the caller joins the returned thread,
        which joins the delivery workers."""
        thread = threading.Thread(target=self._run, args=(stopping,), name="notifier", daemon=True)
        thread.start()
        return thread

    def wait_until_drained(self, abandon: threading.Event) -> bool:
        """Block until every pane committed to `windows` so far is delivered or dead-lettered
        (bounded: each delivery has a bounded number of attempts); False if `abandon` is set."""
        target = self.committed_windows_batch()
        with self._progress:
            while not abandon.is_set():
                if self._recorded_through is not None and self._recorded_through >= target:
                    return True
                self.flush_requested.set()
                self._progress.wait(timeout=0.5)
        return False

    def _run(self, stopping: threading.Event) -> None:
        run = _Run(self, stopping)
        try:
            while not stopping.is_set():
                try:
                    run.step()
                except Exception:
                    # The lake or config may be unreachable for a while; deliveries wait.
                    log.exception("notifier: will try again")
                    stopping.wait(self.settings.poll_interval_ms / 1000)
        finally:
            run.finish()

    def publish_recorded(self, through: int) -> None:
        """The outbox's high-water mark is now `through`: wake `wait_until_drained`."""
        with self._progress:
            self._recorded_through = through
            self._progress.notify_all()

    def committed_windows_batch(self, heads: LogHeads | None = None) -> int:
        """The newest batch this stream committed to `windows`; -1 before any. Read from the
        table's head (`DeltaLake.committed_batch`), which holds none of its files."""
        committed = self.lake.committed_batch(WINDOWS, self.stream, heads)
        return -1 if committed is None else committed

    def plan(
        self,
        pane_rows: Callable[[int, int], pa.Table],
        after: int,
        through: int,
        done: Mapping[tuple[str, str], Progress],
    ) -> list[Delivery]:
        """The deliveries of panes in `windows` batches (after, through], minus finished ones.
        `pane_rows(after, through)` reads those batches' rows (`_PANE_COLUMNS`) at a version
        holding batch `through`: only when a rule in force at one of them notifies anyone."""
        registries = {
            batch: self._registry_at_batch(batch) for batch in range(after + 1, through + 1)
        }
        if not any(self._any_notify(registry) for registry in registries.values()):
            return []
        panes = [PaneFacts.from_row(row) for row in pane_rows(after, through).to_pylist()]
        panes.sort(key=lambda p: (p.batch_id, p.tenant, p.source, p.window_start_ms, p.pane_index))
        endpoints: dict[NotifyTarget, Endpoint] = {}
        deliveries = []
        for pane in panes:
            for target in notify_targets(registries[pane.batch_id], pane.tenant, pane.source):
                if not qualifies(target.on, pane):
                    continue
                endpoint = endpoints.get(target)
                if endpoint is None:
                    endpoint = resolve_endpoint(target, self.conf_dir, self.environ)
                    endpoints[target] = endpoint
                key = idempotency_key(self.stream, pane)
                progress = done.get((key, endpoint.endpoint_id))
                if progress is not None and progress.finished:
                    continue
                deliveries.append(
                    Delivery(
                        self.stream,
                        key,
                        pane,
                        endpoint,
                        body_for(target.kind, pane),
                        first_attempt=1 if progress is None else progress.last_attempt + 1,
                    )
                )
        return deliveries

    def _registry_at_batch(self, batch_id: int) -> TenantRegistry:
        timestamp_ms = self.checkpoint_log.batch_timestamp_ms(batch_id)
        if timestamp_ms is None:
            # Spark purges old offset log entries; a pane that old gets today's rules.
            return self.snapshots.registry_at(2**62)
        return self.snapshots.registry_at(timestamp_ms)

    def _any_notify(self, registry: TenantRegistry) -> bool:
        known = self._has_notify.get(registry.fingerprint)
        if known is None:
            known = registry.notifies_anyone()
            self._has_notify[registry.fingerprint] = known
        return known


class _Run:
    """One run of the notifier thread: what it planned, what is outstanding, what is recorded."""

    def __init__(self, notifier: Notifier, stopping: threading.Event) -> None:
        self.notifier = notifier
        self.stopping = stopping
        self.results: queue.Queue[AttemptRow] = queue.Queue()
        self.scheduler = EndpointScheduler(
            notifier.settings, notifier.send, notifier.fault_hook, self.results.put, stopping
        )
        self.windows = BatchFileIndex(
            notifier.lake.table_uri(WINDOWS), notifier.lake.storage_options
        )
        """`windows`' files that may hold batches not planned yet: read only once a pane is to
        be notified (`Notifier.plan`)."""
        self.heads = LogHeads()
        self.recorded: int | None = None
        self.planned = -1
        self.outstanding: Counter[int] = Counter()  # unfinished deliveries per windows batch
        self.pending: list[AttemptRow] = []
        self.resumed: dict[tuple[str, str], Progress] = {}
        self.last_commit_s = time.monotonic()

    def step(self) -> None:
        notifier = self.notifier
        if self.recorded is None:
            self.recorded = notifier.outbox.delivered_through()
            self.planned = self.recorded
            # What an earlier run did past the mark; this run adds rows only for what it plans.
            self.resumed = notifier.outbox.progress_after(self.recorded)
            notifier.publish_recorded(self.recorded)
        committed = notifier.committed_windows_batch(self.heads)
        if committed > self.planned:
            plan = notifier.plan(self._pane_rows, self.planned, committed, self.resumed)
            for delivery in plan:
                self.outstanding[delivery.pane.batch_id] += 1
                self.scheduler.submit(delivery)
            self.planned = committed
        self._collect(timeout_s=notifier.settings.poll_interval_ms / 1000)
        self._commit(force=notifier.flush_requested.is_set())

    def _pane_rows(self, after: int, through: int) -> pa.Table:
        """`windows`' rows of batches (after, through] at its newest version, from the files
        that may hold them (`BatchFileIndex`); delta-rs's for a log the index cannot follow."""
        lake = self.notifier.lake
        batch_id = ds.field("batch_id")
        in_batches = (batch_id > after) & (batch_id <= through)
        # An outage is one line naming the lake, as everywhere else, not delta-rs's error chain.
        with reaching(lake.root, lake.storage_options, "reading table windows"):
            files = self.windows.files(after, through)
            if files is not None:
                table_uri = lake.table_uri(WINDOWS)
                partitions = _partition_schema(self.windows.partition_columns)
            else:
                table = lake.open(WINDOWS)
                table_uri, partitions = table.table_uri, partition_columns(table)
                files = batch_files(table, after, through)
            return read_files(
                table_uri,
                partitions,
                files,
                WINDOWS.schema,
                lake.storage_options,
                _PANE_COLUMNS,
                in_batches,
            )

    def finish(self) -> None:
        self.scheduler.join()
        self._collect(timeout_s=0)
        if self.recorded is not None:
            try:
                self._commit(force=True)
            except Exception:
                log.exception("notifier: attempts not recorded at stop; they are repeated")

    def _collect(self, timeout_s: float) -> None:
        for row in _drain(self.results, timeout_s):
            self.pending.append(row)

    def _commit(self, force: bool) -> None:
        assert self.recorded is not None
        finished = Counter(
            row.windows_batch_id for row in self.pending if row.outcome is not Outcome.RETRYING
        )
        outstanding = self.outstanding - finished
        through = min(outstanding) - 1 if outstanding else self.planned
        advance = through > self.recorded
        due = force or time.monotonic() - self.last_commit_s >= HIGH_WATER_COMMIT_INTERVAL_S
        if not self.pending and not (advance and due):
            return
        self.notifier.outbox.record(self.pending, through if advance else None)
        self.notifier.flush_requested.clear()
        self.outstanding, self.pending = outstanding, []
        self.last_commit_s = time.monotonic()
        if advance:
            self.recorded = through
            self.notifier.publish_recorded(through)


def _partition_schema(names: tuple[str, ...]) -> pa.Schema:
    """The partition columns `names` with their types: the layout's, or the tenant's own of a
    lake written before the staged layout."""
    fields = {field.name: field for field in (*WINDOWS.schema, *WINDOWS.storage_schema)}
    return pa.schema([fields[name] for name in names if name in fields])


def _drain(results: queue.Queue[AttemptRow], timeout_s: float) -> Iterator[AttemptRow]:
    try:
        yield results.get(timeout=timeout_s) if timeout_s > 0 else results.get_nowait()
    except queue.Empty:
        return
    while True:
        try:
            yield results.get_nowait()
        except queue.Empty:
            return


@dataclass(frozen=True)
class RetryReport:
    delivered: int
    dead_lettered: int
    endpoint_gone: int
    """Dead letters whose endpoint is no longer in the tenant's config; left as they are."""


def retry_dead_letters(
    settings: AppSettings,
    lake: DeltaLake,
    tenant: str | None = None,
    fault_hook: FaultHook = NO_FAULTS,
    send: Send = post,
    environ: Mapping[str, str] | None = None,
) -> RetryReport:
    """Attempt every dead-lettered delivery again (same key, same body, new attempt numbers),
    to the endpoint as the current config resolves it; each gets a fresh retry budget."""
    outbox = DeliveryOutbox(lake, settings.stream.name)
    registry = load_registry(settings.conf_dir)
    deliveries: list[Delivery] = []
    endpoint_gone = 0
    for row in outbox.dead_letters(tenant):
        endpoint = _endpoint_now(registry, row, settings.conf_dir, environ)
        if endpoint is None:
            endpoint_gone += 1
            continue
        deliveries.append(
            Delivery(
                row.stream,
                row.idempotency_key,
                _pane_of(row),
                endpoint,
                row.body.encode(),
                first_attempt=row.attempt + 1,
            )
        )
    results: queue.Queue[AttemptRow] = queue.Queue()
    finished = threading.Event()
    scheduler = EndpointScheduler(settings.notify, send, fault_hook, results.put, finished)
    for delivery in deliveries:
        scheduler.submit(delivery)
    scheduler.wait_idle()
    finished.set()
    scheduler.join()
    attempts = list(_drain(results, timeout_s=0))
    if attempts:
        outbox.record(attempts)
    final = [row for row in attempts if row.outcome is not Outcome.RETRYING]
    return RetryReport(
        delivered=sum(row.outcome is Outcome.SUCCEEDED for row in final),
        dead_lettered=sum(row.outcome is Outcome.DEAD_LETTER for row in final),
        endpoint_gone=endpoint_gone,
    )


def _endpoint_now(
    registry: TenantRegistry,
    row: AttemptRow,
    conf_dir: Path,
    environ: Mapping[str, str] | None,
) -> Endpoint | None:
    for target in notify_targets(registry, row.tenant, row.source):
        endpoint = resolve_endpoint(target, conf_dir, environ)
        if endpoint.endpoint_id == row.endpoint_id:
            return endpoint
    return None


def _pane_of(row: AttemptRow) -> PaneFacts:
    # A redelivery sends the stored body under the stored key: of the pane, only what names it
    # in the outbox is needed, and the outbox holds just that.
    return PaneFacts(
        tenant=row.tenant,
        source=row.source,
        window_start_ms=row.window_start_ms,
        window_end_ms=row.window_start_ms,
        pane_index=row.pane_index,
        timing="",
        is_final=False,
        count=0,
        metrics=(),
        batch_id=row.windows_batch_id,
    )
