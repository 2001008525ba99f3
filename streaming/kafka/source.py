"""`format("tw_kafka")`: the Python Data Source that Spark builds, and `register`.

Wiring only: Spark's stream reader API calls into `offsets` on the driver and `reader` on the
executors.
"""

from __future__ import annotations

import functools
import logging
import pickle
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from streaming.fault_points import NO_FAULTS, FaultHook
from streaming.kafka.client import PLAINTEXT, KafkaSecurity
from streaming.kafka.offsets import OffsetPlanner, max_rows_of, partition_ranges, split_ranges
from streaming.kafka.options import SOURCE_NAME, KafkaSourceOptions
from streaming.kafka.schema import KAFKA_SCHEMA
from streaming.kafka.trigger_phase import phase_wait_ms

# Spark runs a fresh Python process to declare the source (its schema), one to plan its reads and
# one for its stream reader, one after the other, each before a start's first batch. Each unpickles
# this module with the source; what only reading and deferral need is imported where it is used,
# and the deferral travels packed (`Packed`), so the processes that only declare and plan never
# import pandas' kin, pydantic or a Kafka client.
if TYPE_CHECKING:
    import pyarrow as pa

    from streaming.kafka.deferral import Deferral
    from streaming.kafka.deferral_planning import DeferralPlanner
    from streaming.kafka.reader import KafkaInputPartition

log = logging.getLogger(__name__)

_V = TypeVar("_V")


class Packed(Generic[_V]):
    """A value pickled once and unpickled where it is first asked for: a Python process of
    Spark's that never asks never imports what the value's classes need."""

    def __init__(self, value: _V) -> None:
        self._pickled = cloudpickle.dumps(value)  # type: ignore[no-untyped-call]

    def __getstate__(self) -> dict[str, bytes]:
        return {"_pickled": self._pickled}

    def __setstate__(self, state: dict[str, bytes]) -> None:
        self._pickled = state["_pickled"]

    @functools.cached_property
    def value(self) -> _V:
        value: _V = pickle.loads(self._pickled)
        return value


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches over one topic. Built on the driver, pickled to executors.

    The camelCase method names are Spark's API (hence the `noqa: N802`).
    """

    def __init__(
        self,
        options: KafkaSourceOptions,
        fault_hook: FaultHook = NO_FAULTS,
        deferral: Deferral | Packed[Deferral | None] | None = None,
    ) -> None:
        self.options = options
        self.fault_hook = fault_hook
        self._deferral = deferral
        self.planner = OffsetPlanner(options)
        self.available_now = False

    @property
    def deferral(self) -> Deferral | None:
        if isinstance(self._deferral, Packed):
            return self._deferral.value
        return self._deferral

    @functools.cached_property
    def deferral_planner(self) -> DeferralPlanner | None:
        if self.deferral is None:
            return None
        from streaming.kafka.deferral_planning import DeferralPlanner

        return DeferralPlanner(self.deferral, self.options)

    def initialOffset(self) -> dict[str, int]:  # noqa: N802
        return self.planner.initial_offsets()

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.available_now = True
        self.planner.fix_available_now_end()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        self._wait_for_trigger_phase()
        if self.deferral_planner is None:
            return self.planner.next_end(start, max_rows_of(limit))
        return self.deferral_planner.next_end(self.planner, start, max_rows_of(limit))

    def _wait_for_trigger_phase(self) -> None:
        # An AvailableNow run has no ticks: its batches follow each other at once.
        if self.available_now or self.options.trigger_interval_ms is None:
            return
        wait_ms = phase_wait_ms(
            time.time_ns() // 1_000_000,
            self.options.trigger_interval_ms,
            self.options.trigger_phase_ms,
        )
        if wait_ms > 0:
            time.sleep(wait_ms / 1000)

    def reportLatestOffset(self) -> dict[str, int] | None:  # noqa: N802
        # The end offsets latestOffset just fetched: asking the broker again would cost a
        # round trip per batch for a number that only feeds the progress report.
        return self.planner.latest_seen

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[KafkaInputPartition]:
        if self.deferral_planner is not None:
            return self.deferral_planner.tasks(start, end)
        from streaming.kafka.reader import KafkaInputPartition

        return [
            KafkaInputPartition.of_range(self.options, partition, start_offset, end_offset)
            for partition, start_offset, end_offset in split_ranges(
                partition_ranges(start, end), self.options.min_partitions
            )
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from streaming.kafka.reader import KafkaInputPartition, read_admitted

        if not isinstance(partition, KafkaInputPartition):
            raise TypeError(f"expected a KafkaInputPartition, got {type(partition).__name__}")
        return read_admitted(partition, self.fault_hook)

    def commit(self, end: dict[str, int]) -> None:
        # The offsets live in Spark's checkpoint, which is the only truth a restart uses; the
        # consumer group gets a copy for Kafka's lag tools once the batch is committed
        # (`group_offsets`, from the progress listener), and is never read back. What
        # deferral no longer needs can go.
        if self.deferral is not None:
            from streaming.kafka.deferral import batch_key

            try:
                self.deferral.store.remove_unneeded(batch_key(end))
            except OSError as error:
                # Only space is at stake; the next batch's commit tries again.
                log.warning("could not remove deferral folders no batch needs: %s", error)

    def stop(self) -> None:
        self.planner.close()


class KafkaDataSource(DataSource):
    """`spark.readStream.format("tw_kafka")`: one Kafka topic, Spark Kafka source columns."""

    fault_hook: FaultHook = NO_FAULTS
    deferral: Packed[Deferral | None] | None = None
    security: KafkaSecurity = PLAINTEXT

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:  # noqa: N802
        if schema != KAFKA_SCHEMA:
            raise ValueError(
                f"{SOURCE_NAME} has a fixed schema ({KAFKA_SCHEMA.simpleString()}); "
                f"got {schema.simpleString()}"
            )
        return KafkaStreamReader(
            KafkaSourceOptions.from_options(self.options, self.security),
            self.fault_hook,
            self.deferral,
        )


def register(
    spark: SparkSession,
    fault_hook: FaultHook = NO_FAULTS,
    deferral: Deferral | None = None,
    security: KafkaSecurity = PLAINTEXT,
) -> None:
    """Make `format("tw_kafka")` available in `spark`, reading with `fault_hook` installed,
    connecting with `security` and, given `deferral`, admitting records by quota and fair
    share."""
    if fault_hook is NO_FAULTS and deferral is None and security == PLAINTEXT:
        spark.dataSource.register(KafkaDataSource)
        return

    # Spark builds the source from its class alone (options are strings, and would show S3
    # keys and Kafka passwords in plans), so these travel as class attributes of a local
    # subclass, which cloudpickle ships by value to every executor.
    class ConfiguredKafkaDataSource(KafkaDataSource):
        pass

    ConfiguredKafkaDataSource.fault_hook = fault_hook
    ConfiguredKafkaDataSource.deferral = Packed(deferral)
    ConfiguredKafkaDataSource.security = security
    spark.dataSource.register(ConfiguredKafkaDataSource)
