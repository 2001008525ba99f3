"""When the stream compacts its staged rows (`storage.upkeep`), and beside which batches.

A compaction is due after batch B when B's timestamp falls in a later interval of
`stream.merge_interval` (aligned to the epoch; at most `stream.compact_interval`; 0: after every
batch) than the last compaction this instance started. An instance's first batch compacts if a
compaction is owed (`Compaction.owed`): one that an instance which died had not committed.

It runs beside the batches that follow, in a thread of its own and in Spark's `compaction`
scheduler pool, which gets only the task slots the batches leave
(`stream_session.scheduler_conf`), and its tasks run at the lowest CPU priority
(`storage.upkeep.worker_priority`, `stream.compaction_yields_cpu`), so they get only the CPU the
batches leave too.
Run between batches instead, the compaction of a 10-minute interval at 2,000 records/s held the
stream up for 15-20 s. At most one runs at a time: a batch that finds one still running leaves
the next to a later batch. A compaction's crash safety is its commits'
(`storage.upkeep.compaction`): one cut short commits nothing, and the next instance finds its
staged files owed.

The stream's vacuum (`storage.upkeep.stream_vacuum`) runs in the same thread, after the first
compaction of each `stream.vacuum_interval`: both remove files, and one at a time keeps the
cores the batches leave for one of them.

An `--available-now` run (`between_batches`) compacts in `foreachBatch`, between its batches,
on every core: a bounded run gains nothing from the overlap, and each compaction then takes
exactly what the batches before it staged, so a crash at a named point leaves the same tables
every time. A failed compaction fails the batch after it (in a run between batches, its own).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace

from pyspark.sql import SparkSession

from storage.upkeep.compaction import Compaction, TableCompaction
from storage.upkeep.stream_vacuum import StreamVacuum
from storage.upkeep.work_thread import WorkThread
from streaming.checkpoint.checkpoint_log import CheckpointLog
from streaming.fault_points import NO_FAULTS, FaultHook, FaultPoint
from streaming.pipeline.spark_session import session_cores
from streaming.pipeline.stream_session import COMPACTION_POOL

log = logging.getLogger(__name__)


def compaction_due(now_ms: int, last_ms: int | None, interval_ms: int) -> bool:
    """Whether a batch at `now_ms` starts a compaction, the last one having started at
    `last_ms` (None: none yet)."""
    if interval_ms == 0 or last_ms is None:
        return True
    return now_ms // interval_ms > last_ms // interval_ms


def vacuum_due(now_ms: int, last_ms: int, interval_ms: int) -> bool:
    """Whether a compaction at `now_ms` is followed by the stream's vacuum, the last one (or the
    instance's first batch) having been at `last_ms`: compaction's rule, but an interval of 0
    means never."""
    return interval_ms > 0 and compaction_due(now_ms, last_ms, interval_ms)


def beside_batches(compaction: Compaction, spark: SparkSession, yields_cpu: bool) -> Compaction:
    """`compaction` with at most half the session's cores in tasks (at least one), as it runs
    beside the batches. Spark never pre-empts a task, so a batch that needs a core held by a
    compaction task waits for it to end; with half the cores left, a batch always has some.
    Cores, not task slots (`session_cores`): the default local session runs two slots a core,
    so half its slots were every core, and the minute of a 10-minute compaction at 2,000
    records/s was the one whose freshness passed 5 s. In four tasks on two cores, a compaction
    of 1.2 million rows held one batch up for 14.6 s.

    With `yields_cpu`, its tasks also run at the lowest CPU priority
    (`storage.upkeep.worker_priority`): the cores they hold are the batches' first."""
    half_the_cores = max(1, session_cores(spark) // 2)
    return replace(compaction, tasks=min(compaction.tasks, half_the_cores), yields_cpu=yields_cpu)


class CompactionStoppedError(RuntimeError):
    """The stream stopped while its compaction ran; nothing of that compaction was committed."""


@dataclass(frozen=True)
class _Running:
    """The compaction after batch `batch_id`, in a thread of its own."""

    batch_id: int
    work: WorkThread[object]


@dataclass
class CompactionSchedule:
    compaction: Compaction
    checkpoint_log: CheckpointLog
    fault_hook: FaultHook = NO_FAULTS
    between_batches: bool = False
    """Compact in `foreachBatch`, before the next batch starts (`--available-now`)."""
    yields_cpu: bool = True
    """Beside the batches, its tasks run at the lowest CPU priority (`beside_batches`); between
    them, or settling at a run's end, they have the cores to themselves and run as they are."""
    vacuum: StreamVacuum | None = None
    """Run after a compaction, in its thread, when due (`vacuum_due`)."""
    _last_started_ms: int | None = field(default=None, init=False)
    _last_vacuum_ms: int | None = field(default=None, init=False)
    """The last vacuum, or this instance's first batch."""
    _running: _Running | None = field(default=None, init=False)
    _stopping: threading.Event = field(default_factory=threading.Event, init=False)

    def after_batch(self, spark: SparkSession, batch_id: int) -> None:
        """Compact if a compaction is due after batch `batch_id`: beside the next batches, or
        now (`between_batches`). Raise what the previous one failed with."""
        if self._running is not None and not self._running.work.done:
            return
        self._finish()
        now_ms = self.checkpoint_log.batch_timestamp_ms(batch_id)
        if now_ms is None:  # a running batch's offsets entry is there, unless it is torn
            return
        if self._last_vacuum_ms is None:
            self._last_vacuum_ms = now_ms
        interval_ms = self.compaction.policy.pass_interval_ms
        # An instance's first batch compacts only if one is owed; listing the lake to know is
        # left to the compaction's thread, off the first batch's path.
        if_owed = self._last_started_ms is None and interval_ms > 0
        if not (if_owed or compaction_due(now_ms, self._last_started_ms, interval_ms)):
            return
        self._last_started_ms = now_ms
        if self.between_batches:
            if not if_owed or self.compaction.owed(now_ms):
                self._compact(self.compaction, spark, batch_id, now_ms)
                self._vacuum_if_due(now_ms)
            return
        self._running = _Running(
            batch_id,
            WorkThread(
                lambda: self._compact_in_pool(spark, batch_id, now_ms, if_owed),
                f"compaction-{batch_id}",
            ),
        )

    def now(self, spark: SparkSession, batch_id: int) -> list[TableCompaction]:
        """Settle every staged row of this stream, as of batch `batch_id`, once the compaction
        in progress (if any) is done."""
        self._finish()
        return self._compact(self.compaction, spark, batch_id, None)

    def _finish(self) -> None:
        """Wait for the compaction in progress, if any; raise its error, if it failed."""
        running, self._running = self._running, None
        if running is None:
            return
        try:
            running.work.result()
        except Exception as error:
            if self._stopping.is_set():
                raise CompactionStoppedError() from error
            raise

    def stop(self, spark: SparkSession) -> None:
        """As the stream stops: cut the compaction in progress short before its next commit (a
        commit under way completes), and the next instance runs what it left
        (`Compaction.owed`)."""
        running = self._running
        if running is None:
            return
        self._stopping.set()
        spark.sparkContext.cancelJobGroup(self._job_group(running.batch_id))
        try:
            self._finish()
        except CompactionStoppedError:
            log.info("the compaction after batch %d stopped with the stream", running.batch_id)
        except Exception as error:  # the stream stops anyway; the next instance retries it
            log.warning("the compaction after batch %d failed: %s", running.batch_id, error)

    def _compact_in_pool(
        self, spark: SparkSession, batch_id: int, now_ms: int, if_owed: bool
    ) -> list[TableCompaction]:
        if if_owed and not self.compaction.owed(now_ms):
            return []
        context = spark.sparkContext
        context.setLocalProperty("spark.scheduler.pool", COMPACTION_POOL)
        context.setJobGroup(self._job_group(batch_id), f"compaction after batch {batch_id}", True)
        beside = beside_batches(self.compaction, spark, self.yields_cpu)
        done = self._compact(beside, spark, batch_id, now_ms)
        self._vacuum_if_due(now_ms)
        return done

    def _vacuum_if_due(self, now_ms: int) -> None:
        vacuum, last_ms = self.vacuum, self._last_vacuum_ms
        if vacuum is None or last_ms is None or self._stopping.is_set():
            return
        if vacuum_due(now_ms, last_ms, vacuum.interval_ms):
            vacuum.run()
            self._last_vacuum_ms = now_ms

    def _job_group(self, batch_id: int) -> str:
        return f"{self.compaction.stream}/compaction/{batch_id}"

    def _compact(
        self, compaction: Compaction, spark: SparkSession, batch_id: int, now_ms: int | None
    ) -> list[TableCompaction]:
        def before_commit() -> None:
            if self._stopping.is_set():
                raise CompactionStoppedError()
            self.fault_hook.reached(FaultPoint.BEFORE_COMPACTION_COMMIT, batch_id)

        return compaction.run(
            spark,
            batch_id,
            now_ms,
            before_commit=before_commit,
            after_table=lambda: self.fault_hook.reached(
                FaultPoint.AFTER_COMPACTION_COMMIT, batch_id
            ),
            between_slices=lambda: self.fault_hook.reached(
                FaultPoint.BETWEEN_SETTLE_SLICES, batch_id
            ),
        )
