"""Noisy neighbour: quiet tenants' latency before, during and after another tenant's burst.

    .venv/bin/python -m infra.dev.benchmarks.noisy_neighbour [--burst-seconds 20]

A continuous stream (1 s trigger, the project's `conf/app.yaml` otherwise) reads a local broker.
Three quiet tenants produce 10 records/s each. A fourth produces 10 records/s, then as fast as
one producer can for `--burst-seconds`, then 10/s again. A quiet record's latency runs from the
moment it is sent to the moment its (partition, offset) is in `events`: a watcher reads every
file the table's commits add, as they land. The phases' clock starts once both producers are
ready (the stream started before them); the first `--warm-up-seconds` are left out; records are
put in a phase by when they were sent.

The producers and the watcher run in processes of their own. By default the broker and the
bursting producer get one CPU to themselves (`--load-cpus`), the stream and the quiet side the
rest: in a deployment, producers and brokers do not run on the stream's CPUs, and on a 2-CPU
machine a producer sending as fast as it can takes a whole one. `--burst-elsewhere` is the
control: the same burst, into a topic the stream does not read.

It prints, per phase, the quiet records, their latency p50, p95 and max, and how many were
never seen (must be 0); then the burst's size and the stream's batches. Every loop is bounded
by the run's own deadline.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from kafka import KafkaProducer
from pyspark.sql import SparkSession

from infra.dev.benchmarks.sample_lake import (
    bench_settings,
    write_tenants_conf,
)
from infra.dev.benchmarks.table_watch import added_files
from infra.dev.load_generator import set_event_time
from infra.dev.local_stack import LocalKafka
from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import EVENTS
from streaming.app import StreamApp
from streaming.kafka.client import KafkaSecurity, kafka_python_producer
from streaming.pipeline.spark_session import build_spark
from tenants.conf_reader import load_registry
from tenants.models import EventTimeSpec
from tenants.settings import AppSettings

TOPIC = "noisy-neighbour"
ELSEWHERE = "noisy-neighbour-elsewhere"
"""With `--burst-elsewhere`, the burst goes here: a topic the stream does not read, so the run
shows what the burst costs the machine alone (the control)."""
SOURCE = "billing"
QUIET = ("quiet-1", "quiet-2", "quiet-3")
NOISY = "noisy"
QUIET_RATE_PER_S = 10
PHASES = ("before the burst", "during the burst", "after the burst")
DRAIN_LIMIT_S = 300
"""After the last record is sent, how long the watcher waits for the quiet ones at most."""
READY_LIMIT_S = 300
"""How long the producers' processes may take to start (spawn, imports, a broker connection)."""


@dataclass
class Timeline:
    """When each phase starts, in seconds after the producers' start (`StartLine`)."""

    warm_up_s: float
    before_s: float
    burst_s: float
    after_s: float
    burst_topic: str = TOPIC

    @property
    def burst_starts_s(self) -> float:
        return self.warm_up_s + self.before_s

    @property
    def burst_ends_s(self) -> float:
        return self.burst_starts_s + self.burst_s

    @property
    def ends_s(self) -> float:
        return self.burst_ends_s + self.after_s

    def phase(self, sent_s: float) -> str | None:
        """The phase a record sent then belongs to; None: start-up, left out."""
        if sent_s < self.warm_up_s:
            return None
        if sent_s < self.burst_starts_s:
            return PHASES[0]
        return PHASES[1] if sent_s < self.burst_ends_s else PHASES[2]


@dataclass
class Probe:
    """Quiet records by (partition, offset): when each was sent and first seen in `events`."""

    started: float = field(default_factory=time.monotonic)
    sent_s: dict[tuple[int, int], float] = field(default_factory=dict)
    seen_s: dict[tuple[int, int], float] = field(default_factory=dict)
    noisy_sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now_s(self) -> float:
        return time.monotonic() - self.started


class StartLine:
    """The producers' common clock, started once each of their processes is ready: a process
    that took seconds to spawn on a busy machine would otherwise begin mid-way through the
    timeline and send nothing in its first phases."""

    def __init__(self, processes: Any) -> None:
        self._go = processes.Event()
        self._started = processes.Value("d", 0.0)

    def start(self) -> float:
        """Start the clock now; its start, a `time.monotonic()` (system-wide on Linux)."""
        self._started.value = time.monotonic()
        self._go.set()
        return float(self._started.value)

    def wait(self) -> float:
        """In a producer's process: its start, once started; bounded by `READY_LIMIT_S`."""
        if not self._go.wait(READY_LIMIT_S):
            raise TimeoutError(f"the producers' clock did not start within {READY_LIMIT_S}s")
        return float(self._started.value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-up-seconds", type=float, default=40)
    parser.add_argument("--before-seconds", type=float, default=30)
    parser.add_argument("--burst-seconds", type=float, default=20)
    parser.add_argument("--after-seconds", type=float, default=30)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--burst-elsewhere",
        action="store_true",
        help="the control: send the burst to a topic the stream does not read",
    )
    parser.add_argument(
        "--load-cpus",
        type=int,
        default=1,
        help="CPUs reserved for the broker and the bursting producer (0: share all of them "
        "with the stream), so the burst loads the stream with records, not with its own CPU.",
    )
    args = parser.parse_args(argv)
    timeline = Timeline(
        args.warm_up_seconds,
        args.before_seconds,
        args.burst_seconds,
        args.after_seconds,
        ELSEWHERE if args.burst_elsewhere else TOPIC,
    )
    workdir = Path(tempfile.mkdtemp(prefix="tw-noisy-"))
    try:
        cpus = split_cpus(args.load_cpus)
        with LocalKafka(workdir / "kafka") as kafka:
            if cpus is not None:
                assert kafka.pid is not None
                pin(kafka.pid, cpus.load)
                pin(os.getpid(), cpus.stream)  # Spark's JVM and workers start from here
            kafka.create_topic(TOPIC, args.partitions)
            kafka.create_topic(ELSEWHERE, args.partitions)
            spark = build_spark("tenant-windows-noisy-neighbour", shuffle_partitions=4)
            try:
                probe, batches = run(
                    spark, probe_settings(kafka.bootstrap_servers, workdir), timeline, cpus
                )
            finally:
                spark.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(_report(probe, timeline, batches))
    return 0


def probe_settings(bootstrap_servers: str, workdir: Path) -> AppSettings:
    """The project's settings, with a 1 s trigger, on this run's broker, lake and tenants."""
    conf = write_tenants_conf(workdir / "conf", (*QUIET, NOISY), (SOURCE,))
    return bench_settings(
        conf, bootstrap_servers, TOPIC, workdir, overrides={"stream.trigger_interval": "1s"}
    )


@dataclass(frozen=True)
class Cpus:
    stream: frozenset[int]
    """The stream, the quiet producer and the watcher."""
    load: frozenset[int]
    """The broker and the bursting producer."""


def split_cpus(load_cpus: int) -> Cpus | None:
    """This process's CPUs split in two, or None to share them all."""
    available = sorted(os.sched_getaffinity(0))
    if load_cpus <= 0 or load_cpus >= len(available):
        return None
    return Cpus(frozenset(available[:-load_cpus]), frozenset(available[-load_cpus:]))


def pin(pid: int, cpus: frozenset[int]) -> None:
    """Every thread of `pid` to `cpus`; threads it starts later inherit them."""
    for thread in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(thread), cpus)


def run(
    spark: SparkSession, settings: AppSettings, timeline: Timeline, cpus: Cpus | None = None
) -> tuple[Probe, list[Any]]:
    """Run the stream here, and the producers and the watcher in processes of their own; the
    probe's records and the batches.

    A producer sending as fast as it can holds its process's interpreter lock most of the
    time: in the driver's process it would slow the stream's driver-side Python (and, with the
    watcher beside it, the measurement), which is not what a tenant's burst does to a real
    deployment. The processes share `time.monotonic()`, which is system-wide on Linux.
    """
    stream = StreamApp(settings, DeltaLake.from_settings(settings.lake)).start(spark)
    processes = multiprocessing.get_context("spawn")
    results = processes.Queue()
    start_line = StartLine(processes)
    workers = [
        processes.Process(
            target=target, args=(settings, start_line, timeline, results, cpus), name=name
        )
        for name, target in [("noisy", _noisy_process), ("quiet", _quiet_process)]
    ]
    try:
        for worker in workers:
            worker.start()
        for _ in workers:
            results.get(timeout=READY_LIMIT_S)  # each says it is ready
        probe = Probe(started=start_line.start())
        deadline_s = probe.now_s() + timeline.ends_s + DRAIN_LIMIT_S + 120
        for _ in workers:
            name, result = results.get(timeout=max(1.0, deadline_s - probe.now_s()))
            if name == "noisy":
                probe.noisy_sent = result
            else:
                probe.sent_s, probe.seen_s = result
    finally:
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()
        query = stream.query
        batches = [p for p in query.recentProgress if int(p["numInputRows"]) > 0]
        stream.stop()
    return probe, batches


def _noisy_process(
    settings: AppSettings,
    start_line: StartLine,
    timeline: Timeline,
    results: Any,
    cpus: Cpus | None,
) -> None:
    if cpus is not None:
        pin(os.getpid(), cpus.load)
    event_time = load_registry(settings.conf_dir).sources[SOURCE].event_time
    producer = _producer(settings)
    try:
        results.put(("ready", None))
        probe = Probe(started=start_line.wait())
        _produce_noisy(producer, timeline, event_time, probe)
    finally:
        producer.close(timeout=10)
    results.put(("noisy", probe.noisy_sent))


def _quiet_process(
    settings: AppSettings,
    start_line: StartLine,
    timeline: Timeline,
    results: Any,
    cpus: Cpus | None,
) -> None:
    """Send the quiet records and watch `events` for them, until all are seen or the drain
    limit passes."""
    if cpus is not None:
        pin(os.getpid(), cpus.stream)
    event_time = load_registry(settings.conf_dir).sources[SOURCE].event_time
    producer = _producer(settings)
    try:
        results.put(("ready", None))
        probe = Probe(started=start_line.wait())
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(settings, probe, stop), daemon=True)
        watcher.start()
        try:
            _produce_quiet(producer, timeline, event_time, probe)
            deadline_s = probe.now_s() + DRAIN_LIMIT_S
            while probe.now_s() < deadline_s and _unseen(probe):
                time.sleep(0.5)
        finally:
            stop.set()
            watcher.join(30)
    finally:
        producer.close(timeout=10)
    with probe.lock:
        results.put(("quiet", (dict(probe.sent_s), dict(probe.seen_s))))


def _value(tenant: str, number: int, event_time: EventTimeSpec) -> bytes:
    record: dict[str, object] = {
        "tenant": tenant,
        "source": SOURCE,
        "event_id": f"{tenant}-{number}",
        "amount": number % 500,
    }
    set_event_time(record, event_time, int(time.time() * 1000))
    return json.dumps(record, separators=(",", ":")).encode()


def _producer(settings: AppSettings) -> KafkaProducer:
    return kafka_python_producer(
        settings.kafka.bootstrap_servers,
        KafkaSecurity.of(settings.kafka),
        acks=1,
        linger_ms=5,
    )


def _produce_quiet(
    producer: KafkaProducer, timeline: Timeline, event_time: EventTimeSpec, probe: Probe
) -> None:
    number = 0
    next_s = probe.now_s()
    while next_s < timeline.ends_s:
        for tenant in QUIET:
            sent_s = probe.now_s()
            future = producer.send(
                TOPIC, key=tenant.encode(), value=_value(tenant, number, event_time)
            )
            future.add_callback(_remember(probe, sent_s))
        number += 1
        next_s += 1 / QUIET_RATE_PER_S
        time.sleep(max(0.0, next_s - probe.now_s()))
    producer.flush(timeout=60)


def _remember(probe: Probe, sent_s: float) -> Callable[[object], None]:
    def sent(metadata: object) -> None:
        with probe.lock:
            probe.sent_s[(metadata.partition, metadata.offset)] = sent_s  # type: ignore[attr-defined]

    return sent


def _produce_noisy(
    producer: KafkaProducer, timeline: Timeline, event_time: EventTimeSpec, probe: Probe
) -> None:
    next_s = probe.now_s()
    while (now_s := probe.now_s()) < timeline.ends_s:
        value = _value(NOISY, probe.noisy_sent, event_time)
        producer.send(timeline.burst_topic, key=NOISY.encode(), value=value)
        probe.noisy_sent += 1
        if not timeline.burst_starts_s <= now_s < timeline.burst_ends_s:
            next_s = max(next_s, now_s) + 1 / QUIET_RATE_PER_S
            time.sleep(max(0.0, next_s - probe.now_s()))
    producer.flush(timeout=120)


def _watch(settings: AppSettings, probe: Probe, stop: threading.Event) -> None:
    """Read each file `events` commits add, once, and note when quiet records first show up."""
    uri = DeltaLake.from_settings(settings.lake).table_uri(EVENTS)
    for file_uri in added_files(uri, stop, 0.2):
        rows = pq.read_table(file_uri, columns=["tenant", "partition", "offset"])
        rows = rows.filter(pc.is_in(rows["tenant"], value_set=pc.cast(QUIET, "string")))
        seen_s = probe.now_s()
        with probe.lock:
            coordinates = zip(
                rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True
            )
            for key in coordinates:
                probe.seen_s.setdefault(key, seen_s)


def _unseen(probe: Probe) -> int:
    with probe.lock:
        return len(probe.sent_s.keys() - probe.seen_s.keys())


@dataclass(frozen=True)
class PhaseFigures:
    phase: str
    latencies_s: list[float]
    """Of the quiet records sent in the phase and seen in `events`, sorted."""
    unseen: int

    def percentile_s(self, share: float) -> float:
        ordered = self.latencies_s
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


def phase_figures(probe: Probe, timeline: Timeline) -> list[PhaseFigures]:
    latencies: dict[str, list[float]] = {}
    unseen: dict[str, int] = {}
    for key, sent_s in probe.sent_s.items():
        phase = timeline.phase(sent_s)
        if phase is None:
            continue
        if key in probe.seen_s:
            latencies.setdefault(phase, []).append(probe.seen_s[key] - sent_s)
        else:
            unseen[phase] = unseen.get(phase, 0) + 1
    return [
        PhaseFigures(phase, sorted(latencies.get(phase, [])), unseen.get(phase, 0))
        for phase in PHASES
    ]


def _report(probe: Probe, timeline: Timeline, batches: list[Any]) -> str:
    lines = [
        f"{'phase':<18} {'quiet records':>13} {'p50 s':>6} {'p95 s':>6} {'max s':>6} {'unseen':>6}"
    ]
    for figures in phase_figures(probe, timeline):
        lines.append(
            f"{figures.phase:<18} {len(figures.latencies_s):>13,} "
            f"{figures.percentile_s(0.5):>6.1f} {figures.percentile_s(0.95):>6.1f} "
            f"{figures.percentile_s(1.0):>6.1f} {figures.unseen:>6}"
        )
    burst_rate = probe.noisy_sent / max(timeline.burst_s, 1)
    lines.append(
        f"\nnoisy tenant: {probe.noisy_sent:,} records, about {burst_rate:,.0f}/s during its "
        f"{timeline.burst_s:.0f} s burst"
    )
    lines.append(f"{'batch':>5} {'rows':>8} {'seconds':>8}")
    for progress in batches:
        duration = progress["durationMs"]["triggerExecution"] / 1000
        lines.append(f"{progress['batchId']:>5} {progress['numInputRows']:>8} {duration:>8.1f}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
