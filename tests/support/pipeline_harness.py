"""Drive the real pipeline in tests: produce to the broker, run the query, read the Delta tables."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
from deltalake import DeltaTable
from kafka import KafkaProducer, TopicPartition

from infra.dev.load_generator import SampleRecord
from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import ALL_TABLES
from streaming.app import StreamApp
from streaming.kafka.client import KafkaSecurity, kafka_python_consumer, kafka_python_producer
from tenants.conf_reader import load_registry
from tenants.registry import TenantRegistry
from tenants.settings import AppSettings, load_settings
from tests.support.fault_hooks import cli_command
from tests.support.paths import ROOT

_topic_numbers = itertools.count()
# Few state buckets, so the tests' handful of keys share buckets as 10,000 tenants would.
STATE_BUCKETS = 3


class Broker(Protocol):
    """A broker to test against: the local one, or `secured_kafka.SecuredKafka`."""

    @property
    def bootstrap_servers(self) -> str: ...

    def create_topic(self, name: str, partitions: int) -> None: ...


@dataclass
class Pipeline:
    """One stream under test: its topic, lake and checkpoint in a temp folder."""

    kafka: Broker
    workdir: Path
    conf_dir: Path
    topic: str
    partitions: int = 1
    max_offsets_per_trigger: int | None = None
    stream_name: str = "test-stream"
    trigger_interval: str | None = None
    """For continuous queries, e.g. "500ms"; None keeps the settings' default."""
    lake_root: str | None = None
    """None: a local lake in `workdir`."""
    environ: dict[str, str] = field(default_factory=dict)
    """`TW_*` variables the settings are loaded with (e.g. S3 keys)."""

    @classmethod
    def create(cls, kafka: Broker, workdir: Path, conf_dir: Path, **options: Any) -> Pipeline:
        topic = f"events-{workdir.name}-{next(_topic_numbers)}"
        pipeline = cls(kafka, workdir, conf_dir, topic, **options)
        kafka.create_topic(topic, pipeline.partitions)
        return pipeline

    @property
    def settings(self) -> AppSettings:
        return load_settings(
            None,
            environ=self.environ,
            overrides={
                "conf_dir": str(self.conf_dir),
                "kafka.bootstrap_servers": self.kafka.bootstrap_servers,
                "kafka.topic": self.topic,
                "kafka.max_offsets_per_trigger": self.max_offsets_per_trigger,
                "lake.root": self.lake_root or str(self.workdir / "lake"),
                "stream.checkpoint_dir": str(self.workdir / "checkpoint"),
                "stream.name": self.stream_name,
                "stream.trigger_interval": self.trigger_interval,
                "stream.state_buckets": STATE_BUCKETS,
            },
        )

    @property
    def lake(self) -> DeltaLake:
        return DeltaLake.from_settings(self.settings.lake)

    def cli_flags(self, **values: str) -> list[str]:
        """The flags that point a `tenant-windows` command (`run`, `status`) at this stream;
        `values` replace some of them by name, e.g. `checkpoint_dir="/elsewhere"`."""
        settings = self.settings
        flags = {
            "bootstrap_servers": settings.kafka.bootstrap_servers,
            "topic": settings.kafka.topic,
            "lake_root": settings.lake.root,
            "checkpoint_dir": settings.stream.checkpoint_dir,
            "stream_name": settings.stream.name,
            "conf": str(self.conf_dir),
        }
        unknown = set(values) - set(flags)
        assert not unknown, f"not a flag of the stream: {sorted(unknown)}"
        flags.update(values)
        return [
            part for name, value in flags.items() for part in ("--" + name.replace("_", "-"), value)
        ]

    def cli_run(self, *extra: str, fault: Sequence[str] = ()) -> list[str]:
        """The `tenant-windows run` command line of this stream, to start it as its own process.

        `fault` (e.g. `["--crash-at", "batch_start@1"]`) runs it through `tests.support.fault_hooks`
        with that hook installed. Start it with `process_environ()`, which carries the `TW_*`
        variables.
        """
        command = cli_command(["run", *self.cli_flags()], fault)
        if self.max_offsets_per_trigger is not None:
            command += ["--max-offsets-per-trigger", str(self.max_offsets_per_trigger)]
        if self.trigger_interval is not None:
            command += ["--trigger-interval", self.trigger_interval]
        return [*command, *extra]

    def process_environ(self, **extra: str) -> dict[str, str]:
        # The checkout on the path: Python workers unpickle the fault hooks from `tests.support`.
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        buckets = {"TW_STREAM__STATE_BUCKETS": str(STATE_BUCKETS)}
        return {**os.environ, "PYTHONPATH": path, **buckets, **self.environ, **extra}

    def registry(self) -> TenantRegistry:
        return load_registry(self.conf_dir)

    def produce(
        self, values: Iterable[Mapping[str, Any] | bytes], key: bytes | None = None
    ) -> None:
        producer = self._producer()
        try:
            for value in values:
                raw = value if isinstance(value, bytes) else json.dumps(value).encode()
                producer.send(self.topic, key=key, value=raw)
            producer.flush(timeout=30)
        finally:
            producer.close(timeout=10)

    def produce_samples(self, samples: Iterable[SampleRecord]) -> None:
        producer = self._producer()
        try:
            for sample in samples:
                producer.send(self.topic, key=sample.key, value=sample.value)
            producer.flush(timeout=60)
        finally:
            producer.close(timeout=10)

    def _producer(self) -> KafkaProducer:
        # With the stream's own security: the broker may speak only TLS or SASL.
        security = KafkaSecurity.of(self.settings.kafka)
        return kafka_python_producer(self.kafka.bootstrap_servers, security, acks="all")

    def produced_coordinates(self) -> set[tuple[int, int]]:
        """Every (partition, offset) in the topic."""
        security = KafkaSecurity.of(self.settings.kafka)
        consumer = kafka_python_consumer(
            self.kafka.bootstrap_servers, None, "tests-coordinates", 30_000, security
        )
        try:
            partitions = [TopicPartition(self.topic, p) for p in range(self.partitions)]
            ends = consumer.end_offsets(partitions)
        finally:
            consumer.close()
        return {(tp.partition, offset) for tp in partitions for offset in range(ends[tp])}

    def run_available_now(self, spark: Any, timeout_s: float = 240, settle: bool = True) -> None:
        """Read what the topic holds and stop; `settle=False` leaves staged rows staged, where
        `tenant-windows run --available-now` settles every one at its end."""
        stream = StreamApp(self.settings, self.lake).start(spark, True)
        try:
            finished = stream.query.awaitTermination(timeout=timeout_s)
            assert finished, f"the query did not finish within {timeout_s}s"
            assert stream.query.exception() is None, stream.query.exception()
            if settle:
                stream.compact_now(spark)
        finally:
            stream.stop()

    def table(self, name: str) -> pd.DataFrame:
        """Read with delta-rs, independent of this project's Spark views."""
        assert name in {spec.name for spec in ALL_TABLES}
        lake = self.lake
        return DeltaTable(f"{lake.root}/{name}", storage_options=lake.storage_options).to_pandas()


def record(tenant: str, source: str, event_time_ms: int, **extra: Any) -> dict[str, Any]:
    """A valid record for the sample config's sources (web: ISO ts, billing: epoch ms)."""
    body: dict[str, Any] = {"tenant": tenant, "source": source, **extra}
    if source == "web":
        body["ts"] = pd.Timestamp(event_time_ms, unit="ms", tz="UTC").isoformat()
    else:
        body["meta"] = {"event_ms": event_time_ms}
    return body


def assert_no_query_error(stream: StreamApp) -> None:
    """Fails if the stream's query has stopped with an error (for `wait_until(alive=...)`)."""
    assert stream.query.exception() is None, stream.query.exception()
