"""Named points in the data path where an injected hook is called; a no-op unless one is given.

The composition root passes a `FaultHook` down to every stage. Production passes `NO_FAULTS`,
whose call does nothing; the crash tests pass a hook that kills or pauses the process at one
point, as a lost machine or a long GC pause would. A hook is pickled to the executors with the
stage that calls it, so it must be picklable and must not capture driver-only state.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol


class FaultPoint(StrEnum):
    KAFKA_READ = "kafka_read"
    """Executor, while reading a Kafka partition range; position: an offset in the range."""
    AFTER_DEFERRAL = "after_deferral"
    """Executor, after a reader task wrote its deferred records and ledger, before Spark gets a
    row; position: the task's offset range (empty when it only releases deferred records)."""
    STATE_FUNCTION = "state_function"
    """Executor, inside the stateful function; position: an offset of the records it got."""
    BATCH_START = "batch_start"
    """Driver, in foreachBatch before anything is written; Spark's offset log holds the batch."""
    BETWEEN_TABLE_COMMITS = "between_table_commits"
    """Driver, after the first table's Delta commit and before the next one."""
    BEFORE_DELTA_COMMIT = "before_delta_commit"
    """Driver, after a table's fence and batch checks, before its Delta commit."""
    AFTER_DELTA_COMMITS = "after_delta_commits"
    """Driver, after every Delta commit, before Spark writes its commit log entry."""
    BEFORE_COMPACTION_COMMIT = "before_compaction_commit"
    """Driver, after a compaction wrote a table's settled files, before its Delta commit;
    position: the batch it runs after."""
    AFTER_COMPACTION_COMMIT = "after_compaction_commit"
    """Driver, after a compaction committed a table, before the next table; position: as above.
    In a continuous stream the compaction runs in its own thread, beside the next batches
    (`compaction_schedule`); in an `--available-now` run, in `foreachBatch`."""
    BETWEEN_SETTLE_SLICES = "between_settle_slices"
    """Driver, a settle in slices of tenants (`storage.upkeep.settle_slices`) committed a
    slice, before the next slice's commit; position: the batch the compaction runs after."""
    BEFORE_REPROCESS_COMMIT = "before_reprocess_commit"
    """Driver, `tenants reprocess`: its plan is written, a table's commit is next; position:
    how many of the run's tables are committed already."""
    BEFORE_DELIVERY = "before_delivery"
    """Driver, notifier: before a request announcing a pane; position: the pane's batch id."""
    AFTER_DELIVERY_BEFORE_RECORD = "after_delivery_before_record"
    """Driver, notifier: a request was answered, its attempt not recorded; position: as above."""


DELIVERY_POINTS = frozenset({FaultPoint.BEFORE_DELIVERY, FaultPoint.AFTER_DELIVERY_BEFORE_RECORD})
"""Reached only where some tenant has `notify` endpoints."""
REPROCESS_POINTS = frozenset({FaultPoint.BEFORE_REPROCESS_COMMIT})
"""Reached only by `tenants reprocess`, never by the stream."""


class FaultHook(Protocol):
    def reached(self, point: FaultPoint, first: int, last: int | None = None) -> None:
        """Called when `point` is reached for positions [first, last] (a batch id on the
        driver, Kafka offsets on executors, which do not know the batch id)."""


class NoFaults:
    """The production hook: does nothing."""

    def reached(self, point: FaultPoint, first: int, last: int | None = None) -> None:
        return None


NO_FAULTS: FaultHook = NoFaults()
