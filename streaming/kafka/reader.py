"""Reading one Kafka offset range on an executor into Arrow record batches.

Runs inside Spark's Python workers, which are reused between tasks: everything opened here is
closed before the read returns, and every wait is bounded by `pollTimeoutMs`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import to_arrow_schema

from streaming.fault_points import NO_FAULTS, FaultHook, FaultPoint
from streaming.kafka.client import (
    PLAINTEXT,
    KafkaSecurity,
    KafkaUnavailableError,
    librdkafka_consumer,
)
from streaming.kafka.deferral import TaskAdmission, admit_partition
from streaming.kafka.options import SOURCE_NAME, KafkaSourceOptions
from streaming.kafka.schema import KAFKA_SCHEMA

ARROW_BATCH_ROWS = 10_000

# Derived with Spark's own conversion: Spark rejects a RecordBatch whose schema differs from
# this one in any detail (timestamp unit, time zone, nullability, list field names).
ARROW_SCHEMA = to_arrow_schema(KAFKA_SCHEMA, timezone="UTC")


class KafkaRecordColumns:
    """A range's records as columns in KAFKA_SCHEMA, filled from librdkafka messages.

    Column lists, not a list of messages: a message is a handful of C getters, each read once,
    and Arrow builds each column in one call.
    """

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps_ms: list[int] = []
        self.timestamp_types: list[int] = []
        self.headers: list[list[tuple[str, bytes]] | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def append(self, message: Any) -> None:
        """Add one data message (a `confluent_kafka.Message` without an error)."""
        self.keys.append(message.key())
        self.values.append(message.value())
        self.offsets.append(message.offset())
        timestamp_type, timestamp_ms = message.timestamp()
        self.timestamps_ms.append(timestamp_ms)
        # librdkafka numbers them from "not available" (0); Kafka and Spark from -1.
        self.timestamp_types.append(timestamp_type - 1)
        # Spark's Kafka source gives null, not an empty array, for a record without headers.
        self.headers.append(message.headers() or None)

    def take_record_batch(self, rows: int) -> pa.RecordBatch:
        """The first `rows` records as Arrow, removed from these columns."""
        timestamps_ms = pa.array(self.timestamps_ms[:rows], pa.int64())
        columns = [
            pa.array(self.keys[:rows], pa.binary()),
            pa.array(self.values[:rows], pa.binary()),
            pa.repeat(pa.scalar(self.topic, pa.string()), rows),
            pa.repeat(pa.scalar(self.partition, pa.int32()), rows),
            pa.array(self.offsets[:rows], pa.int64()),
            # Kafka timestamps are ms since the epoch; Spark's are us.
            pc.multiply(timestamps_ms, 1000).cast(ARROW_SCHEMA.field("timestamp").type),
            pa.array(self.timestamp_types[:rows], pa.int32()),
            pa.array(self.headers[:rows], ARROW_SCHEMA.field("headers").type),
        ]
        for column in (
            self.keys,
            self.values,
            self.offsets,
            self.timestamps_ms,
            self.timestamp_types,
            self.headers,
        ):
            del column[:rows]
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """One Spark task: the offsets [start_offset, end_offset) of one Kafka partition."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    bootstrap_servers: str
    poll_timeout_ms: int
    request_timeout_ms: int | None
    admission: TaskAdmission | None = None
    """Set when the stream defers (`deferral`): the range is then admitted before Spark sees it."""
    security: KafkaSecurity = PLAINTEXT

    @classmethod
    def of_range(
        cls,
        options: KafkaSourceOptions,
        partition: int,
        start_offset: int,
        end_offset: int,
        admission: TaskAdmission | None = None,
    ) -> KafkaInputPartition:
        return cls(
            topic=options.topic,
            partition=partition,
            start_offset=start_offset,
            end_offset=end_offset,
            bootstrap_servers=options.bootstrap_servers,
            poll_timeout_ms=options.poll_timeout_ms,
            request_timeout_ms=options.request_timeout_ms,
            admission=admission,
            security=options.security,
        )


def read_admitted(
    split: KafkaInputPartition, fault_hook: FaultHook = NO_FAULTS
) -> Iterator[pa.RecordBatch]:
    """The records of `split` that its batch windows: all of them, or what admission lets
    through (with the deferred records it releases) when the stream defers."""
    if split.admission is None:
        yield from read_partition(split, fault_hook)
        return
    records = pa.Table.from_batches(list(read_partition(split, fault_hook)), ARROW_SCHEMA)
    windowed = admit_partition(records, split.partition, split.admission)
    fault_hook.reached(FaultPoint.AFTER_DEFERRAL, split.start_offset, split.end_offset - 1)
    yield from windowed.to_batches(max_chunksize=ARROW_BATCH_ROWS)


def is_about_the_unused_group(topic: str | None, error_text: str) -> bool:
    """Whether a consumer error is librdkafka's lookup of the reader's group coordinator.

    librdkafka requires a group id and looks up its coordinator, although the reader only
    assigns partitions and never joins or commits; a broker that answers that lookup badly (seen
    on the local broker with a large topic: "FindCoordinator response error") must not fail a
    read that does not need it. It is kept as the last broker error, named if the read stalls.
    """
    return topic is None and "Coordinator" in error_text


def read_partition(
    split: KafkaInputPartition, fault_hook: FaultHook = NO_FAULTS
) -> Iterator[pa.RecordBatch]:
    """Yield every record of `split` as Arrow batches of at most ARROW_BATCH_ROWS rows, or fail.

    Completion is judged by the consumer's position, not by counting records: offsets can
    have gaps (transaction markers, compaction). `poll_timeout_ms` bounds the time without any
    progress, connecting included, so a large range may take longer overall but a read against
    an unreachable broker fails. A read never ends early: returning fewer records than the
    range holds would lose them for good, because Spark commits the planned offsets.
    """
    if split.start_offset >= split.end_offset:
        return  # a task that only releases deferred records
    # Here, not at the top: the driver's planner builds partitions of this module and never
    # reads (`client` says why that matters); executors have it from the worker daemon.
    from confluent_kafka import TopicPartition

    where = (
        f"{split.topic}/{split.partition} offsets [{split.start_offset}, {split.end_offset}) "
        f"from bootstrap servers {split.bootstrap_servers}"
    )
    # librdkafka retries broker errors by itself; the newest is named when the read gives up.
    broker_errors: deque[str] = deque(maxlen=1)
    consumer = librdkafka_consumer(
        split.bootstrap_servers,
        split.request_timeout_ms,
        client_id=f"{SOURCE_NAME}-reader-{split.topic}-{split.partition}",
        budget_ms=split.poll_timeout_ms,
        security=split.security,
        error_cb=lambda error: broker_errors.append(error.str()),
    )
    try:
        consumer.assign([TopicPartition(split.topic, split.partition, split.start_offset)])
        columns = KafkaRecordColumns(split.topic, split.partition)
        position = split.start_offset
        # One deadline from the start: connecting to a broker that is down counts as no progress.
        progress_deadline = time.monotonic() + split.poll_timeout_ms / 1000
        while position < split.end_offset:
            remaining_ms = int((progress_deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                last_error = f" (last broker error: {broker_errors[-1]})" if broker_errors else ""
                raise KafkaUnavailableError(
                    f"reading {where}: no progress for {split.poll_timeout_ms} ms "
                    f"(stuck at offset {position}){last_error}; the broker is unreachable or no "
                    "longer has the range; raise pollTimeoutMs or check the broker"
                )
            messages = consumer.consume(
                num_messages=min(split.end_offset - position, ARROW_BATCH_ROWS),
                timeout=min(remaining_ms, 1_000) / 1000,
            )
            new_position = position
            for message in messages:
                error = message.error()
                offset = message.offset()
                if error is not None and is_about_the_unused_group(message.topic(), error.str()):
                    broker_errors.append(error.str())
                    continue
                if error is not None or offset is None:
                    raise RuntimeError(f"reading {where} failed: {error or 'no offset'}")
                # A fetch runs past the range's end; what lies beyond belongs to the next batch.
                if offset >= split.end_offset:
                    new_position = split.end_offset
                    break
                columns.append(message)
                new_position = offset + 1
            if new_position == position:
                # Offsets have gaps (transaction markers, compaction): librdkafka's position
                # moves past markers it skipped, which no message shows.
                (assigned,) = consumer.position([TopicPartition(split.topic, split.partition)])
                new_position = max(position, min(assigned.offset or 0, split.end_offset))
            fault_hook.reached(FaultPoint.KAFKA_READ, split.start_offset, split.end_offset - 1)
            if new_position > position:
                position = new_position
                progress_deadline = time.monotonic() + split.poll_timeout_ms / 1000
            while len(columns) >= ARROW_BATCH_ROWS:
                yield columns.take_record_batch(ARROW_BATCH_ROWS)
        if columns:
            yield columns.take_record_batch(len(columns))
    finally:
        # Spark reuses Python workers: an unclosed consumer leaks its sockets and threads into
        # the next task.
        consumer.close()
