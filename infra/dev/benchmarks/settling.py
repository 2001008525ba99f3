"""Settling at many tenants: object-store PUTs per million records and compaction's share of the
stream's time, over several compactions of a continuous stream (issue 37, point 4).

    .venv/bin/python -m infra.dev.benchmarks.settling --tenants 100000 --rate 5000 --seconds 600

A topic is preloaded with `--rate` x `--seconds` records of `--tenants` tenants, one source, most
of them small: `--big-tenants` tenants send `--big-share` of the records, every other tenant the
rest, interleaved at random. A continuous stream with the default trigger (5 s) reads it with
`maxOffsetsPerTrigger` = rate x trigger, so while it keeps up it sees `--rate` records/s, as a
stream fed at that rate would.

The settling settings are the defaults shortened: a merge every 10 min / `--merge-speedup` with
`settle_rows` 2,000 / `--merge-speedup` (a key reaches it in a merge exactly when it would at
the defaults), and the age limit 6 h / `--age-speedup`. The run then holds several merges and
compactions that settle everything. A merge's fixed cost (Spark jobs, commits) is spread over
`--merge-speedup` times fewer records than at the defaults, so its measured share of the time
between merges is an upper bound of the share at the defaults.

It prints what the run measured (files and commits from the Delta logs, each compaction's
time from its log line) and the arithmetic that scales it to the defaults. Figures of one run
on one machine; the scaling assumptions are printed beside the result.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from infra.dev.benchmarks.figures_file import write_figures
from infra.dev.benchmarks.sample_lake import bench_settings, without_limits, write_tenants_conf
from infra.dev.load_generator import LoadSpec, generate, send
from infra.dev.local_stack import LocalKafka
from storage.lake.delta_lake import DeltaLake, compaction_app_id
from storage.lake.tables import ALL_TABLES, STAGED_TABLES
from streaming.app import StreamApp
from streaming.pipeline.spark_session import build_spark
from tenants.conf_reader import load_registry
from tenants.settings import AppSettings, StreamSettings

DEFAULTS = StreamSettings()
POLL_S = 1.0


@dataclass(frozen=True)
class Pass:
    """One table's part of one compaction, from its log line."""

    at_s: float
    table: str
    settled_all: bool
    staged_files: int
    settled_files: int
    rows: int
    runs: int
    seconds: float


class _CompactionLog(logging.Handler):
    """Collects the compaction's log lines (`Compaction._compact`) as they are emitted."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.passes: list[Pass] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not record.getMessage().startswith("compacted "):
            return
        table, mode, staged, settled, rows, runs, seconds = record.args or ()
        self.passes.append(
            Pass(
                record.created,
                str(table),
                mode == "settled everything",
                int(str(staged)),
                int(str(settled)),
                int(str(rows)),
                int(str(runs)),
                float(str(seconds)),
            )
        )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tw-settling-"))
    try:
        with LocalKafka(workdir / "kafka") as kafka:
            settings = _preload(kafka, workdir, args)
            spark = build_spark("tenant-windows-settling", shuffle_partitions=4)
            try:
                figures = _run(spark, settings, args)
            finally:
                spark.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    write_figures(args.json, figures)
    print(f"figures written to {args.json}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=100_000)
    parser.add_argument("--big-tenants", type=int, default=1_000)
    parser.add_argument("--big-share", type=float, default=0.8, help="of the records")
    parser.add_argument("--rate", type=int, default=5_000, help="records/s")
    parser.add_argument("--seconds", type=int, default=600, help="of records at --rate")
    parser.add_argument(
        "--merge-speedup", type=float, default=10.0, help="merge_interval and settle_rows"
    )
    parser.add_argument("--age-speedup", type=float, default=72.0, help="compact_interval")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--json", type=Path, default=Path("data/bench/settling.json"))
    return parser


def _weighted_tenants(args: argparse.Namespace) -> tuple[str, ...]:
    """Tenant ids, each as often as its share of a cycle of the generator's round robin."""
    small = [f"t{n:06d}" for n in range(args.big_tenants, args.tenants)]
    big = [f"t{n:06d}" for n in range(args.big_tenants)]
    repeats = round(args.big_share * len(small) / ((1 - args.big_share) * len(big)))
    weighted = small + big * max(repeats, 1)
    random.Random(20261126).shuffle(weighted)
    return tuple(weighted)


def _preload(kafka: LocalKafka, workdir: Path, args: argparse.Namespace) -> AppSettings:
    topic = "settling"
    kafka.create_topic(topic, args.partitions)
    conf = workdir / "conf"
    write_tenants_conf(conf, (f"t{n:06d}" for n in range(args.tenants)), ("web",))
    registry = load_registry(conf)
    spec = LoadSpec(
        tenants=_weighted_tenants(args),
        sources=("web",),
        count=args.rate * args.seconds,
        malformed_share=0.0,
        seed=20261126,
        start_ms=LoadSpec().start_ms + 12 * 3_600_000,  # midday: one window date a day
    )
    started = time.monotonic()
    sent = send(
        generate(spec, {n: s.event_time for n, s in registry.sources.items()}),
        kafka.bootstrap_servers,
        topic,
        timeout_s=3_600,
    )
    print(f"produced {sent} records in {time.monotonic() - started:.0f}s", flush=True)
    trigger_s = DEFAULTS.trigger_interval_ms / 1000
    settings = bench_settings(
        conf,
        kafka.bootstrap_servers,
        topic,
        workdir,
        "settling",
        {"kafka.max_offsets_per_trigger": int(args.rate * trigger_s)},
    )
    return without_limits(
        settings,
        compact_interval_ms=round(DEFAULTS.compact_interval_ms / args.age_speedup),
        merge_interval_ms=round(DEFAULTS.merge_interval_ms / args.merge_speedup),
        settle_rows=max(1, round(DEFAULTS.settle_rows / args.merge_speedup)),
    )


def _run(spark: SparkSession, settings: AppSettings, args: argparse.Namespace) -> dict[str, Any]:
    records = args.rate * args.seconds
    compactions = _CompactionLog()
    logging.getLogger("storage.upkeep.compaction").addHandler(compactions)
    logging.getLogger("storage.upkeep.compaction").setLevel(logging.INFO)
    app = StreamApp(settings)
    batches: dict[int, tuple[int, float]] = {}
    started = time.time()
    stream = app.start(spark, available_now=False)
    deadline = time.monotonic() + 3 * args.seconds + 300
    try:
        # Bounded: every record read, or the deadline.
        while time.monotonic() < deadline:
            for progress in stream.query.recentProgress:
                rows = int(progress["numInputRows"])
                if rows:
                    duration_s = progress["durationMs"]["triggerExecution"] / 1000
                    batches[int(progress["batchId"])] = (rows, duration_s)
            if sum(rows for rows, _ in batches.values()) >= records:
                break
            if stream.query.exception() is not None:
                raise RuntimeError(f"the stream failed: {stream.query.exception()}")
            time.sleep(POLL_S)
        elapsed_s = time.time() - started
    finally:
        stream.stop()
    lake = DeltaLake.from_settings(settings.lake)
    return _figures(lake, settings, args, compactions.passes, batches, started, elapsed_s)


def _figures(
    lake: DeltaLake,
    settings: AppSettings,
    args: argparse.Namespace,
    passes: list[Pass],
    batches: dict[int, tuple[int, float]],
    started: float,
    elapsed_s: float,
) -> dict[str, Any]:
    read = sum(rows for rows, _ in batches.values())
    puts = _puts(lake, settings.stream.name)
    merges = [p for p in passes if not p.settled_all]
    settles = [p for p in passes if p.settled_all]
    merge_rounds = _rounds(merges)
    settle_rounds = _rounds(settles)
    compaction_s = sum(p.seconds for p in passes)
    measured = {
        "records_read": read,
        "seconds": round(elapsed_s, 1),
        "rate": round(read / elapsed_s),
        "batches": len(batches),
        "batch_p50_s": round(statistics.median(d for _, d in batches.values()), 2),
        "settings": {
            "merge_interval_ms": settings.stream.merge_interval_ms,
            "compact_interval_ms": settings.stream.compact_interval_ms,
            "settle_rows": settings.stream.settle_rows,
        },
        "merges": len(merge_rounds),
        "merge_s": [round(sum(p.seconds for p in r), 2) for r in merge_rounds],
        "merge_files": [sum(p.settled_files + p.runs for p in r) for r in merge_rounds],
        "merge_settled_rows": [sum(p.rows for p in r) for r in merge_rounds],
        "settles": len(settle_rounds),
        "settle_s": [round(sum(p.seconds for p in r), 2) for r in settle_rounds],
        "settle_files": [sum(p.settled_files for p in r) for r in settle_rounds],
        "settle_at_s": [round(r[0].at_s - started) for r in settle_rounds],
        "puts": puts,
        "puts_per_million": round((puts["streaming"] + puts["compaction"]) * 1e6 / max(read, 1)),
        "compaction_share": round(compaction_s / elapsed_s, 3),
        "merge_share_of_time_between": _share_of_time_between(merge_rounds),
    }
    return {"measured": measured, "at_defaults": _at_defaults(measured, args)}


def _share_of_time_between(rounds: list[list[Pass]]) -> float:
    """Compaction seconds over the time from one compaction's start to the next's (the last
    one has no next, so it is left out)."""
    if len(rounds) < 2:
        return 0.0
    starts = [r[0].at_s - r[0].seconds for r in rounds]
    spent = sum(p.seconds for r in rounds[:-1] for p in r)
    return round(spent / (starts[-1] - starts[0]), 3)


def _rounds(passes: list[Pass]) -> list[list[Pass]]:
    """The tables' passes grouped by compaction: a compaction does its tables back to back."""
    rounds: list[list[Pass]] = []
    for table_pass in passes:
        if rounds and table_pass.table not in {p.table for p in rounds[-1]}:
            rounds[-1].append(table_pass)
        else:
            rounds.append([table_pass])
    return rounds


def _puts(lake: DeltaLake, stream: str) -> dict[str, int]:
    """Data files and log commits (a PUT each) the stream's batches and compactions wrote."""
    puts = {"streaming": 0, "compaction": 0}
    for spec in ALL_TABLES:
        for log_file in sorted(Path(lake.table_uri(spec), "_delta_log").glob("*.json")):
            actions = [json.loads(line) for line in log_file.read_text().splitlines()]
            apps = {action["txn"]["appId"] for action in actions if "txn" in action}
            written = 1 + sum(1 for action in actions if "add" in action)
            if stream in apps:
                puts["streaming"] += written
            elif compaction_app_id(stream) in apps:
                puts["compaction"] += written
    return puts


def _at_defaults(measured: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The run scaled to the default intervals at `--rate`: batches are the same size (the
    default trigger), a merge sees `speedup` times the records, and a compaction that settles
    everything comes every age limit less a merge interval."""
    rate = args.rate
    merge_interval_s = DEFAULTS.merge_interval_ms / 1000
    cycle_s = (DEFAULTS.compact_interval_ms - DEFAULTS.merge_interval_ms) / 1000
    cycle_records = rate * cycle_s
    streaming_per_million = measured["puts"]["streaming"] * 1e6 / max(measured["records_read"], 1)
    # A merge writes a run per task and table, a file per key worth one (their count follows
    # the tenants, not the interval, as settle_rows is scaled with it) and a commit per table.
    merge_files = statistics.fmean(measured["merge_files"] or [0]) + len(STAGED_TABLES)
    merge_per_million = merge_files * 1e6 / (rate * merge_interval_s)
    # Bound: in 6 h every tenant has rows in every staged table.
    settle_files = args.tenants * len(STAGED_TABLES) + len(STAGED_TABLES)
    settle_per_million = settle_files * 1e6 / cycle_records
    # Per record, a merge costs no more at the defaults (its fixed cost spreads over more).
    merge_share = measured["merge_share_of_time_between"]
    # Settling everything: its files at the measured cost per file, and the rows that waited in
    # runs (the small tenants') at a merge's cost per record.
    per_file_s = sum(measured["settle_s"]) / max(sum(measured["settle_files"]), 1)
    per_record_s = merge_share / rate
    waiting_records = (1 - args.big_share) * cycle_records
    settle_s = per_file_s * settle_files + per_record_s * waiting_records
    return {
        "assumptions": {
            "rate": rate,
            "records_per_merge": round(rate * merge_interval_s),
            "records_per_settle_everything": round(cycle_records),
            "files_per_settle_everything": settle_files,
            "records_waiting_in_runs": round(waiting_records),
        },
        "puts_per_million": {
            "streaming": round(streaming_per_million),
            "merges": round(merge_per_million),
            "settle_everything": round(settle_per_million),
            "total": round(streaming_per_million + merge_per_million + settle_per_million),
        },
        "merge_share_of_interval": round(merge_share, 3),
        "settle_everything_s": round(settle_s),
        "settle_everything_share_of_cycle": round(settle_s / cycle_s, 3),
        "compaction_share": round(merge_share + settle_s / cycle_s, 3),
    }


if __name__ == "__main__":
    raise SystemExit(main())
