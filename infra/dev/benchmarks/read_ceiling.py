"""How fast the `tw_kafka` reader alone can go: a Kafka backlog read into a `noop` sink.

    .venv/bin/python -m infra.dev.benchmarks.read_ceiling --records 200000

It starts its own broker on 127.0.0.1, preloads a backlog of JSON records (fixed seed, about
`--value-bytes` each) on a topic of `--partitions` partitions, then measures twice:

- `read_partition` alone, in this process, over every partition's whole range: the executor
  read without Spark around it (what one core can do);
- a `tw_kafka` -> `format("noop")` query with `maxOffsetsPerTrigger` and Trigger.AvailableNow,
  on local[2]: overall records/s, and steady state (the batches after the first, whose time
  includes Python worker start-up, summed from `query.recentProgress`).

With other work on the machine, wall-clock rates swing by 2x from run to run; the CPU time
each step used (the reading process; for the query, the JVM and its Python processes) does
not, and is printed as records per CPU-second next to them.

Nothing downstream of the reader runs, so this is the ceiling the full pipeline reads under.
Timings on a shared machine are noisy: compare runs made close together.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import shutil
import string
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

from infra.dev.load_generator import SampleRecord, send
from infra.dev.local_process import cpu_seconds, descendants
from infra.dev.local_stack import LocalKafka
from streaming.kafka.offsets import OffsetPlanner, partition_ranges
from streaming.kafka.options import KafkaSourceOptions
from streaming.kafka.reader import KafkaInputPartition, read_partition
from streaming.kafka.source import register
from streaming.pipeline.spark_session import build_spark

TOPIC = "read-ceiling"
QUERY_TIMEOUT_S = 900
PRODUCE_TIMEOUT_S = 900.0


def backlog(count: int, value_bytes: int, seed: int) -> Iterator[SampleRecord]:
    """`count` keyed JSON records of about `value_bytes` each, the same for a seed."""
    rng = random.Random(seed)
    tenants = [f"tenant-{n:02d}" for n in range(20)]
    for index in range(count):
        tenant = rng.choice(tenants)
        record: dict[str, object] = {
            "tenant": tenant,
            "source": rng.choice(("web", "billing")),
            "event_id": f"{tenant}-{index}",
            "ts": 1_767_225_600_000 + index * 10 + rng.randint(0, 5_000),
            "amount": rng.randint(1, 500),
            "note": "",
        }
        padding = max(0, value_bytes - len(json.dumps(record, separators=(",", ":"))))
        record["note"] = "".join(rng.choices(string.ascii_letters, k=padding))
        value = json.dumps(record, separators=(",", ":")).encode()
        yield SampleRecord(tenant.encode(), value, tenant, str(record["source"]), None, "good")


def measure_read_partition(options: KafkaSourceOptions) -> None:
    """Every partition's range through `read_partition` in this process, one after another."""
    planner = OffsetPlanner(options)
    try:
        start = planner.initial_offsets()
        end = planner.next_end(start, None)
    finally:
        planner.close()
    rows = 0
    started = time.monotonic()
    cpu_started = time.process_time()
    for partition, start_offset, end_offset in partition_ranges(start, end):
        split = KafkaInputPartition.of_range(options, partition, start_offset, end_offset)
        rows += sum(batch.num_rows for batch in read_partition(split))
    seconds = time.monotonic() - started
    cpu_s = time.process_time() - cpu_started
    print(
        f"read_partition alone (one process, partitions in turn): {rows} records in "
        f"{seconds:.2f}s = {rows / seconds:,.0f} rec/s; {cpu_s:.2f} CPU-s = "
        f"{rows / cpu_s:,.0f} rec per CPU-s"
    )


def tree_cpu_seconds(root_pid: int) -> float:
    """CPU time of `root_pid` and every process under it (for the JVM: the Python workers and
    the Python planner process too)."""
    total = 0.0
    for pid in [root_pid, *descendants(root_pid)]:
        with contextlib.suppress(OSError):  # a worker that exited meanwhile
            total += cpu_seconds(pid)
    return total


class CpuAtProgress(StreamingQueryListener):
    """Spark's CPU time when each batch's progress is reported: CPU per batch, noise-free."""

    def __init__(self, jvm_pid: int) -> None:
        self.jvm_pid = jvm_pid
        self.cpu_s_by_batch: dict[int, float] = {}

    def onQueryStarted(self, event: QueryStartedEvent) -> None:  # noqa: N802
        self.cpu_s_by_batch[-1] = tree_cpu_seconds(self.jvm_pid)

    def onQueryProgress(self, event: QueryProgressEvent) -> None:  # noqa: N802
        self.cpu_s_by_batch[event.progress.batchId] = tree_cpu_seconds(self.jvm_pid)

    def onQueryIdle(self, event: QueryIdleEvent) -> None:  # noqa: N802
        return None

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:  # noqa: N802
        return None


def measure_query(
    bootstrap_servers: str, max_offsets: int, min_partitions: int | None, checkpoint: Path
) -> None:
    spark = build_spark("tenant-windows-read-ceiling")
    jvm_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())  # type: ignore[union-attr]
    cpu = CpuAtProgress(jvm_pid)
    try:
        register(spark)
        spark.streams.addListener(cpu)
        stream = (
            spark.readStream.format("tw_kafka")
            .option("kafka.bootstrap.servers", bootstrap_servers)
            .option("subscribe", TOPIC)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(max_offsets))
            .option("minPartitions", str(min_partitions or ""))
            .load()
        )
        started = time.monotonic()
        query = (
            stream.writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        finished = query.awaitTermination(timeout=QUERY_TIMEOUT_S)
        wall_s = time.monotonic() - started
        if not finished:
            query.stop()
            raise TimeoutError(f"the query did not drain the topic in {QUERY_TIMEOUT_S}s")
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        # The listener hears of the last batch asynchronously.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(cpu.cpu_s_by_batch) <= len(query.recentProgress):
            time.sleep(0.1)
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        print(
            f"\n{'batch':>5} {'records':>8} {'seconds':>8} {'rec/s':>8} {'CPU-s':>6}  "
            "where the time went (ms; addBatch is the read)"
        )
        for batch in progress:
            seconds = batch["durationMs"]["triggerExecution"] / 1000
            rows = int(batch["numInputRows"])
            batch_id = batch["batchId"]
            batch_cpu_s = cpu.cpu_s_by_batch.get(batch_id, math.nan) - cpu.cpu_s_by_batch.get(
                batch_id - 1, math.nan
            )
            phases = ", ".join(
                f"{phase} {ms}"
                for phase, ms in sorted(batch["durationMs"].items(), key=lambda item: -item[1])
                if phase != "triggerExecution" and ms >= 20
            )
            print(
                f"{batch_id:>5} {rows:>8} {seconds:>8.2f} {rows / seconds:>8,.0f} "
                f"{batch_cpu_s:>6.2f}  {phases}"
            )
        total_rows = sum(int(p["numInputRows"]) for p in progress)
        print(
            f"\noverall (query start to end): {total_rows} records in {wall_s:.1f}s = "
            f"{total_rows / wall_s:,.0f} rec/s"
        )
        steady = progress[1:]
        if steady:
            steady_rows = sum(int(p["numInputRows"]) for p in steady)
            steady_s = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000
            steady_cpu_s = cpu.cpu_s_by_batch.get(
                steady[-1]["batchId"], math.nan
            ) - cpu.cpu_s_by_batch.get(progress[0]["batchId"], math.nan)
            print(
                f"steady state (batches after the first): {steady_rows} records in "
                f"{steady_s:.1f}s = {steady_rows / steady_s:,.0f} rec/s; "
                f"{steady_cpu_s:.1f} CPU-s of Spark's processes = "
                f"{steady_rows / steady_cpu_s:,.0f} rec per CPU-s"
            )
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--max-offsets", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--min-partitions",
        type=int,
        default=None,
        help="the reader's minPartitions (default: one task per Kafka partition)",
    )
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="tw-read-ceiling-"))
    try:
        with LocalKafka(workdir / "kafka") as kafka:
            kafka.create_topic(TOPIC, args.partitions)
            started = time.monotonic()
            sent = send(
                backlog(args.records, args.value_bytes, args.seed),
                kafka.bootstrap_servers,
                TOPIC,
                timeout_s=PRODUCE_TIMEOUT_S,
            )
            produce_s = time.monotonic() - started
            print(
                f"preloaded {sent} records in {produce_s:.0f}s on {args.partitions} partitions; "
                f"minPartitions {args.min_partitions}"
            )
            options = KafkaSourceOptions.from_options(
                {
                    "kafka.bootstrap.servers": kafka.bootstrap_servers,
                    "subscribe": TOPIC,
                    "startingOffsets": "earliest",
                }
            )
            measure_read_partition(options)
            measure_query(
                kafka.bootstrap_servers,
                args.max_offsets,
                args.min_partitions,
                workdir / "checkpoint",
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
