"""Planning a batch when the stream defers: read ahead, keep deferred records moving.

On the driver, between Spark and `OffsetPlanner`:
- a batch reads each partition to its end (up to `maxOffsetsPerTrigger`), further than it may
  window: that is what lets quiet tenants' records overtake a burst parked in deferral;
- a partition whose deferred records reach `max_deferred_records` reads nothing new until they
  drain, so deferral never copies a whole topic;
- a batch is planned while records wait in deferral even when Kafka has nothing new: its end
  offset carries the planning time (`_at_ms`), which is new in every batch, so Spark runs it;
- `window_budget` is shared max-min fairly between the partitions, by what waits in each.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from streaming.kafka.admission import Ledger, fair_shares
from streaming.kafka.deferral import Deferral, TaskAdmission, batch_key
from streaming.kafka.offsets import OffsetPlanner, partition_ranges
from streaming.kafka.options import AT_MS_KEY, KafkaSourceOptions, kafka_offsets
from streaming.kafka.reader import KafkaInputPartition


class DeferralPlanner:
    """The driver's side of deferral for one query; remembers the last batch's ledgers, which
    both planning calls of a batch read."""

    def __init__(self, deferral: Deferral, options: KafkaSourceOptions) -> None:
        self.deferral = deferral
        self.options = options
        self._ledgers: tuple[str | None, dict[int, Ledger]] | None = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_ledgers": None}

    def ledgers(self, offset: Mapping[str, int]) -> dict[int, Ledger]:
        """The ledgers of the batch that ended at `offset`, by partition."""
        key = batch_key(offset)
        if self._ledgers is None or self._ledgers[0] != key:
            self._ledgers = (key, self.deferral.store.ledgers(key))
        return self._ledgers[1]

    def next_end(
        self, planner: OffsetPlanner, start: Mapping[str, int], max_rows: int | None
    ) -> dict[str, int]:
        """The end offset of the next batch; `start` itself when there is nothing to do."""
        kafka_start = kafka_offsets(start)
        ledgers = self.ledgers(start)
        kafka_end = planner.next_end(kafka_start, max_rows)
        for partition, ledger in ledgers.items():
            key = str(partition)
            if ledger.backlog >= self.deferral.max_deferred_records and key in kafka_start:
                kafka_end[key] = kafka_start[key]
        waiting = any(ledger.backlog for ledger in ledgers.values())
        if kafka_end == kafka_start and not waiting:
            return dict(start)
        at_ms = max(int(time.time() * 1000), start.get(AT_MS_KEY, 0) + 1)
        return {**kafka_end, AT_MS_KEY: at_ms}

    def tasks(self, start: Mapping[str, int], end: Mapping[str, int]) -> list[KafkaInputPartition]:
        """One task per partition that has records to read or deferred records, never split:
        a partition's ledger passes from one batch to the next through exactly one task."""
        end_batch = batch_key(end)
        kafka_start, kafka_end = kafka_offsets(start), kafka_offsets(end)
        ranges = {
            partition: (first, stop)
            for partition, first, stop in partition_ranges(kafka_start, kafka_end)
        }
        ledgers = self.ledgers(start) if end_batch is not None else {}
        for partition in ledgers:
            at = kafka_end.get(str(partition), kafka_start.get(str(partition), 0))
            ranges.setdefault(partition, (at, at))
        waiting = {
            str(partition): stop - first + ledgers.get(partition, Ledger()).backlog
            for partition, (first, stop) in ranges.items()
        }
        # Max-min fair between partitions too: in proportion to what waits, a partition of quiet
        # tenants beside a burst's partition would get almost nothing.
        budgets = fair_shares(waiting, self.deferral.window_budget)
        return [
            KafkaInputPartition.of_range(
                self.options,
                partition,
                first,
                stop,
                None
                if end_batch is None
                else TaskAdmission(
                    deferral=self.deferral,
                    start_batch=batch_key(start),
                    end_batch=end_batch,
                    now_ms=end[AT_MS_KEY],
                    budget=None if self.deferral.window_budget is None else budgets[str(partition)],
                ),
            )
            for partition, (first, stop) in sorted(ranges.items())
        ]
