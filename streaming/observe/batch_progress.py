"""One summary per micro-batch: a structured log line, and the last one kept in the checkpoint.

The sink knows what a batch wrote (rows per table); Spark's progress event knows what it read
(records, offsets, the broker's latest offsets) and how long the whole batch took. The two meet
here: the sink hands its `BatchOutcome` over, and `ProgressListener` joins it with the batch's
progress event, logs one JSON line on `tenant_windows.progress`, writes
`<checkpoint>/progress/last_batch.json` for `tenant-windows status`, and tells an optional
observer (a progress bar). Spark posts progress events from its listener bus, after the batch's
commit log entry, so the batch never waits for this; it still shares the driver's cores and GIL
with the batches, which is why the events arrive as one JSON string each (`json_listener`).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyarrow import fs
from pydantic import BaseModel, ConfigDict
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

from storage.lake.tables import EVENTS, LATE_EVENTS
from streaming.checkpoint.checkpoint_log import checkpoint_filesystem
from streaming.kafka.deferral import DeferralStore, batch_key
from streaming.kafka.options import partition_offsets
from streaming.observe.json_listener import JsonEventListener
from streaming.state.key_summary import top_with_remainder
from streaming.windowing.key_state import Timing

if TYPE_CHECKING:
    from streaming.kafka.group_offsets import GroupOffsets

progress_log = logging.getLogger("tenant_windows.progress")
log = logging.getLogger(__name__)

PROGRESS_DIR = "progress"
LAST_BATCH_FILE = "last_batch.json"


class BatchOutcome(BaseModel):
    """What the sink did with one micro-batch."""

    model_config = ConfigDict(frozen=True)

    batch_id: int
    rows: dict[str, int]
    """Rows committed per table; empty when the batch was already committed (a replay)."""
    already_committed: bool = False
    value_counts: dict[str, dict[str, int]] = {}
    """Per table with a `counted_by` column: rows committed per value (`events` by timing)."""
    quarantined: dict[str, int] = {}
    """Quarantined records committed, by reason."""


class BatchProgress(BaseModel):
    """One finished micro-batch, as logged and as `status` shows it."""

    model_config = ConfigDict(frozen=True)

    stream: str
    batch_id: int
    finished_at: str
    """Spark's timestamp of the batch's trigger (ISO 8601, UTC)."""
    records_read: int
    rows: dict[str, int]
    duration_ms: int
    max_kafka_lag: int | None
    """Records in the topic after this batch's end offsets, at the largest partition; None if
    Spark did not report the broker's latest offsets (the first batch after a restart re-runs
    the batch planned before it without asking the broker)."""
    already_committed: bool = False
    deferred: int = 0
    """Records read in this batch and deferred (a tenant over its quota or fair share)."""
    released: int = 0
    """Deferred records of earlier batches windowed in this one."""
    kafka_lag: dict[int, int] = {}
    """Per partition, as `max_kafka_lag`; empty when unknown."""
    record_windows: dict[str, int] = {}
    """(record, window) pairs by outcome: `on_time` and `late` (accepted, `events`),
    `too_late` (`late_events`); contract §4."""
    quarantined: dict[str, int] = {}
    """Quarantined records by reason."""
    backlog: int = 0
    """Deferred records still waiting after this batch, all tenants."""
    tenant_backlog: dict[str, int] = {}
    """The same per tenant, for the tenants with most waiting, and `_other` for the rest
    (`key_summary.top_with_remainder`); the tenant of unreadable records is ""."""
    offsets_mirrored: bool | None = None
    """Whether the batch's end offsets reached the consumer group (`kafka.group_id`); None
    when they are not mirrored, or held for a later mirror (`kafka.mirror_interval_ms`)."""


NO_OFFSETS = frozenset({"", "None", "null"})
"""What a progress event's offset holds when Spark has none: PySpark turns a JVM null into the
text "None" (`str(None)`, classic PySpark) or "null" (Spark Connect's JSON)."""


def offsets_per_partition(offset_json: str | None) -> dict[int, int] | None:
    """A source's offsets from a progress event: `{partition: offset}`, or None when the event
    has none.

    Spark leaves `latestOffset` null for the first batch after a restart (it re-runs the batch
    planned before the crash, from the offset log, without asking the broker) and
    `startOffset` null for a stream's first batch. Both forms are read: this project's source
    (`{"<partition>": offset}`) and Spark's Kafka source (`{"<topic>": {...}}`).
    """
    if offset_json is None or offset_json.strip() in NO_OFFSETS:
        return None
    try:
        offsets = json.loads(offset_json)
    except ValueError:
        log.debug("not an offset JSON: %r", offset_json[:200])
        return None
    if (
        isinstance(offsets, dict)
        and offsets
        and all(isinstance(value, dict) for value in offsets.values())
    ):
        # Spark's Kafka source: one topic per query here.
        offsets = next(iter(offsets.values()))
    if not isinstance(offsets, dict):
        return None
    try:
        return partition_offsets(offsets)
    except (TypeError, ValueError):
        log.debug("not an offset JSON: %r", offset_json[:200])
        return None


def kafka_lag(latest_offset_json: str | None, end_offset_json: str | None) -> dict[int, int]:
    """Records per partition between a batch's end offsets and the broker's latest offsets;
    empty (lag unknown) when the progress event lacks either."""
    latest = offsets_per_partition(latest_offset_json)
    end = offsets_per_partition(end_offset_json)
    if latest is None or end is None:
        return {}
    return {partition: max(latest[partition] - end.get(partition, 0), 0) for partition in latest}


class LastBatchFile:
    """`<checkpoint>/progress/last_batch.json`, written whole (temp file, then rename)."""

    def __init__(self, checkpoint_dir: str) -> None:
        self._filesystem, root = checkpoint_filesystem(checkpoint_dir)
        self._folder = f"{root}/{PROGRESS_DIR}"

    @property
    def _path(self) -> str:
        return f"{self._folder}/{LAST_BATCH_FILE}"

    def write(self, progress: BatchProgress) -> None:
        self._filesystem.create_dir(self._folder, recursive=True)
        # A reader never sees half a file: the rename replaces the old one in one step.
        temp = f"{self._folder}/.{LAST_BATCH_FILE}.{uuid.uuid4().hex}.tmp"
        with self._filesystem.open_output_stream(temp) as out:
            out.write(progress.model_dump_json().encode("utf-8"))
        self._filesystem.move(temp, self._path)

    def read(self) -> BatchProgress | None:
        if self._filesystem.get_file_info(self._path).type != fs.FileType.File:
            return None
        with self._filesystem.open_input_stream(self._path) as file:
            return BatchProgress.model_validate_json(file.read())


class ProgressListener(JsonEventListener):
    """Joins the sink's outcomes with the stream's progress events; one per running stream.

    The camelCase method names are Spark's API (hence the `noqa: N802`).
    """

    def __init__(
        self,
        stream: str,
        last_batch: LastBatchFile,
        observer: Callable[[BatchProgress], None] | None = None,
        deferral: DeferralStore | None = None,
        *,
        tenant_limit: int | None,
        group_offsets: GroupOffsets | None = None,
    ) -> None:
        """`tenant_limit`: how many tenants a batch's `tenant_backlog` names (None: all);
        `group_offsets` is given each committed batch's end offsets to mirror."""
        self.stream = stream
        self.group_offsets = group_offsets
        self.deferral = deferral
        self.tenant_limit = tenant_limit
        self.last_batch = last_batch
        self.observer = observer
        self._pending: dict[int, BatchOutcome] = {}
        self._changed = threading.Condition()
        self._reported_first = False

    def record(self, outcome: BatchOutcome) -> None:
        """Called by the sink when a batch's commits are done; reported with its progress event."""
        with self._changed:
            self._pending[outcome.batch_id] = outcome

    def drain(self, timeout_s: float) -> bool:
        """Wait until every recorded outcome is reported, then forget the rest; False if one was
        not reported in time (its batch was stopped before Spark finished it)."""
        with self._changed:
            reported = self._changed.wait_for(lambda: not self._pending, timeout=timeout_s)
            self._pending.clear()
            return reported

    def onQueryStarted(self, event: QueryStartedEvent) -> None:  # noqa: N802
        return None

    def onQueryProgress(self, event: QueryProgressEvent) -> None:  # noqa: N802
        progress = event.progress
        if progress.name != self.stream:
            return
        with self._changed:
            outcome = self._pending.pop(progress.batchId, None)
        if outcome is None:  # a trigger that ran no batch
            self._mirror_held_offsets()
            return
        try:
            self._report(outcome, progress)
        except Exception:
            # The listener bus must keep running: a lost summary is not worth failing over.
            log.exception("batch %d: could not report progress", outcome.batch_id)
        finally:
            with self._changed:
                self._changed.notify_all()

    def onQueryIdle(self, event: QueryIdleEvent) -> None:  # noqa: N802
        self._mirror_held_offsets()

    def _mirror_held_offsets(self) -> None:
        """An idle stream runs no batch to mirror the offsets its last batches held back."""
        if self.group_offsets is None:
            return
        try:
            self.group_offsets.mirror_if_due()
        except Exception:
            log.exception("could not mirror the offsets held back")

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:  # noqa: N802
        return None

    def _report(self, outcome: BatchOutcome, progress: Any) -> None:
        if not self._reported_first:
            # A start's first batch carries the start's one-off costs (Python workers, the
            # state's first load): where its time went, as Spark splits it.
            self._reported_first = True
            log.info("the run's first batch, %d: %s ms", outcome.batch_id, progress.durationMs)
        summary = batch_progress(self.stream, outcome, progress)
        if self.deferral is not None:
            counts, backlog = self.deferral.batch_counts(_batch_key_of(progress))
            summary = summary.model_copy(
                update={
                    "deferred": counts.deferred,
                    "released": counts.released,
                    "backlog": sum(backlog.values()),
                    "tenant_backlog": (
                        backlog
                        if self.tenant_limit is None
                        else top_with_remainder(backlog, self.tenant_limit)
                    ),
                }
            )
        if self.group_offsets is not None:
            ends = [offsets_per_partition(source.endOffset) for source in progress.sources]
            end = next((offsets for offsets in ends if offsets), None)
            if end is not None:
                mirrored = self.group_offsets.mirror(end)
                summary = summary.model_copy(update={"offsets_mirrored": mirrored})
        progress_log.info(summary.model_dump_json())
        self.last_batch.write(summary)
        if self.observer is not None:
            self.observer(summary)


def _batch_key_of(progress: Any) -> str | None:
    """The deferral folder of the batch a progress event reports, if its source wrote one."""
    for source in progress.sources:
        offset_json = source.endOffset
        if offset_json is None or offset_json.strip() in NO_OFFSETS:
            continue
        try:
            offset = json.loads(offset_json)
        except ValueError:
            continue
        if isinstance(offset, dict):
            return batch_key(offset)
    return None


def batch_progress(stream: str, outcome: BatchOutcome, progress: Any) -> BatchProgress:
    """The summary of one batch: the sink's outcome and Spark's `StreamingQueryProgress`.

    Every batch is summarised with what Spark gives. Of the fields read here only the sources'
    offsets can be null (`offsets_per_partition`); then the lag is unknown (None), and a batch
    without sources has no lag either. Measured with Spark 4.2, for whoever reads more of the
    event: a re-run batch's `durationMs` has no `latestOffset` and no `walCommit`;
    `inputRowsPerSecond` is 0.0 for the first batch of a run (the re-run included) and both
    rates are 0.0 for a batch without records (an empty or timeout-only batch); `eventTime`
    is always empty (the watermarks are per key, in the state, not Spark's); the sink's
    `numOutputRows` is -1 (foreachBatch).
    """
    lags: dict[int, int] = {}
    for source in progress.sources:
        lags.update(kafka_lag(source.latestOffset, source.endOffset))
    timings = outcome.value_counts.get(EVENTS.name, {})
    record_windows = {
        "on_time": timings.get(Timing.ON_TIME.value, 0),
        "late": timings.get(Timing.LATE.value, 0),
        "too_late": outcome.rows.get(LATE_EVENTS.name, 0),
    }
    return BatchProgress(
        stream=stream,
        batch_id=outcome.batch_id,
        finished_at=progress.timestamp,
        records_read=progress.numInputRows,
        rows=outcome.rows,
        duration_ms=progress.batchDuration,
        max_kafka_lag=max(lags.values()) if lags else None,
        already_committed=outcome.already_committed,
        kafka_lag=lags,
        record_windows={} if outcome.already_committed else record_windows,
        quarantined=outcome.quarantined,
    )
