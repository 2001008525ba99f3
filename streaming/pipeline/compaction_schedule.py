"""When the stream compacts its staged rows (`storage.upkeep`): between micro-batches, on a
cadence of batch timestamps, so a replayed batch decides exactly as the original did.

Compaction runs after batch B when B's timestamp falls in a later interval of
`stream.merge_interval` (aligned to the epoch; at most `stream.compact_interval`) than batch
B-1's, and as of B's timestamp: what it settles and what it merges (`SettlePolicy`) keeps every
row within the age limit plus one batch. A batch replayed after a crash finishes the compaction
it started (the staged files are listed again), so restarts leave the same tables.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import SparkSession

from storage.upkeep.compaction import Compaction, TableCompaction
from streaming.checkpoint.checkpoint_log import CheckpointLog
from streaming.hooks import NO_FAULTS, FaultHook, FaultPoint

log = logging.getLogger(__name__)


def compaction_due(now_ms: int | None, previous_ms: int | None, interval_ms: int) -> bool:
    """Whether a batch at `now_ms` compacts, after a batch at `previous_ms` (None: the stream's
    first batch, or a timestamp Spark no longer has)."""
    if interval_ms == 0:
        return True
    if now_ms is None or previous_ms is None:
        return False
    return now_ms // interval_ms > previous_ms // interval_ms


@dataclass(frozen=True)
class CompactionSchedule:
    compaction: Compaction
    checkpoint_log: CheckpointLog
    fault_hook: FaultHook = NO_FAULTS

    def after_batch(self, spark: SparkSession, batch_id: int) -> list[TableCompaction]:
        """Compact if batch `batch_id` is the first of a new interval."""
        now_ms = self.checkpoint_log.batch_timestamp_ms(batch_id)
        previous_ms = (
            None if batch_id == 0 else self.checkpoint_log.batch_timestamp_ms(batch_id - 1)
        )
        if not compaction_due(now_ms, previous_ms, self.compaction.policy.pass_interval_ms):
            return []
        return self._compact(spark, batch_id, now_ms)

    def now(self, spark: SparkSession, batch_id: int) -> list[TableCompaction]:
        """Settle every staged row of this stream, as of batch `batch_id`."""
        return self._compact(spark, batch_id, None)

    def _compact(
        self, spark: SparkSession, batch_id: int, now_ms: int | None
    ) -> list[TableCompaction]:
        return self.compaction.run(
            spark,
            batch_id,
            now_ms,
            before_commit=lambda: self.fault_hook.reached(
                FaultPoint.BEFORE_COMPACTION_COMMIT, batch_id
            ),
            after_table=lambda: self.fault_hook.reached(
                FaultPoint.AFTER_COMPACTION_COMMIT, batch_id
            ),
        )
