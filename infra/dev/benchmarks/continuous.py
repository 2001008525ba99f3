"""The continuous stream as users run it: start-up, freshness, keeping up, restarts (issue 38).

    .venv/bin/python -m infra.dev.benchmarks.continuous [--tenants 4] [--rate 40] [--seconds 60]
        [--restarts 3] [--json data/bench/continuous.json]

`tenant-windows run` runs in a process of its own, as users start it: the project's
`conf/app.yaml` with a 1 s trigger (`--trigger-interval`), `--tenants` tenants, a local broker.
A producer process sends `--rate` records a second, round-robin over the tenants, for the
whole run; this process reads each file `events` commits add, once, and notes when each record
(by partition and offset) first shows up there. It reports:

1. **start:** from launching `run` to its first committed batch, split by the lines the stream
   logs as it goes: the lease claimed (Python and the config before it), the Spark session
   started, the query started (checkpoint, Data Source, plan), the first batch's progress;
2. **freshness:** sent -> readable in `events`, p50, p95 and max, over the records sent in the
   `--seconds` after the first committed batch (start-up left out);
3. **keeping up:** how long after it was sent the last of those records was readable, and each
   minute: the memory of the stream's processes (`run`, its JVM and Python workers) as PSS,
   by kind of process (forked workers share their daemon's pages, which RSS would count once
   per worker), again after a full collection the JVM is asked for (`jcmd`), once it has given
   the heap back, then also each process's, and the JVM's heap; the state store's files and
   bytes, the checkpoint's and the lake's file counts;
4. **restarts:** `--restarts` times, SIGKILL every process of the stream (by PID) and start it
   again at once; the time to its first committed batch, split as in 1. Records keep coming.
   With `--standby`, a `run --standby` instance is started and ready first instead: the time
   is from the SIGKILL to the standby's first committed batch.

Each start also says when each kind of process showed up and the CPU seconds each used until
the first committed batch: on two cores, the CPU a start needs is its floor.

The topic keeps what a broker's retention would: every `RETENTION_INTERVAL_S` the records below
the offsets the stream has committed to its consumer group are deleted (`DeleteRecords`). The
test broker (noida-db) rewrites its whole store as records arrive, so without that its CPU grew
with the records kept, from 0.04 of a core to 0.43 in the first 4.5 minutes at 2,000 records/s,
on the cores the stream shares with it. `--keep-topic` keeps every record, as before.

Every loop is bounded by the run's deadline; only processes this benchmark started are ended.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import multiprocessing
import os
import queue
import re
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from infra.dev.benchmarks.sample_lake import PROJECT_CONF, bench_settings, write_tenants_conf
from infra.dev.benchmarks.stream_processes import (
    ProcessTree,
    folder_files,
    jvm_cpu_s_by_thread_kind,
    jvm_heap_after_gc_mib,
    jvm_pid,
    pss_mib_by_kind,
    pss_mib_by_process,
    summed_by_kind,
)
from infra.dev.benchmarks.table_watch import added_files
from infra.dev.load_generator import set_event_time
from infra.dev.local_process import LocalProcess, sigterm_as_interrupt
from infra.dev.local_stack import LocalKafka
from storage.lake.delta_lake import DeltaLake
from storage.lake.file_names import written_by_a_batch
from storage.lake.tables import ALL_TABLES, EVENTS, WINDOWS
from streaming.kafka.client import KafkaSecurity, kafka_python_admin, kafka_python_producer
from tenants.conf_reader import load_registry
from tenants.settings import AppSettings

TOPIC = "continuous"
SOURCE = "billing"
START_LIMIT_S = 180.0
"""A start that has not committed a batch by then failed."""
DRAIN_LIMIT_S = 120
"""After the measured records, how long the watcher waits for the last of them at most."""
RETENTION_INTERVAL_S = 30.0
"""How often the topic is cut back to the records the stream has not committed yet."""
TICK_S = 0.01
"""The producer sends what is due every tick."""
LINGER_MS = 5
"""A tick's records share a request; a record's freshness includes at most this wait."""
WATCH_INTERVAL_S = 0.05
PANE_COLUMNS = ["tenant", "window_end", "is_final"]
# The stream's lines that mark a start's phases, in order (`streaming.app.run_stream`,
# `storage.lake.writer_lease`, and the first batch's progress line).
PHASES = (
    ("lease claimed", re.compile(r"stream '.*' claimed by instance")),
    ("Spark session", re.compile(r"Spark session started in")),
    ("query started", re.compile(r"query started in")),
    ("first batch", re.compile(r'"batch_id":')),
)

STANDING_BY = re.compile(r"standing by for stream .*: ready")
FIRST_BATCH_SPLIT = re.compile(r"the run's first batch, \d+: (\{.*\}) ms")


@dataclass
class Start:
    """One start of the stream: seconds from launching `run` to each phase's line."""

    kind: str
    phases_s: dict[str, float] = field(default_factory=dict)
    first_batch_ms: dict[str, int] = field(default_factory=dict)
    """Spark's split of the first batch (`durationMs`), as the stream logs it."""
    processes_s: dict[str, float] = field(default_factory=dict)
    """When each kind of process first showed up, seconds from the launch (or the kill)."""
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds each kind of process used until the first committed batch."""
    jvm_cpu_s: dict[str, float] = field(default_factory=dict)
    """The JVM's share of those by what its threads do (JIT compilers, GC, the rest)."""


class StreamProcess(LocalProcess):
    """`tenant-windows run` in its own session (`LocalProcess`: its output in a log file, ended
    by the PIDs it started); ready once its first batch is committed, or, `--standby`, once it
    stands by. Each phase's line is stamped when a probe first sees it, every
    `probe_interval_s`."""

    name = "tenant-windows run"
    ready_deadline_s = START_LIMIT_S
    probe_interval_s = 0.05

    def __init__(
        self, command: list[str], log_path: Path, start_limit_s: float = START_LIMIT_S
    ) -> None:
        super().__init__(log_path)
        self.command = command
        self.ready_deadline_s = start_limit_s
        self._start = Start("none")
        self._launched_s = 0.0
        self._read_bytes = 0
        self._ready = "standing by" if "--standby" in command else "first batch"
        self._tree: ProcessTree | None = None
        self._jvm_cpu_before_s: dict[str, float] = {}

    @property
    def address(self) -> str:
        return f"its log {self.log_path}"

    def launch(self, kind: str) -> Start:
        """Start it and wait for its first committed batch; its phases."""
        self._start = Start(kind)
        self._read_bytes = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._launched_s = time.monotonic()
        self._tree = None
        self._jvm_cpu_before_s = {}
        self.start()
        self._note_processes()
        return self._start

    def take_over_from(self, active: StreamProcess) -> Start:
        """SIGKILL `active` (this is its ready standby); the phases of this one's takeover, from
        the kill to its first committed batch."""
        self._start = Start("standby after SIGKILL")
        self._read_bytes = self.log_path.stat().st_size
        self._ready = "first batch"
        self._launched_s = time.monotonic()
        assert self.pid is not None
        # Only what the takeover costs: the CPU it had used standing by is not counted.
        self._tree = ProcessTree(self.pid, count_from_now=True)
        jvm = jvm_pid(self.pid)
        self._jvm_cpu_before_s = {} if jvm is None else jvm_cpu_s_by_thread_kind(jvm)
        active.stop(kill=True)
        self._wait_until_ready()
        self._note_processes()
        return self._start

    def start(self) -> StreamProcess:
        self._launch(self.command, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
        return self

    def memory_mib(self) -> float:
        """The memory of the stream's process tree: the driver, its JVM and Python workers."""
        if self.pid is None:
            return 0.0
        return sum(pss_mib_by_kind(self.pid).values())

    def minute(self, checkpoint: Path, lake_root: Path, lake: DeltaLake) -> dict[str, Any]:
        """This minute's memory, by kind of process and in the JVM's heap after a full
        collection, and the files the stream keeps: on disk, and in the tables' newest
        versions (what compaction bounds; the rest waits for `vacuum`)."""
        if self.pid is None:
            return {}
        started_s, started_cpu_s = time.monotonic(), _own_cpu_s()
        by_kind = pss_mib_by_kind(self.pid)
        jvm = jvm_pid(self.pid)
        heap = None if jvm is None else jvm_heap_after_gc_mib(jvm)
        # Sampled again right after the collection: the heap's pages the JVM keeps between two
        # collections come and go with when the sample falls; what stays after one is the drift.
        each_after_gc = pss_mib_by_process(self.pid)
        after_gc = summed_by_kind(each_after_gc)
        state_files, state_bytes = folder_files(checkpoint / "state")
        checkpoint_files, _ = folder_files(checkpoint)
        lake_files, _ = folder_files(lake_root)
        return {
            "pss_mib": round(sum(by_kind.values())),
            "pss_mib_by_kind": by_kind,
            "pss_mib_after_gc": round(sum(after_gc.values())),
            "pss_mib_by_kind_after_gc": after_gc,
            "pss_mib_by_process_after_gc": each_after_gc,
            "heap_after_gc_mib": None if heap is None else heap[0],
            "heap_committed_mib": None if heap is None else heap[1],
            "state_files": state_files,
            "state_mib": round(state_bytes / 2**20, 1),
            "checkpoint_files": checkpoint_files,
            "lake_files": lake_files,
            "table_files": sum(lake.open(spec).get_add_actions().num_rows for spec in ALL_TABLES),
            # What taking this sample cost the machine the stream runs on.
            "sample_s": round(time.monotonic() - started_s, 2),
            "sample_cpu_s": round(_own_cpu_s() - started_cpu_s, 2),
        }

    def _note_processes(self) -> None:
        if self._tree is not None:
            self._start.processes_s = dict(self._tree.first_seen_s)
            self._start.cpu_s = self._tree.cpu_s_by_kind()
        jvm = None if self.pid is None else jvm_pid(self.pid)
        if jvm is not None:
            self._start.jvm_cpu_s = {
                kind: round(seconds - self._jvm_cpu_before_s.get(kind, 0.0), 2)
                for kind, seconds in jvm_cpu_s_by_thread_kind(jvm).items()
            }

    def _probe(self) -> None:
        seen_s = round(time.monotonic() - self._launched_s, 2)
        if self._tree is None and self.pid is not None:
            self._tree = ProcessTree(self.pid)
        if self._tree is not None:
            self._tree.look(seen_s)
        with self.log_path.open("rb") as log:
            log.seek(self._read_bytes)
            text = log.read()
        complete = text[: text.rfind(b"\n") + 1]
        self._read_bytes += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            if (split := FIRST_BATCH_SPLIT.search(line)) is not None:
                self._start.first_batch_ms = ast.literal_eval(split.group(1))
            for phase, pattern in (*PHASES, ("standing by", STANDING_BY)):
                if phase not in self._start.phases_s and pattern.search(line):
                    self._start.phases_s[phase] = seen_s
        if self._ready not in self._start.phases_s:
            raise RuntimeError(f"not yet: {self._ready}")


def _own_cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for (`jcmd`)."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--rate", type=int, default=40, help="records/s, all tenants")
    parser.add_argument("--seconds", type=float, default=60, help="measured after the start")
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--trigger-interval", default="1s")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--window",
        help="e.g. 2s: the source's tumbling window, with no out-of-orderness or lateness, so "
        "that final panes close during the run (default: conf/sources.yaml's rules)",
    )
    parser.add_argument(
        "--standby", action="store_true", help="restarts: a ready standby takes over instead"
    )
    parser.add_argument(
        "--start-limit",
        type=float,
        default=START_LIMIT_S,
        help="seconds a start may take to its first committed batch (a busy machine: more)",
    )
    parser.add_argument(
        "--keep-topic",
        action="store_true",
        help="keep every record in the topic (default: delete what the stream has committed, "
        "as a broker's retention would)",
    )
    parser.add_argument("--json", type=Path, default=Path("data/bench/continuous.json"))
    parser.add_argument("--keep-logs", type=Path, help="a folder to copy the streams' logs to")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tw-continuous-"))
    try:
        # SIGTERM stops the broker and streams started here, as Ctrl-C does.
        with sigterm_as_interrupt(), LocalKafka(workdir / "kafka") as kafka:
            kafka.create_topic(TOPIC, args.partitions)
            figures = run(kafka.bootstrap_servers, workdir, args)
    finally:
        if args.keep_logs is not None:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for stream_log in workdir.glob("*.log"):
                shutil.copy(stream_log, args.keep_logs)
        shutil.rmtree(workdir, ignore_errors=True)
    print(report(figures))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def run(bootstrap_servers: str, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    tenants = [f"t{number:03d}" for number in range(args.tenants)]
    conf = write_tenants_conf(
        workdir / "conf", tenants, (SOURCE,), sources_from=_sources(workdir, args.window)
    )
    settings = bench_settings(conf, bootstrap_servers, TOPIC, workdir)
    command = [
        sys.executable, "-m", "infra.cli", "run",
        "--conf", str(conf), "--bootstrap-servers", bootstrap_servers, "--topic", TOPIC,
        "--lake-root", settings.lake.root, "--checkpoint-dir", settings.stream.checkpoint_dir,
        "--trigger-interval", args.trigger_interval,
    ]  # fmt: skip
    stream = StreamProcess(command, workdir / "stream.log", args.start_limit)
    instances = [stream]
    processes = multiprocessing.get_context("spawn")
    stamps = _Stamps(processes.Queue())
    stop_producing = processes.Event()
    producer = processes.Process(
        target=_produce,
        args=(settings, tenants, args.rate, stamps.reports, stop_producing),
        daemon=True,
    )
    lake = DeltaLake.from_settings(settings.lake)
    watcher = _Watcher(lake.table_uri(EVENTS), ["partition", "offset"], _record_keys)
    # Wall-clock: a window's end is an event time, and events are stamped when sent.
    panes = _Watcher(lake.table_uri(WINDOWS), PANE_COLUMNS, _final_pane_keys, clock=time.time)
    starts: list[Start] = []
    memory_per_minute: list[float] = []
    minutes: list[dict[str, Any]] = []
    checkpoint = Path(settings.stream.checkpoint_dir)
    lake_root = Path(settings.lake.root)
    retention = None if args.keep_topic else TopicRetention(settings)
    try:
        producer.start()
        watcher.start()
        panes.start()
        if retention is not None:
            retention.start()
        starts.append(stream.launch("start"))
        measured_from = time.monotonic()
        measure_until = measured_from + args.seconds
        panes_from_s = time.time()
        next_sample = measured_from
        while (now := time.monotonic()) < measure_until:  # bounded by --seconds
            if now >= next_sample:
                minutes.append(stream.minute(checkpoint, lake_root, lake))
                memory_per_minute.append(minutes[-1].get("pss_mib", 0))
                print(f"minute {len(minutes) - 1}: {minutes[-1]}", flush=True)
                next_sample += 60
            stamps.take()
            time.sleep(min(1.0, max(0.0, measure_until - now)))
        stamps.take(wait_s=2 * (LINGER_MS / 1000 + 1))  # the last second's stamps
        measured = stamps.between(measured_from, measure_until)
        last_seen = watcher.wait_for(measured, DRAIN_LIMIT_S)
        memory_per_minute.append(round(stream.memory_mib()))
        for restart in range(args.restarts):
            if args.standby:
                standby = StreamProcess(
                    [*command, "--standby"], workdir / f"standby-{restart}.log", args.start_limit
                )
                instances.append(standby)
                standby.launch("standby")
                starts.append(standby.take_over_from(stream))
                stream = standby
            else:
                stream.stop(kill=True)
                starts.append(stream.launch("restart after SIGKILL"))
    finally:
        for instance in instances:
            instance.stop()  # SIGTERM, as an operator stops it; a stopped one is left alone
        stop_producing.set()
        stamps.take(wait_s=30)  # until its last report: a full queue holds its exit back
        producer.join(30)
        if producer.is_alive():
            producer.kill()
        watcher.stop()
        panes.stop()
        if retention is not None:
            retention.stop()
    sent_and_latency = [
        (sent_s, watcher.seen_s[key] - sent_s)
        for key, sent_s in measured.items()
        if key in watcher.seen_s
    ]
    latencies = sorted(latency for _, latency in sent_and_latency)
    # By the minute each record was sent: a slow batch (a compaction) shows as one bad minute.
    latencies_by_minute: list[list[float]] = [[] for _ in range(math.ceil(args.seconds / 60))]
    for sent_s, latency in sent_and_latency:
        minute = min(int((sent_s - measured_from) // 60), len(latencies_by_minute) - 1)
        latencies_by_minute[minute].append(latency)
    # A final pane is due once a record stamped past its end (plus out-of-orderness and
    # lateness, both 0 with `--window`) is sent: at its end, and a key's next record is at most
    # `tenants / rate` seconds later. (A pane's `watermark` is its batch's, often later.) Only
    # the windows that ended during the measured seconds.
    pane_latencies = sorted(
        seen_s - window_end_s
        for (_, window_end_s), seen_s in panes.seen_s.items()
        if panes_from_s <= window_end_s < panes_from_s + args.seconds
    )
    last_sent = max(measured.values(), default=None)
    return {
        "tenants": args.tenants,
        "rate": args.rate,
        "seconds": args.seconds,
        "trigger_interval": args.trigger_interval,
        "standby": args.standby,
        "topic_kept": args.keep_topic,
        "starts": [asdict(start) for start in starts],
        "measured_records": len(measured),
        "unseen": len(measured) - len(latencies),
        "latency_s": _percentiles(latencies),
        "window": args.window,
        "final_panes": len(pane_latencies),
        "final_pane_latency_s": _percentiles(pane_latencies),
        "last_record_readable_after_s": (
            None if last_seen is None or last_sent is None else round(last_seen - last_sent, 2)
        ),
        "memory_mib_per_minute": memory_per_minute,
        "minutes": minutes,
        "latency_s_per_minute": [_percentiles(sorted(minute)) for minute in latencies_by_minute],
    }


def _sources(workdir: Path, window: str | None) -> Path:
    """A config folder whose `sources.yaml` is the project's, `SOURCE` with `window` if given."""
    if window is None:
        return PROJECT_CONF
    sources = yaml.safe_load((PROJECT_CONF / "sources.yaml").read_text())
    rules = sources["sources"][SOURCE]
    rules["window"] = {"kind": "tumbling", "size": window}
    rules["out_of_orderness"] = "0s"
    rules["allowed_lateness"] = "0s"
    folder = workdir / "sources"
    folder.mkdir()
    (folder / "sources.yaml").write_text(yaml.safe_dump(sources))
    return folder


def _produce(
    settings: AppSettings,
    tenants: list[str],
    rate: int,
    stamps_out: Any,
    stop: Any,
) -> None:
    """Send `rate` records a second until `stop`, in ticks of `TICK_S`; put on `stamps_out`,
    about once a second, when each was sent, by (partition, offset). Bounded by the stop event
    and a day's sends.

    It shares the cores with the stream it loads, so it spends little: a tick's records go in
    one request (`LINGER_MS`), not one request each, and the stamps travel in a few messages a
    second, not one call a record. At 500 records/s, one request a record and a shared
    dictionary's call a second took about 0.6 of one of the machine's two cores, and copying
    that dictionary of millions of stamps at the end took the cores for minutes, while the
    last records' freshness was being measured."""
    event_time = load_registry(settings.conf_dir).sources[SOURCE].event_time
    producer = kafka_python_producer(
        settings.kafka.bootstrap_servers,
        KafkaSecurity.of(settings.kafka),
        acks=1,
        linger_ms=LINGER_MS,
    )
    # Appended by the producer's I/O thread as the broker acknowledges; taken from the left.
    stamps: deque[tuple[int, int, float]] = deque()
    started_s = time.monotonic()
    sent = 0
    flushed_s = started_s
    try:
        for _ in range(math.ceil(86_400 / TICK_S)):
            if stop.is_set():
                break
            now_s = time.monotonic()
            due = min(int((now_s - started_s) * rate), rate * 86_400)
            for number in range(sent, due):
                tenant = tenants[number % len(tenants)]
                record: dict[str, object] = {"tenant": tenant, "source": SOURCE, "amount": number}
                set_event_time(record, event_time, int(time.time() * 1000))
                sent_s = time.monotonic()
                future = producer.send(
                    TOPIC, key=tenant.encode(), value=json.dumps(record).encode()
                )
                future.add_callback(
                    lambda metadata, sent_s=sent_s: stamps.append(
                        (metadata.partition, metadata.offset, sent_s)
                    )
                )
            sent = due
            if now_s - flushed_s >= 1 and stamps:
                stamps_out.put([stamps.popleft() for _ in range(len(stamps))])
                flushed_s = now_s
            time.sleep(max(0.0, now_s + TICK_S - time.monotonic()))
        producer.flush(timeout=30)
        stamps_out.put([stamps.popleft() for _ in range(len(stamps))])
    finally:
        producer.close(timeout=10)
        stamps_out.put(None)


class TopicRetention:
    """Deletes, every `RETENTION_INTERVAL_S`, the records of the stream's topic below the
    offsets it has committed to its consumer group: those its checkpoint is past, so no start
    reads them."""

    def __init__(self, settings: AppSettings, interval_s: float = RETENTION_INTERVAL_S) -> None:
        self._kafka = settings.kafka
        self._interval_s = interval_s
        self._group_id = settings.kafka.group_id or settings.stream.name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trim, name="topic-retention", daemon=True)
        self.deleted_below: dict[int, int] = {}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _trim(self) -> None:
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        admin = kafka_python_admin(
            self._kafka.bootstrap_servers, KafkaSecurity.of(self._kafka), "bench-retention", 10_000
        )
        try:
            # Bounded: the run's stop ends it, and a day's intervals at most.
            for _ in range(math.ceil(86_400 / self._interval_s)):
                if self._stop.wait(self._interval_s):
                    return
                try:
                    committed = admin.list_group_offsets(self._group_id)[self._group_id]
                    below = {
                        TopicPartition(self._kafka.topic, tp.partition): meta.offset
                        for tp, meta in committed.items()
                        if tp.topic == self._kafka.topic
                        and meta.offset > self.deleted_below.get(tp.partition, 0)
                    }
                    if below:
                        admin.delete_records(below)
                        self.deleted_below.update({tp.partition: o for tp, o in below.items()})
                except KafkaError as error:  # the next interval tries again
                    print(f"topic retention: {error}", flush=True)
        finally:
            admin.close()


class _Stamps:
    """When each record was sent, by (partition, offset), as the producer reports them."""

    def __init__(self, reports: Any) -> None:
        self.reports = reports
        self.sent_s: dict[tuple[int, int], float] = {}
        self.producer_done = False

    def take(self, wait_s: float = 0.0) -> None:
        """Take what the producer has reported; wait up to `wait_s` for its last report."""
        deadline = time.monotonic() + wait_s
        while not self.producer_done:
            try:
                batch = self.reports.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    return
                continue
            if batch is None:
                self.producer_done = True
                return
            self.sent_s.update(((partition, offset), s) for partition, offset, s in batch)

    def between(self, first_s: float, last_s: float) -> dict[tuple[int, int], float]:
        return {key: sent_s for key, sent_s in self.sent_s.items() if first_s <= sent_s < last_s}


class _Watcher:
    """Reads each file a table's commits add, once; notes when each row's key (`keys`, over
    `columns`) first shows up, by `clock`."""

    def __init__(
        self,
        table_uri: str,
        columns: list[str],
        keys: Callable[[pa.Table], Iterable[tuple[Any, ...]]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table_uri = table_uri
        self.columns = columns
        self.keys = keys
        self.clock = clock
        self.seen_s: dict[tuple[Any, ...], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def wait_for(self, records: dict[tuple[int, int], float], limit_s: float) -> float | None:
        """When the last of `records` was seen (None: not all were within `limit_s`)."""
        # Looks at each of a million records once, then only at those not seen yet: this
        # process shares the cores with the stream it measures.
        deadline = time.monotonic() + limit_s
        missing = [key for key in records if key not in self.seen_s]
        while time.monotonic() < deadline:
            with self._lock:
                missing = [key for key in missing if key not in self.seen_s]
                if not missing:
                    return max((self.seen_s[key] for key in records), default=None)
            time.sleep(0.2)
        return None

    def _watch(self) -> None:
        for file_uri in added_files(self.table_uri, self._stop, WATCH_INTERVAL_S):
            if not written_by_a_batch(file_uri):
                # A compaction's files hold rows seen in the staged files they replace; reading
                # a million of them would hold up this process, not the stream.
                continue
            rows = pq.read_table(file_uri, columns=self.columns)
            seen_s = self.clock()
            with self._lock:
                for key in self.keys(rows):
                    self.seen_s.setdefault(key, seen_s)


def _record_keys(rows: pa.Table) -> Iterable[tuple[Any, ...]]:
    return zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True)


def _final_pane_keys(rows: pa.Table) -> Iterable[tuple[Any, ...]]:
    """(tenant, window end in epoch seconds) of final panes."""
    final = rows.filter(pc.field("is_final"))
    window_end_s = pc.divide(pc.cast(final["window_end"], pa.int64()), 1e6)  # from microseconds
    return zip(final["tenant"].to_pylist(), window_end_s.to_pylist(), strict=True)


def _percentiles(latencies: list[float]) -> dict[str, float] | None:
    if not latencies:
        return None
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {
        "p50": round(quantiles[49], 2),
        "p95": round(quantiles[94], 2),
        "max": round(latencies[-1], 2),
    }


def report(figures: dict[str, Any]) -> str:
    lines = [
        f"{figures['tenants']} tenants, {figures['rate']} records/s, trigger "
        f"{figures['trigger_interval']}, {figures['seconds']:.0f} s measured",
        f"{'start':<24}" + "".join(f"{phase:>15}" for phase, _ in PHASES),
    ]
    for start in figures["starts"]:
        phases = start["phases_s"]
        lines.append(
            f"{start['kind']:<24}"
            + "".join(f"{phases.get(phase, float('nan')):>15.2f}" for phase, _ in PHASES)
        )
        lines.append(f"{'':<24}first batch, ms: {start['first_batch_ms']}")
        lines.append(f"{'':<24}processes from, s: {start.get('processes_s')}")
        lines.append(f"{'':<24}CPU s until the first batch: {start.get('cpu_s')}")
        lines.append(f"{'':<24}the JVM's, by thread: {start.get('jvm_cpu_s')}")
    latency = figures["latency_s"] or {}
    lines += [
        f"freshness (sent -> readable in events) over {figures['measured_records']} records: "
        f"p50 {latency.get('p50')} s, p95 {latency.get('p95')} s, max {latency.get('max')} s; "
        f"unseen {figures['unseen']}",
        f"last record readable {figures['last_record_readable_after_s']} s after it was sent",
        f"final panes (window's end -> readable in windows), {figures['final_panes']}: "
        f"{figures['final_pane_latency_s']}",
        f"stream memory (PSS) MiB per minute: {figures['memory_mib_per_minute']}",
        "stream memory (PSS) after the JVM's full GC, MiB per minute: "
        + str([minute.get("pss_mib_after_gc") for minute in figures.get("minutes", [])]),
        "JVM heap after a full GC, MiB per minute: "
        + str([minute.get("heap_after_gc_mib") for minute in figures.get("minutes", [])]),
        "freshness p95 / max per minute sent, s: "
        + ", ".join(
            "-" if minute is None else f"{minute['p95']}/{minute['max']}"
            for minute in figures["latency_s_per_minute"]
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
