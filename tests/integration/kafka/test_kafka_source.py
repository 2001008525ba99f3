"""The tw_kafka source against a real broker (noida-db) and real Spark streaming queries."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kafka import KafkaProducer
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from infra.dev.local_stack import LocalKafka
from streaming.kafka.options import KafkaSourceOptions
from streaming.kafka.reader import (
    ARROW_SCHEMA,
    KAFKA_SCHEMA,
    KafkaInputPartition,
    KafkaRecordColumns,
    read_partition,
)
from streaming.kafka.source import KafkaStreamReader, register
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

QUERY_TIMEOUT_S = 60
# (partition, offset) -> (key, value, headers)
Produced = dict[tuple[int, int], tuple[bytes, bytes, list[tuple[str, bytes]]]]


@pytest.fixture(scope="module", autouse=True)
def _registered(spark: SparkSession) -> None:
    register(spark)


def produce(kafka: LocalKafka, topic: str, first: int, count: int) -> Produced:
    """Send `count` keyed records (every 100th with a header) and return where each landed."""
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", linger_ms=5)
    try:
        sent = []
        for i in range(first, first + count):
            key = f"tenant-{i % 17}".encode()
            value = f'{{"n": {i}}}'.encode()
            headers = [("n", str(i).encode())] if i % 100 == 0 else []
            future = producer.send(topic, key=key, value=value, headers=headers or None)
            sent.append((future, key, value, headers))
        producer.flush(timeout=30)
        produced: Produced = {}
        for future, key, value, headers in sent:
            metadata = future.get(timeout=10)
            produced[(metadata.partition, metadata.offset)] = (key, value, headers)
        return produced
    finally:
        producer.close(timeout=10)


@dataclass
class BatchLog:
    """What a foreachBatch sink saw: rows per batch id, in order."""

    sizes: dict[int, int] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)

    def collect(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.collect()
        self.sizes[batch_id] = len(rows)
        self.rows.extend(rows)

    def produced_view(self) -> Produced:
        seen: Produced = {}
        for row in self.rows:
            headers = [(h["key"], bytes(h["value"])) for h in row["headers"] or []]
            seen[(row["partition"], row["offset"])] = (
                bytes(row["key"]),
                bytes(row["value"]),
                headers,
            )
        return seen


def kafka_stream(spark: SparkSession, kafka: LocalKafka, topic: str, **options: str) -> DataFrame:
    reader = (
        spark.readStream.format("tw_kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("pollTimeoutMs", "30000")
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def run_available_now(stream: DataFrame, checkpoint: Path) -> BatchLog:
    log = BatchLog()
    query = (
        stream.writeStream.foreachBatch(log.collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        finished = query.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        if query.isActive:
            query.stop()
    assert query.exception() is None, query.exception()
    assert finished, f"query did not finish within {QUERY_TIMEOUT_S} s"
    return log


def assert_exactly_once(log: BatchLog, expected: Produced) -> None:
    counts = Counter((row["partition"], row["offset"]) for row in log.rows)
    duplicates = {where: n for where, n in counts.items() if n > 1}
    assert not duplicates, f"read more than once: {sorted(duplicates)[:10]}"
    seen = log.produced_view()
    missing = sorted(set(expected) - set(seen))
    extra = sorted(set(seen) - set(expected))
    assert not missing, f"{len(missing)} records never read, e.g. {missing[:10]}"
    assert not extra, f"{len(extra)} unexpected records, e.g. {extra[:10]}"
    assert seen == expected


# -- without Spark -------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeMessage:
    """What the reader reads of a `confluent_kafka.Message`."""

    offset_: int
    timestamp_: tuple[int, int]
    key_: bytes | None
    value_: bytes | None
    headers_: list[tuple[str, bytes]] | None

    def offset(self) -> int:
        return self.offset_

    def timestamp(self) -> tuple[int, int]:
        return self.timestamp_

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self.headers_


def test_records_become_arrow_rows_in_spark_kafka_layout() -> None:
    columns = KafkaRecordColumns("t", 2)
    # librdkafka's timestamp types: 1 create time, 2 log append time, 0 not available.
    columns.append(FakeMessage(7, (1, 1_700_000_000_123), b"k", b"v", [("h", b"x")]))
    columns.append(FakeMessage(9, (0, -1), None, None, None))
    columns.append(FakeMessage(10, (2, 1_700_000_000_789), b"", b"w", []))
    first = columns.take_record_batch(2)
    assert first.schema.equals(ARROW_SCHEMA)
    rows = first.to_pylist()
    assert rows[0]["timestamp"] == datetime(2023, 11, 14, 22, 13, 20, 123_000, tzinfo=UTC)
    assert rows[0]["headers"] == [{"key": "h", "value": b"x"}]
    assert (rows[1]["key"], rows[1]["value"], rows[1]["headers"]) == (None, None, None)
    # Kafka's and Spark's numbering: -1 none, 0 create time, 1 log append time.
    assert [r["timestampType"] for r in rows] == [0, -1]
    assert [(r["topic"], r["partition"], r["offset"]) for r in rows] == [("t", 2, 7), ("t", 2, 9)]
    assert len(columns) == 1
    (rest,) = columns.take_record_batch(1).to_pylist()
    assert (rest["offset"], rest["timestampType"], rest["headers"]) == (10, 1, None)
    assert len(columns) == 0


def test_reader_plans_offsets_against_the_broker(kafka: LocalKafka) -> None:
    topic = "tw-plan"
    options = {"kafka.bootstrap.servers": kafka.bootstrap_servers, "subscribe": topic}
    reader = KafkaStreamReader(
        KafkaSourceOptions.from_options({**options, "startingOffsets": "earliest"})
    )
    try:
        # A topic that does not exist yet has no partitions, and is picked up once it does.
        assert reader.initialOffset() == {}
        assert reader.latestOffset({}, ReadAllAvailable()) == {}
        kafka.create_topic(topic, 2)
        produced = produce(kafka, topic, 0, 40)
        ends = Counter(partition for partition, _ in produced)
        registered = reader.latestOffset({}, ReadAllAvailable())
        assert registered == {"0": 0, "1": 0}
        assert reader.partitions({}, registered) == []
        end = reader.latestOffset(registered, ReadAllAvailable())
        assert end == {"0": ends[0], "1": ends[1]}
        assert reader.reportLatestOffset() == end
        limited = reader.latestOffset(registered, ReadMaxRows(10))
        assert sum(limited.values()) == 10
        splits = reader.partitions(registered, limited)
        assert [(s.partition, s.start_offset, s.end_offset) for s in splits] == [
            (int(p), 0, limited[p]) for p in sorted(limited) if limited[p] > 0
        ]
        # JSON startingOffsets resolved against the real log, -2 = earliest, -1 = latest.
        json_reader = KafkaStreamReader(
            KafkaSourceOptions.from_options(
                {**options, "startingOffsets": f'{{"{topic}": {{"0": -1, "1": -2}}}}'}
            )
        )
        try:
            assert json_reader.initialOffset() == {"0": ends[0], "1": 0}
        finally:
            json_reader.stop()
    finally:
        reader.stop()


def test_a_batch_on_its_tick_includes_a_record_sent_within_the_trigger_phase(
    kafka: LocalKafka,
) -> None:
    """The record that closes a window is sent just after a tick; the tick's batch has it."""
    topic = "tw-phase"
    kafka.create_topic(topic, 1)
    interval_ms, phase_ms = 2_000, 1_000
    reader = KafkaStreamReader(
        KafkaSourceOptions.from_options(
            {
                "kafka.bootstrap.servers": kafka.bootstrap_servers,
                "subscribe": topic,
                "startingOffsets": "earliest",
                "triggerIntervalMs": str(interval_ms),
                "triggerPhaseMs": str(phase_ms),
            }
        )
    )
    try:
        start = reader.initialOffset()
        # Start as Spark does, just after a tick, with the record 200 ms behind.
        time.sleep((interval_ms - time.time() * 1000 % interval_ms) / 1000)
        tick_ms = time.time() * 1000 // interval_ms * interval_ms
        sender = threading.Timer(0.2, produce, (kafka, topic, 0, 1))
        sender.start()
        try:
            end = reader.latestOffset(start, ReadAllAvailable())
        finally:
            sender.join(timeout=30)
        assert end == {"0": 1}, "the record sent within the phase missed the tick's batch"
        assert time.time() * 1000 >= tick_ms + phase_ms

        # AvailableNow has no ticks: it takes its end offsets at once.
        reader.prepareForTriggerAvailableNow()
        time.sleep((interval_ms - time.time() * 1000 % interval_ms) / 1000)
        asked_ms = time.time() * 1000
        assert reader.latestOffset(end, ReadAllAvailable()) == end
        assert time.time() * 1000 - asked_ms < phase_ms / 2
    finally:
        reader.stop()


def test_read_partition_reads_a_range_and_times_out_clearly(kafka: LocalKafka) -> None:
    topic = "tw-read"
    kafka.create_topic(topic, 1)
    produced = produce(kafka, topic, 0, 25)
    split = KafkaInputPartition(topic, 0, 5, 20, kafka.bootstrap_servers, 5_000, None)
    rows = [row for batch in read_partition(split) for row in batch.to_pylist()]
    assert [row["offset"] for row in rows] == list(range(5, 20))
    assert [row["value"] for row in rows] == [produced[(0, o)][1] for o in range(5, 20)]

    beyond_the_log = KafkaInputPartition(topic, 0, 20, 40, kafka.bootstrap_servers, 1_500, None)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"tw-read/0 offsets \[20, 40\).*stuck at offset 25"):
        list(read_partition(beyond_the_log))
    assert time.monotonic() - started < 10


# -- Spark streaming queries -----------------------------------------------------------------


def test_available_now_reads_every_record_once_in_bounded_batches(
    spark: SparkSession, kafka: LocalKafka, tmp_path: Path
) -> None:
    topic = "tw-once"
    kafka.create_topic(topic, 3)
    produced = produce(kafka, topic, 0, 3000)
    assert {partition for partition, _ in produced} == {0, 1, 2}
    started = time.time()

    stream = kafka_stream(
        spark, kafka, topic, startingOffsets="earliest", maxOffsetsPerTrigger="500"
    )
    assert stream.schema == KAFKA_SCHEMA
    log = run_available_now(stream, tmp_path / "checkpoint")

    assert_exactly_once(log, produced)
    # The budget is split exactly, so each batch but the last is full.
    assert list(log.sizes.values()) == [500] * 6
    assert {row["topic"] for row in log.rows} == {topic}
    assert {row["timestampType"] for row in log.rows} == {0}
    for row in log.rows:
        # collect() gives naive local datetimes; .timestamp() reads them back as local too.
        produced_at = row["timestamp"].timestamp()
        assert started - 300 < produced_at < started + 60


def test_restart_from_checkpoint_reads_only_new_records(
    spark: SparkSession, kafka: LocalKafka, tmp_path: Path
) -> None:
    topic = "tw-restart"
    kafka.create_topic(topic, 3)
    checkpoint = tmp_path / "checkpoint"
    options = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": "500"}
    first = produce(kafka, topic, 0, 800)
    first_log = run_available_now(kafka_stream(spark, kafka, topic, **options), checkpoint)
    assert_exactly_once(first_log, first)

    second = produce(kafka, topic, 800, 700)
    second_log = run_available_now(kafka_stream(spark, kafka, topic, **options), checkpoint)
    assert_exactly_once(second_log, second)
    assert list(first_log.sizes.values()) == [500, 300]
    assert list(second_log.sizes.values()) == [500, 200]
    # Batch ids carry on from the checkpoint instead of starting over.
    assert min(second_log.sizes) > max(first_log.sizes)


def test_latest_reads_only_records_produced_after_the_start(
    spark: SparkSession, kafka: LocalKafka, tmp_path: Path
) -> None:
    topic = "tw-latest"
    kafka.create_topic(topic, 3)
    produce(kafka, topic, 0, 300)
    log = BatchLog()
    query = (
        kafka_stream(spark, kafka, topic, startingOffsets="latest")
        .writeStream.foreachBatch(log.collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        # The first trigger resolves `latest` and reports progress even without data.
        wait_until(
            lambda: query.lastProgress is not None, 30.0, "the first trigger", interval_s=0.2
        )
        after = produce(kafka, topic, 300, 200)
        wait_until(
            lambda: len(log.rows) >= len(after),
            QUERY_TIMEOUT_S,
            "the new records",
            interval_s=0.2,
        )
        # Give a wrongly planned extra batch the chance to show up before judging.
        time.sleep(1.5)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    assert_exactly_once(log, after)
