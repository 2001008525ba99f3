"""Work off a large Kafka backlog in bounded micro-batches and report sizes, rates and memory.

    .venv/bin/python -m infra.dev.benchmarks.backlog --records 1000000 --max-offsets 50000

It starts its own broker on 127.0.0.1, produces the backlog, runs the stream with
`--available-now`, and prints one row per micro-batch: input rows (never above
`maxOffsetsPerTrigger`), duration, rate, and the resident memory of the driver's Python
process and of the JVM. Flat RSS across batches is what "bounded" means; the first batch is the
baseline, measured the same way in the same run.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path

from infra.dev.load_generator import LoadSpec, generate, send
from infra.dev.local_process import rss_mib
from infra.dev.local_stack import LocalKafka
from storage.lake.delta_lake import DeltaLake
from streaming.app import StreamApp
from streaming.pipeline.spark_session import build_spark
from tenants.conf_reader import load_registry
from tenants.settings import load_settings

TOPIC = "backlog"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--max-offsets", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--tenants", type=int, default=20)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="tw-backlog-"))
    try:
        with LocalKafka(workdir / "kafka") as kafka:
            kafka.create_topic(TOPIC, args.partitions)
            settings = load_settings(
                Path("conf/app.yaml"),
                environ={},
                overrides={
                    "kafka.bootstrap_servers": kafka.bootstrap_servers,
                    "kafka.topic": TOPIC,
                    "kafka.max_offsets_per_trigger": args.max_offsets,
                    "lake.root": str(workdir / "lake"),
                    "stream.checkpoint_dir": str(workdir / "checkpoint"),
                    "conf_dir": str(workdir / "conf"),
                },
            )
            tenants = tuple(f"tenant-{n:02d}" for n in range(args.tenants))
            _write_conf(workdir / "conf", tenants)
            registry = load_registry(workdir / "conf")
            started = time.monotonic()
            spec = LoadSpec(tenants=tenants, count=args.records, malformed_share=0.01)
            sent = send(
                generate(spec, {n: s.event_time for n, s in registry.sources.items()}),
                kafka.bootstrap_servers,
                TOPIC,
                timeout_s=1_800,
            )
            produce_s = time.monotonic() - started
            print(f"produced {sent} records in {produce_s:.0f}s ({sent / produce_s:,.0f} rec/s)")
            _run(settings, args.max_offsets)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run(settings: object, max_offsets: int) -> None:
    from tenants.settings import AppSettings

    assert isinstance(settings, AppSettings)
    spark = build_spark("tenant-windows-backlog", shuffle_partitions=4)
    jvm_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())  # type: ignore[union-attr]
    driver_pid = int(Path("/proc/self").resolve().name)
    samples: dict[int, tuple[float, float]] = {}
    peak = {"driver": 0.0, "jvm": 0.0}
    stop = threading.Event()

    def sample_memory() -> None:
        while not stop.wait(0.5):  # ends with the run
            peak["driver"] = max(peak["driver"], rss_mib(driver_pid))
            peak["jvm"] = max(peak["jvm"], rss_mib(jvm_pid))

    sampler = threading.Thread(target=sample_memory, daemon=True)
    sampler.start()
    started = time.monotonic()
    stream = StreamApp(settings, DeltaLake.from_settings(settings.lake)).start(spark, True)
    query = stream.query
    while query.isActive:
        query.awaitTermination(timeout=1)
        for progress in query.recentProgress:
            batch_id = progress["batchId"]
            if batch_id not in samples:
                samples[batch_id] = (peak["driver"], peak["jvm"])
    stream.stop()
    stop.set()
    total_s = time.monotonic() - started
    print(
        f"\n{'batch':>5} {'rows':>8} {'seconds':>8} {'rows/s':>8} {'driver MiB':>11} {'JVM MiB':>8}"
    )
    total_rows = 0
    for progress in query.recentProgress:
        rows = int(progress["numInputRows"])
        seconds = progress["durationMs"]["triggerExecution"] / 1000
        driver_mib, jvm_mib = samples.get(progress["batchId"], (peak["driver"], peak["jvm"]))
        total_rows += rows
        rate = rows / seconds if seconds else 0
        print(
            f"{progress['batchId']:>5} {rows:>8} {seconds:>8.1f} {rate:>8,.0f} "
            f"{driver_mib:>11.0f} {jvm_mib:>8.0f}"
        )
        assert rows <= max_offsets, "a micro-batch exceeded maxOffsetsPerTrigger"
    print(
        f"\n{total_rows} rows in {total_s:.0f}s ({total_rows / total_s:,.0f} rows/s); peak RSS: "
        f"driver {peak['driver']:.0f} MiB, JVM {peak['jvm']:.0f} MiB "
        "(RSS columns: peak so far when the batch was seen)"
    )
    spark.stop()


def _write_conf(conf_dir: Path, tenants: tuple[str, ...]) -> None:
    shutil.copytree("conf", conf_dir)
    for path in (conf_dir / "tenants").glob("*.yaml"):
        path.unlink()
    for tenant in tenants:
        (conf_dir / "tenants" / f"{tenant}.yaml").write_text(
            f"id: {tenant}\nsources: [web, billing]\n"
        )


if __name__ == "__main__":
    main()
