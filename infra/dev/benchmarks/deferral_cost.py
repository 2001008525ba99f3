"""What a record costs to read, to defer, to release, and to window: CPU microseconds per record.

    .venv/bin/python -m infra.dev.benchmarks.deferral_cost --records 100000

It starts its own broker on 127.0.0.1 and preloads `--records` sample records (the project's
tenants and sources, 4 partitions). Then, in this process, partition by partition, as a reader
task does it:

- **read**: `read_partition`, Kafka to Arrow (librdkafka's decoding);
- **defer**: `admit_partition` with a quota that admits nothing: the tenant peek, the
  admission, and the Parquet file and ledger every deferred record goes to;
- **release**: `admit_partition` again with a quota that admits everything: the deferred
  records read back from their files;

and last **window**: the product itself (`StreamApp`, `--available-now`, no quota, five batches)
over the same records: CPU seconds of Spark's JVM, its Python workers and the driver per record
of the batches after the first (start-up), which covers reading, routing, the shuffle, the
state and the Delta commits.

CPU time is printed rather than wall time: stable when the machine is shared, and it is what a
deferred record takes from everyone else.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

from infra.dev.benchmarks.read_ceiling import tree_cpu_seconds
from infra.dev.benchmarks.sample_lake import (
    PROJECT_CONF,
    bench_settings,
    without_limits,
)
from infra.dev.load_generator import LoadSpec, generate, send
from infra.dev.local_stack import LocalKafka
from storage.lake.delta_lake import DeltaLake
from streaming.app import StreamApp
from streaming.kafka.deferral import Deferral, DeferralStore, TaskAdmission, admit_partition
from streaming.kafka.offsets import OffsetPlanner, partition_ranges
from streaming.kafka.options import KafkaSourceOptions
from streaming.kafka.reader import ARROW_SCHEMA, KafkaInputPartition, read_partition
from streaming.pipeline.spark_session import build_spark
from tenants.conf_reader import load_registry
from tenants.config_store import ConfigSnapshots
from tenants.models import Quota
from tenants.settings import AppSettings

TOPIC = "deferral-cost"
PARTITIONS = 4
NOTHING = Quota(records_per_second=1e-9, burst=1)
EVERYTHING = Quota(records_per_second=1e9, burst=10**9)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tw-deferral-cost-"))
    try:
        with LocalKafka(workdir / "kafka") as kafka:
            kafka.create_topic(TOPIC, PARTITIONS)
            registry = load_registry(PROJECT_CONF)
            spec = LoadSpec(count=args.records)
            records = generate(spec, {n: s.event_time for n, s in registry.sources.items()})
            send(records, kafka.bootstrap_servers, TOPIC, timeout_s=900)
            settings = _settings(kafka.bootstrap_servers, workdir)
            costs = _reader_costs(settings, workdir)
            costs["window"] = _window_cost(settings, args.records)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{'step':<8} {'CPU us/record':>14}")
    for step, micros in costs.items():
        print(f"{step:<8} {micros:>14.1f}")
    print(
        f"deferring and later releasing a record: {costs['defer'] + costs['release']:.1f} us "
        f"on top of its read; windowing it: {costs['window']:.1f} us, reading included"
    )
    return 0


def _settings(bootstrap_servers: str, workdir: Path) -> AppSettings:
    return without_limits(bench_settings(PROJECT_CONF, bootstrap_servers, TOPIC, workdir))


def _reader_costs(settings: AppSettings, workdir: Path) -> dict[str, float]:
    options = KafkaSourceOptions.from_options(
        {
            "kafka.bootstrap.servers": settings.kafka.bootstrap_servers,
            "subscribe": TOPIC,
            "startingOffsets": "earliest",
        }
    )
    planner = OffsetPlanner(options)
    try:
        start = planner.initial_offsets()
        end = planner.next_end(start, None)
    finally:
        planner.close()
    store = DeferralStore(str(workdir / "deferral"), (), "cost")
    snapshots = ConfigSnapshots(str(workdir / "no-snapshots"))
    cpu = {"read": 0.0, "defer": 0.0, "release": 0.0}
    count = deferred = 0
    for partition, first, stop in partition_ranges(start, end):
        split = KafkaInputPartition(
            TOPIC, partition, first, stop, settings.kafka.bootstrap_servers, 60_000, None
        )
        started = time.process_time()
        records = pa.Table.from_batches(list(read_partition(split)), ARROW_SCHEMA)
        cpu["read"] += time.process_time() - started
        count += records.num_rows
        for step, quota, start_batch, end_batch, now_ms, new in [
            ("defer", NOTHING, None, "deferred", 1_000, records),
            ("release", EVERYTHING, "deferred", "released", 2_000, records.slice(0, 0)),
        ]:
            deferral = Deferral(store, snapshots, quota, None, 10**9)
            task = TaskAdmission(deferral, start_batch, end_batch, now_ms, None)
            started = time.process_time()
            admitted = admit_partition(new, partition, task)
            cpu[step] += time.process_time() - started
            if step == "defer":  # a full bucket admits one record a tenant
                deferred = records.num_rows - admitted.num_rows
            elif admitted.num_rows != deferred:
                raise AssertionError(f"released {admitted.num_rows} of {deferred} deferred")
    return {step: seconds * 1e6 / count for step, seconds in cpu.items()}


def _window_cost(settings: AppSettings, records: int) -> float:
    """CPU per record of the product's batches after the first (whose time is start-up): the
    JVM, its Python workers and this driver process."""
    batch_size = max(records // 5, 1)
    settings = settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"max_offsets_per_trigger": batch_size})}
    )
    spark = build_spark("tenant-windows-deferral-cost")
    jvm_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())  # type: ignore[union-attr]
    cpu = _CpuAtBatches(jvm_pid)
    spark.streams.addListener(cpu)
    try:
        stream = StreamApp(settings, DeltaLake.from_settings(settings.lake)).start(spark, True)
        try:
            if not stream.query.awaitTermination(timeout=900):
                raise TimeoutError("the stream did not finish in 900 s")
            progress = [p for p in stream.query.recentProgress if p["numInputRows"] > 0]
        finally:
            stream.stop()
    finally:
        spark.stop()
    first, last = progress[0]["batchId"], progress[-1]["batchId"]
    rows = sum(int(p["numInputRows"]) for p in progress[1:])
    return (cpu.cpu_s[last] - cpu.cpu_s[first]) * 1e6 / rows


class _CpuAtBatches(StreamingQueryListener):
    def __init__(self, jvm_pid: int) -> None:
        self.jvm_pid = jvm_pid
        self.cpu_s: dict[int, float] = {}

    def onQueryStarted(self, event: QueryStartedEvent) -> None:  # noqa: N802
        return None

    def onQueryProgress(self, event: QueryProgressEvent) -> None:  # noqa: N802
        used = tree_cpu_seconds(self.jvm_pid) + time.process_time()
        self.cpu_s[event.progress.batchId] = used

    def onQueryIdle(self, event: QueryIdleEvent) -> None:  # noqa: N802
        return None

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:  # noqa: N802
        return None


if __name__ == "__main__":
    raise SystemExit(main())
