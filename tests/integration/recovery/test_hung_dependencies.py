"""Hung dependencies: a broker or an S3 store that accepts connections and then says nothing.

A dependency that is down refuses connections and fails fast (test_broker_faults.py here,
tests/integration/lake/test_seaweedfs_lake.py). One that hangs is worse: without a bound on every
request the stream waits forever. Everything here uses real sockets: a listener that accepts and
never answers (`tests.support.stalling_proxy.StallProxy` without upstream), an HTTP server that
sends headers and stalls mid-body (`HeadersThenStall`), a proxy in front of a real S3 server
switched to stall, and the real broker frozen with SIGSTOP (its kernel still accepts connections
and acknowledges bytes; nothing answers them). noida-db advertises its own port in metadata, so a
proxy in front of it would only cover the bootstrap; freezing the broker hangs every connection
a client has.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from pyspark.sql.streaming.datasource import ReadAllAvailable

from infra.dev.load_generator import LoadSpec, SampleRecord
from infra.dev.local_stack import LocalKafka
from storage.lake.delta_lake import DeltaLake
from storage.lake.lake_filesystem import filesystem_of
from storage.lake.s3_options import LakeUnavailableError, storage_options
from storage.lake.tables import EVENTS
from streaming.app import StreamApp
from streaming.kafka.client import KafkaUnavailableError
from streaming.kafka.options import KafkaSourceOptions
from streaming.kafka.reader import KafkaInputPartition, read_partition
from streaming.kafka.source import KafkaStreamReader
from tenants.conf_reader import load_registry
from tenants.settings import LakeSettings, S3Settings
from tests.support.datasets import clean_run, sample_records
from tests.support.pipeline_harness import Pipeline
from tests.support.s3_endpoint import moto_s3, s3_environ
from tests.support.stalling_proxy import HeadersThenStall, StallProxy
from tests.support.stream_process import (
    run_process,
    start_process,
    wait_for_commit_log,
    wait_or_kill,
)
from tests.support.table_snapshots import (
    assert_every_record_landed_once,
    assert_same_tables,
    snapshot,
)

pytestmark = pytest.mark.integration

BUDGET_MS = 3_000
# What a failure may take beyond its configured budget: thread wake-ups, closing the client.
SLACK_S = 2.0
# pyarrow's request timeout is a low-speed limit (< 1 byte/s for the timeout) over curl's speed
# window of about 6 s: a response that stops after its headers fails an attempt after about
# the timeout + 6 s, plus the retry's backoff (measured: 20 s for two attempts of 3 s). See
# docs/operations.md, "Hung dependencies".
PYARROW_ATTEMPT_OVERHEAD_S = 7.0
PYARROW_ATTEMPTS = 2
# The figures are noisy on a shared machine: bounds get this much extra on top.
S3_SLACK_S = 5.0
# Spark's own cost around a failed micro-batch (scheduling, failing the job, stopping the
# query) on this shared 2-core machine, generously.
SPARK_OVERHEAD_S = 30.0
BATCH_SIZE = 150
RECORDS = 450  # three batches
ACCESS_KEY = "AKIAHUNGTEST"
SECRET_KEY = "s3cr3t-hung-never-in-logs-7a3e"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    # Not the session's shared broker: these tests freeze this one.
    with LocalKafka(tmp_path_factory.mktemp("broker")) as kafka:
        yield kafka


class Frozen:
    """The broker process stopped with SIGSTOP until the block ends (then SIGCONT)."""

    def __init__(self, broker: LocalKafka) -> None:
        assert broker.pid is not None
        self.pid = broker.pid

    def __enter__(self) -> Frozen:
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def samples(conf_dir: Path) -> list[SampleRecord]:
    registry = load_registry(conf_dir)
    spec = LoadSpec(count=RECORDS, late_share=0.1, malformed_share=0.05, jitter=30_000, seed=11)
    return list(sample_records(registry, spec))


def _reader(bootstrap_servers: str, topic: str) -> KafkaStreamReader:
    return KafkaStreamReader(
        KafkaSourceOptions.from_options(
            {
                "kafka.bootstrap.servers": bootstrap_servers,
                "subscribe": topic,
                "fetchOffset.timeoutMs": str(BUDGET_MS),
            }
        )
    )


def _timed_failure(action: Any, expected: type[BaseException]) -> tuple[float, str]:
    started = time.monotonic()
    with pytest.raises(expected) as failed:
        action()
    return time.monotonic() - started, str(failed.value)


# -- Kafka -----------------------------------------------------------------------------------


def test_a_bootstrap_server_that_never_answers_fails_lookups_and_reads_within_the_budget() -> None:
    with StallProxy(None, lifetime_s=60) as silent:
        reader = _reader(silent.address, "events")
        try:
            lookup_s, lookup_error = _timed_failure(
                lambda: reader.latestOffset({"0": 0}, ReadAllAvailable()), KafkaUnavailableError
            )
        finally:
            reader.stop()
        split = KafkaInputPartition("events", 0, 0, 10, silent.address, BUDGET_MS, None)
        read_s, read_error = _timed_failure(lambda: list(read_partition(split)), Exception)
        assert silent.accepted >= 2, "the clients never connected: nothing was tested"
    print(f"silent bootstrap: lookup failed after {lookup_s:.1f}s, read after {read_s:.1f}s")
    assert lookup_s < BUDGET_MS / 1000 + SLACK_S
    assert read_s < BUDGET_MS / 1000 + SLACK_S
    assert f"fetching end offsets of topic 'events' from bootstrap servers {silent.address}" in (
        lookup_error
    )
    assert f"events/0 offsets [0, 10) from bootstrap servers {silent.address}" in read_error
    assert f"no progress for {BUDGET_MS} ms (stuck at offset 0)" in read_error


def test_a_broker_that_hangs_after_connecting_fails_lookups_and_reads_within_the_budget(
    broker: LocalKafka, tmp_path: Path
) -> None:
    topic = f"hang-{tmp_path.name}"
    broker.create_topic(topic, 1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all")
    try:
        for i in range(20):
            producer.send(topic, value=b"%d" % i)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)
    reader = _reader(broker.bootstrap_servers, topic)
    try:
        # Connected, with metadata cached: the case kafka-python's 30 s request timeout overran.
        assert reader.latestOffset({"0": 0}, ReadAllAvailable()) == {"0": 20}
        with Frozen(broker):
            lookup_s, lookup_error = _timed_failure(
                lambda: reader.latestOffset({"0": 0}, ReadAllAvailable()), KafkaUnavailableError
            )
            split = KafkaInputPartition(topic, 0, 0, 20, broker.bootstrap_servers, BUDGET_MS, None)
            read_s, read_error = _timed_failure(
                lambda: list(read_partition(split)), KafkaUnavailableError
            )
    finally:
        reader.stop()
    print(f"frozen broker: lookup failed after {lookup_s:.1f}s, read after {read_s:.1f}s")
    assert lookup_s < BUDGET_MS / 1000 + SLACK_S, lookup_error
    assert read_s < BUDGET_MS / 1000 + SLACK_S, read_error
    assert f"from bootstrap servers {broker.bootstrap_servers}" in lookup_error
    assert f"{topic}/0 offsets [0, 20) from bootstrap servers {broker.bootstrap_servers}" in (
        read_error
    )


def test_a_broker_hanging_mid_stream_fails_the_query_within_the_bound_and_a_restart_loses_nothing(
    broker: LocalKafka, spark: Any, conf_dir: Path, samples: list[SampleRecord], tmp_path: Path
) -> None:
    timeout_s = 4
    environ = {"TW_KAFKA__BROKER_TIMEOUT": f"{timeout_s}s"}
    hung = Pipeline.create(
        broker,
        tmp_path / "hung",
        conf_dir,
        partitions=2,
        max_offsets_per_trigger=BATCH_SIZE,
        trigger_interval="300ms",
        environ=environ,
    )
    # Every record up front, so batches have the same offset ranges, hence batch ids, as the
    # clean run's, however the hang cuts the run.
    hung.produce_samples(samples)

    stream = StreamApp(hung.settings, hung.lake).start(spark)
    query = stream.query
    try:
        deadline = time.monotonic() + 120
        while (query.lastProgress or {}).get("batchId", -1) < 0:
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, "no first batch within 120 s"
            time.sleep(0.05)
        with Frozen(broker):
            frozen = time.monotonic()
            bound_s = timeout_s + SPARK_OVERHEAD_S
            while query.isActive and time.monotonic() - frozen < bound_s + 30:
                time.sleep(0.1)
            failed_after_s = time.monotonic() - frozen
            assert not query.isActive, f"the query still runs {failed_after_s:.0f}s after the hang"
        completed = [p["batchId"] for p in query.recentProgress if p["numInputRows"] > 0]
    finally:
        stream.stop()
    print(f"the stream failed {failed_after_s:.1f}s after the broker hung (timeout {timeout_s}s)")
    assert failed_after_s < bound_s
    assert len(completed) < RECORDS // BATCH_SIZE, f"drained before the hang: {completed}"
    message = str(query.exception())
    assert "KafkaUnavailableError" in message and broker.bootstrap_servers in message, message[
        -2000:
    ]

    # The broker answers again: a restart loses and repeats nothing.
    hung.run_available_now(spark)
    clean = clean_run(broker, spark, conf_dir, tmp_path / "clean", hung.topic, BATCH_SIZE)
    assert_every_record_landed_once(hung)
    assert_same_tables(snapshot(hung), clean)


# -- S3 ---------------------------------------------------------------------------------------


def _lake_at(endpoint: str, timeout: str) -> LakeSettings:
    return LakeSettings(
        root="s3://lake/hung",
        s3=S3Settings.model_validate(
            {
                "endpoint_url": f"http://{endpoint}",
                "allow_http": True,
                "access_key_id": ACCESS_KEY,
                "secret_access_key": SECRET_KEY,
                "timeout": timeout,
            }
        ),
    )


@pytest.mark.parametrize("server", [StallProxy, HeadersThenStall], ids=["silent", "headers"])
def test_a_stalled_s3_endpoint_fails_every_s3_client_within_the_bound(server: Any) -> None:
    timeout_s = BUDGET_MS / 1000
    with server(None, lifetime_s=120) if server is StallProxy else server() as stalled:
        lake = _lake_at(stalled.address, f"{BUDGET_MS}ms")
        endpoint = f"http://{stalled.address}"
        driver_s, driver_error = _timed_failure(
            lambda: DeltaLake.from_settings(lake).open(EVENTS), LakeUnavailableError
        )
        filesystem, base = filesystem_of(lake.root, storage_options(lake))

        def write() -> None:
            with filesystem.open_output_stream(f"{base}/events/part.parquet") as out:
                out.write(b"x" * 100)

        executor_s, _ = _timed_failure(write, OSError)
    print(
        f"{server.__name__}: delta-rs failed after {driver_s:.1f}s, pyarrow after {executor_s:.1f}s"
    )
    assert driver_s < 2 * timeout_s + SLACK_S
    assert f"unreachable at {endpoint} while opening table events" in driver_error
    assert SECRET_KEY not in driver_error
    assert executor_s < PYARROW_ATTEMPTS * (timeout_s + PYARROW_ATTEMPT_OVERHEAD_S) + S3_SLACK_S


@pytest.fixture(scope="module")
def s3_upstream() -> Iterator[str]:
    with moto_s3(ACCESS_KEY, SECRET_KEY) as endpoint:
        yield endpoint


def test_an_s3_store_stalling_mid_stream_fails_the_process_within_the_bound_and_a_restart_loses_nothing(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    s3_upstream: str,
    samples: list[SampleRecord],
    tmp_path: Path,
) -> None:
    timeout_s = 3
    with StallProxy(s3_upstream, lifetime_s=600) as proxy:
        environ = {
            **s3_environ(f"http://{proxy.address}", ACCESS_KEY, SECRET_KEY),
            "TW_LAKE__S3__TIMEOUT": f"{timeout_s}s",
        }
        (tmp_path / "hung").mkdir()
        hung = Pipeline.create(
            kafka,
            tmp_path / "hung",
            conf_dir,
            partitions=2,
            max_offsets_per_trigger=BATCH_SIZE,
            lake_root="s3://lake/stall",
            trigger_interval="500ms",
            environ=environ,
        )
        # Every record up front: the same batches (offset ranges, ids) as the clean run.
        hung.produce_samples(samples)
        log_path = tmp_path / "stalled-run.log"
        with log_path.open("wb") as log:
            process = start_process(hung, log, available_now=False)
            try:
                wait_for_commit_log(hung, 0, process, deadline_s=180)
                # The next batches have records: their data files and commits meet the stall.
                proxy.stall()
                stalled = time.monotonic()
                # The driver's first S3 call fails after one timeout (no retry once the retry
                # budget is spent); executors' writes after at most two attempts; local mode
                # runs each task once (spark.task.maxFailures = 1).
                bound_s = (
                    PYARROW_ATTEMPTS * (timeout_s + PYARROW_ATTEMPT_OVERHEAD_S) + SPARK_OVERHEAD_S
                )
                code = wait_or_kill(process, timeout_s=bound_s + 60)
                failed_after_s = time.monotonic() - stalled
            finally:
                if process.poll() is None:
                    wait_or_kill(process, timeout_s=0)
        output = log_path.read_text(errors="replace")
        print(f"the stream failed {failed_after_s:.1f}s after S3 stalled (timeout {timeout_s}s)")
        assert code == 1, f"exit code {code}:\n{output[-3000:]}"
        assert failed_after_s < bound_s, output[-3000:]
        assert "the stream failed" in output, output[-3000:]
        assert f"the lake s3://lake/stall is unreachable at http://{proxy.address}" in output, (
            output[-3000:]
        )
        assert SECRET_KEY not in output
        last_batch = RECORDS // BATCH_SIZE - 1
        assert not (hung.workdir / "checkpoint" / "commits" / str(last_batch)).exists()

        proxy.forward()
        restart_log = tmp_path / "restart.log"
        code = run_process(hung, restart_log)
        assert code == 0, restart_log.read_text(errors="replace")[-3000:]
        clean = clean_run(kafka, spark, conf_dir, tmp_path / "clean", hung.topic, BATCH_SIZE)
        assert_every_record_landed_once(hung)
        assert_same_tables(snapshot(hung), clean)
