"""Reading one Kafka offset range on an executor into Arrow record batches.

Runs inside Spark's Python workers, which are reused between tasks: everything opened here is
closed before the read returns, and every wait is bounded by `pollTimeoutMs`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streaming.hooks import NO_FAULTS, FaultHook, FaultPoint
from streaming.kafka.client import KafkaUnavailableError, consumer_config
from streaming.kafka.deferral import TaskAdmission, admit_partition
from streaming.kafka.options import SOURCE_NAME, KafkaSourceOptions

ARROW_BATCH_ROWS = 10_000

KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)

# Derived with Spark's own conversion: Spark rejects a RecordBatch whose schema differs from
# this one in any detail (timestamp unit, time zone, nullability, list field names).
ARROW_SCHEMA = to_arrow_schema(KAFKA_SCHEMA, timezone="UTC")


def records_to_record_batch(records: Sequence[Any]) -> pa.RecordBatch:
    """Arrow rows in KAFKA_SCHEMA from kafka-python `ConsumerRecord`s."""
    headers_type = ARROW_SCHEMA.field("headers").type
    columns = [
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([r.topic for r in records], pa.string()),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        # Kafka timestamps are ms since the epoch; Spark's are us.
        pa.array([r.timestamp * 1000 for r in records], ARROW_SCHEMA.field("timestamp").type),
        # -1 is Kafka's NO_TIMESTAMP_TYPE, for records written without one.
        pa.array(
            [-1 if r.timestamp_type is None else r.timestamp_type for r in records], pa.int32()
        ),
        # Spark's Kafka source gives null, not an empty array, for a record without headers.
        pa.array([list(r.headers) if r.headers else None for r in records], headers_type),
    ]
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
    where = (
        f"{split.topic}/{split.partition} offsets [{split.start_offset}, {split.end_offset}) "
        f"from bootstrap servers {split.bootstrap_servers}"
    )
    topic_partition = TopicPartition(split.topic, split.partition)
    # One deadline from the start: connecting to a broker that is down counts as no progress.
    progress_deadline = time.monotonic() + split.poll_timeout_ms / 1000
    try:
        consumer = KafkaConsumer(
            **consumer_config(
                split.bootstrap_servers,
                split.request_timeout_ms,
                client_id=f"{SOURCE_NAME}-reader-{split.topic}-{split.partition}",
                budget_ms=split.poll_timeout_ms,
            ),
            max_poll_records=ARROW_BATCH_ROWS,
        )
    except KafkaError as error:
        raise KafkaUnavailableError(
            f"reading {where}: no broker answered within pollTimeoutMs "
            f"({split.poll_timeout_ms} ms): {error!r}"
        ) from error
    try:
        consumer.assign([topic_partition])
        consumer.seek(topic_partition, split.start_offset)
        position = split.start_offset
        pending: list[Any] = []
        while position < split.end_offset:
            remaining_ms = int((progress_deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                raise KafkaUnavailableError(
                    f"reading {where}: no progress for {split.poll_timeout_ms} ms "
                    f"(stuck at offset {position}); the broker is unreachable or no longer has "
                    "the range; raise pollTimeoutMs or check the broker"
                )
            try:
                # kafka-python decodes records only as poll hands them out, and a fetch runs
                # past the range's end: asking for no more than the range holds keeps it from
                # decoding records that would be dropped (up to a fetch's worth per task).
                polled = consumer.poll(
                    timeout_ms=min(remaining_ms, 1_000),
                    max_records=min(split.end_offset - position, ARROW_BATCH_ROWS),
                )
                for record in polled.get(topic_partition, ()):
                    if split.start_offset <= record.offset < split.end_offset:
                        pending.append(record)
                new_position = consumer.position(topic_partition, timeout_ms=remaining_ms)
                fault_hook.reached(FaultPoint.KAFKA_READ, split.start_offset, split.end_offset - 1)
            except KafkaError as error:
                raise RuntimeError(f"reading {where} failed: {error!r}") from error
            if new_position is not None and new_position > position:
                position = new_position
                progress_deadline = time.monotonic() + split.poll_timeout_ms / 1000
            while len(pending) >= ARROW_BATCH_ROWS:
                yield records_to_record_batch(pending[:ARROW_BATCH_ROWS])
                pending = pending[ARROW_BATCH_ROWS:]
        if pending:
            yield records_to_record_batch(pending)
    finally:
        # Spark reuses Python workers: an unclosed consumer leaks its sockets into the next task.
        consumer.close(autocommit=False)
