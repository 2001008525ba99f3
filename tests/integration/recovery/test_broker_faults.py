"""Broker outages: stop the real broker (SIGTERM to its PID) under a reader or a running stream.

The broker is noida-db on its own port and data dir, so stopping it disturbs no other test; it
comes back on the same port with the same data, which noida-db persists on a clean stop. The
product's behaviour: a short outage is waited out (driver lookups retry, executor reads wait
for progress) within `kafka.broker_timeout`; a longer one fails the query with an error naming
the bootstrap servers, and a restart from the checkpoint resumes. Either way every produced
record lands exactly once and the tables equal those of a run without the outage.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from kafka import KafkaProducer
from pyspark.sql.streaming.datasource import ReadAllAvailable

from infra.dev.load_generator import LoadSpec
from infra.dev.local_stack import LocalKafka
from streaming.app import StreamApp
from streaming.kafka.client import KafkaUnavailableError
from streaming.kafka.options import KafkaSourceOptions, partition_offsets
from streaming.kafka.reader import KafkaInputPartition, read_partition
from streaming.kafka.source import KafkaStreamReader
from tenants.conf_reader import load_registry
from tests.support.datasets import replay_pipeline, sample_records
from tests.support.pipeline_harness import Pipeline
from tests.support.table_snapshots import (
    assert_every_record_landed_once,
    assert_same_tables,
    snapshot,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

BATCH_SIZE = 200
RECORDS = 600  # three batches: an outage after the second lands before the third
TRIGGER = "200ms"
DRAIN_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Dataset:
    topic: str
    coordinates: frozenset[tuple[int, int]]
    """Every (partition, offset) the broker acknowledged."""

    @property
    def ends(self) -> dict[str, int]:
        ends: dict[str, int] = {}
        for partition, offset in self.coordinates:
            ends[str(partition)] = max(ends.get(str(partition), 0), offset + 1)
        return dict(sorted(ends.items()))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    # Not the session's shared broker: these tests stop this one.
    with LocalKafka(tmp_path_factory.mktemp("broker")) as kafka:
        yield kafka


@pytest.fixture(autouse=True)
def _broker_running_again(broker: LocalKafka) -> Iterator[None]:
    yield
    if broker.pid is None:  # a test that failed while the broker was down
        broker.start()


def _produce(
    broker: LocalKafka, topic: str, values: list[tuple[bytes | None, bytes]]
) -> set[tuple[int, int]]:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all", linger_ms=5)
    try:
        futures = [producer.send(topic, key=key, value=value) for key, value in values]
        producer.flush(timeout=30)
        acked = (future.get(timeout=10) for future in futures)
        return {(metadata.partition, metadata.offset) for metadata in acked}
    finally:
        producer.close(timeout=10)


@pytest.fixture(scope="module")
def dataset(
    broker: LocalKafka, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Dataset:
    spec = LoadSpec(count=RECORDS, late_share=0.1, malformed_share=0.05, jitter=30_000, seed=5)
    samples = sample_records(load_registry(conf_dir), spec)
    topic = Pipeline.create(broker, tmp_path_factory.mktemp("topic"), conf_dir, partitions=2).topic
    coordinates = _produce(broker, topic, [(s.key, s.value) for s in samples])
    assert len(coordinates) == RECORDS
    return Dataset(topic, frozenset(coordinates))


def _continuous_stream(
    broker: LocalKafka, conf_dir: Path, workdir: Path, topic: str, timeout: str
) -> Pipeline:
    """The continuous stream over `topic`, with `timeout` as its `kafka.broker_timeout`."""
    return replay_pipeline(
        broker,
        conf_dir,
        workdir,
        topic,
        BATCH_SIZE,
        trigger_interval=TRIGGER,
        environ={"TW_KAFKA__BROKER_TIMEOUT": timeout},
    )


def _end_offset(progress: dict[str, Any] | None) -> dict[str, int] | None:
    if not progress or not progress["sources"]:
        return None
    end = progress["sources"][0]["endOffset"]
    parsed = json.loads(end) if isinstance(end, str) else end
    if not parsed:
        return None
    return {str(k): v for k, v in sorted(partition_offsets(parsed).items())}


def _run_until_drained(
    spark: Any,
    pipeline: Pipeline,
    ends: dict[str, int],
    after_batch: Callable[[Any], None] | None = None,
) -> Any:
    """Run the continuous stream until its last batch ends at `ends`; `after_batch` once, after batch 1."""
    stream = StreamApp(pipeline.settings, pipeline.lake).start(spark)
    query = stream.query
    try:
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        pending = after_batch
        while _end_offset(query.lastProgress) != ends:
            assert query.isActive, f"the query stopped: {query.exception()}"
            assert time.monotonic() < deadline, f"not drained within {DRAIN_TIMEOUT_S} s"
            if pending is not None and (query.lastProgress or {}).get("batchId", -1) >= 1:
                pending(query)
                pending = None
            time.sleep(0.1)
        assert pending is None, "the stream drained before the fault could be injected"
        assert query.exception() is None
        return query
    finally:
        stream.stop()


@pytest.fixture(scope="module")
def clean_tables(
    broker: LocalKafka,
    spark: Any,
    conf_dir: Path,
    dataset: Dataset,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, pd.DataFrame]:
    pipeline = _continuous_stream(
        broker, conf_dir, tmp_path_factory.mktemp("clean"), dataset.topic, "30s"
    )
    _run_until_drained(spark, pipeline, dataset.ends)
    assert_every_record_landed_once(pipeline)
    return snapshot(pipeline)


def _started(progress: dict[str, Any]) -> float:
    return datetime.fromisoformat(progress["timestamp"]).timestamp()


def _await_failure(query: Any, timeout_s: float) -> None:
    wait_until(lambda: not query.isActive, timeout_s, "the query to stop", interval_s=0.1)
    assert query.exception() is not None, "the query stopped without an error"


def _later(seconds: float, action: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()), daemon=True)
    thread.start()
    return thread


# -- the reader alone ----------------------------------------------------------------------


def test_persisted_topic_survives_a_broker_restart(broker: LocalKafka, dataset: Dataset) -> None:
    port = broker.port
    broker.restart()
    assert broker.port == port
    reader = KafkaStreamReader(
        KafkaSourceOptions.from_options(
            {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": dataset.topic}
        )
    )
    try:
        assert reader.latestOffset(dataset.ends, ReadAllAvailable()) == dataset.ends
    finally:
        reader.stop()


def test_driver_lookups_wait_out_a_short_outage_and_fail_clearly_on_a_long_one(
    broker: LocalKafka, dataset: Dataset
) -> None:
    def reader(timeout_ms: int) -> KafkaStreamReader:
        return KafkaStreamReader(
            KafkaSourceOptions.from_options(
                {
                    "kafka.bootstrap.servers": broker.bootstrap_servers,
                    "subscribe": dataset.topic,
                    "fetchOffset.timeoutMs": str(timeout_ms),
                }
            )
        )

    patient, impatient = reader(30_000), reader(3_000)
    try:
        start = {key: 0 for key in dataset.ends}
        assert patient.latestOffset(start, ReadAllAvailable()) == dataset.ends  # connected
        broker.stop()
        restarted = _later(2.0, broker.start)
        started = time.monotonic()
        assert patient.latestOffset(start, ReadAllAvailable()) == dataset.ends
        assert time.monotonic() - started >= 1.5  # it did wait for the broker
        restarted.join()

        broker.stop()
        started = time.monotonic()
        with pytest.raises(KafkaUnavailableError) as failed:
            impatient.latestOffset(start, ReadAllAvailable())
        assert time.monotonic() - started < 3 + 5
        message = str(failed.value)
        assert broker.bootstrap_servers in message
        assert f"fetching end offsets of topic '{dataset.topic}'" in message
        assert "fetchOffset.timeoutMs" in message
    finally:
        patient.stop()
        impatient.stop()


def _topic_of_20_records(broker: LocalKafka, tmp_path: Path) -> str:
    """A one-partition topic holding values b"0" .. b"19" at offsets 0 .. 19."""
    topic = f"read-{tmp_path.name}"
    broker.create_topic(topic, 1)
    _produce(broker, topic, [(None, b"%d" % i) for i in range(20)])
    return topic


def test_an_executor_read_waits_for_a_restarted_broker_and_returns_the_whole_range(
    broker: LocalKafka, tmp_path: Path
) -> None:
    topic = _topic_of_20_records(broker, tmp_path)
    # The planned range ends past what the broker has, so the read is mid-range, connected
    # and waiting, when the broker goes away; the rest arrives only after the restart.
    split = KafkaInputPartition(topic, 0, 0, 30, broker.bootstrap_servers, 15_000, None)

    def outage() -> None:
        broker.stop()
        time.sleep(2.0)
        broker.start()
        _produce(broker, topic, [(None, b"%d" % i) for i in range(20, 30)])

    thread = _later(1.0, outage)
    rows = [row for batch in read_partition(split) for row in batch.to_pylist()]
    thread.join()
    assert [row["offset"] for row in rows] == list(range(30))
    assert [row["value"] for row in rows] == [b"%d" % i for i in range(30)]


def test_an_executor_read_fails_rather_than_return_part_of_its_range(
    broker: LocalKafka, tmp_path: Path
) -> None:
    topic = _topic_of_20_records(broker, tmp_path)
    split = KafkaInputPartition(topic, 0, 5, 30, broker.bootstrap_servers, 3_000, None)
    thread = _later(1.0, broker.stop)
    started = time.monotonic()
    returned: list[int] = []
    with pytest.raises(KafkaUnavailableError) as failed:
        for batch in read_partition(split):
            returned += batch.column("offset").to_pylist()
    thread.join()
    # Offsets 5..19 were read, but the read raised instead of ending with them.
    assert returned == []
    assert time.monotonic() - started < 1 + 3 + 5
    assert re.search(
        rf"{topic}/0 offsets \[5, 30\) from bootstrap servers {broker.bootstrap_servers}",
        str(failed.value),
    )
    assert "stuck at offset 20" in str(failed.value)

    # A read that starts while the broker is down fails within the same budget.
    started = time.monotonic()
    with pytest.raises(
        KafkaUnavailableError,
        match=r"no progress for 3000 ms \(stuck at offset 5\) \(last broker error: .*refused",
    ):
        list(read_partition(split))
    assert time.monotonic() - started < 3 + 5


# -- the continuous stream -----------------------------------------------------------------


def test_a_short_outage_is_waited_out_and_the_stream_resumes(
    broker: LocalKafka,
    spark: Any,
    conf_dir: Path,
    dataset: Dataset,
    clean_tables: dict[str, pd.DataFrame],
    tmp_path: Path,
) -> None:
    pipeline = _continuous_stream(broker, conf_dir, tmp_path, dataset.topic, "30s")
    outage: dict[str, float] = {}

    def stop_and_restart(query: Any) -> None:
        outage["from"] = time.time()
        broker.stop()
        time.sleep(3.0)
        broker.start()
        outage["to"] = time.time()

    query = _run_until_drained(spark, pipeline, dataset.ends, after_batch=stop_and_restart)
    # The same query run drained the topic, so a trigger that ran while the broker was down
    # waited for it instead of failing.
    during = [
        p["batchId"]
        for p in query.recentProgress
        if _started(p) < outage["to"]
        and _started(p) + p["durationMs"]["triggerExecution"] / 1000 > outage["from"]
    ]
    assert during, (
        outage,
        [(p["batchId"], p["timestamp"], p["durationMs"]) for p in query.recentProgress],
    )
    assert_every_record_landed_once(pipeline)
    assert_same_tables(snapshot(pipeline), clean_tables)


def test_a_long_outage_fails_the_query_clearly_and_a_restart_resumes(
    broker: LocalKafka,
    spark: Any,
    conf_dir: Path,
    dataset: Dataset,
    clean_tables: dict[str, pd.DataFrame],
    tmp_path: Path,
) -> None:
    timeout_s = 4
    pipeline = _continuous_stream(broker, conf_dir, tmp_path, dataset.topic, f"{timeout_s}s")
    stream = StreamApp(pipeline.settings, pipeline.lake).start(spark)
    query = stream.query
    try:
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while (query.lastProgress or {}).get("batchId", -1) < 1:
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, "no second batch"
            time.sleep(0.1)
        assert _end_offset(query.lastProgress) != dataset.ends, "drained before the outage"
        broker.stop()
        stopped = time.monotonic()
        _await_failure(query, timeout_s + 30)
        failed_after = time.monotonic() - stopped
    finally:
        stream.stop()
    assert failed_after < timeout_s + 15
    message = str(query.exception())
    assert broker.bootstrap_servers in message, message[-2000:]
    assert "KafkaUnavailableError" in message, message[-2000:]

    # Restarted while the broker is still down, it fails the same way rather than hang.
    stream = StreamApp(pipeline.settings, pipeline.lake).start(spark)
    query = stream.query
    try:
        _await_failure(query, timeout_s + 30)
    finally:
        stream.stop()
    assert broker.bootstrap_servers in str(query.exception())

    broker.start()
    _run_until_drained(spark, pipeline, dataset.ends)
    assert_every_record_landed_once(pipeline)
    assert_same_tables(snapshot(pipeline), clean_tables)
