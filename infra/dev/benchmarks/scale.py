"""Tenant scaling: read ceiling, Spark's built-in window aggregation and the product, in one run.

    .venv/bin/python -m infra.dev.benchmarks.scale --tenants 10,1000,10000 --records 200000

For each tenant count it preloads one topic on a local broker (fixed seed, the same number and
shape of records; only the tenant ids differ), then runs three queries over it with the same
Spark session, `maxOffsetsPerTrigger` and shuffle partitions:

1. `read`: the Kafka source into `noop`: what reading alone costs;
2. `builtin`: Spark's own `withWatermark` + `window` count per (tenant, source) into `noop`;
3. `product`: `tenant-windows run --available-now` end to end, into a Delta lake.

`peer` (`--stages read,builtin,product,peer`) is quixstreams, the Python library a user would
pick instead, doing the product's job on the same records: tumbling event-time windows per
(tenant, source) with each source's window size and lateness, and every record and every final
window written to Parquet through its own file sink. It runs in a venv of its own
(`quix_peer.py`), in one process or in several of one consumer group (`--peer-processes 1,2`:
the faster is the stage's figures). It has no batches: its records are timed in chunks of
`--max-offsets`, and its steady rate leaves out the first chunk as the other stages leave out
their first batch.

More stages (`--stages read,route,state_empty,state_parquet,windowed,builtin,product`) cut the
product's plan short to show where a batch's time goes, each into `noop` but one: `route` is
reading and routing; `state_empty` adds the shuffle and `applyInPandasWithState` with a state
function that reads its input and returns nothing (Spark's own cost of the stateful stage);
`state_parquet` is `state_empty` whose state function returns its input, every record written
by Spark's own Parquet file sink (what keeping every record after the stateful stage costs by
Spark's own means, with no window computed); `windowed` is the product's plan without its
Delta sink.

It prints a table and writes the figures as JSON: records/s (overall from the query's start,
and steady state, i.e. batches after the first), the ratios the scale issue asks for, batch
latency p50/p95, pane delay in batches after the key's watermark passed the window's end, state
size, peak RSS of the driver and of the Python workers, and for the product:

- the data files and `add` actions each batch's commit put in each table (from the Delta logs);
- the compaction that settles the run's staged rows: its time and the files it wrote;
- object-store PUTs (data files and log commits) per million records, while streaming and with
  the compaction, and at `stream.compact_interval` and the measured rate;
- one tenant's query time before and after that compaction;

and for every stage the test broker's CPU seconds while it ran (`broker_cpu_s`).

Figures of one run are comparable with each other only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import requests
import yaml
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryProgress
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.state import GroupStateTimeout
from pyspark.sql.types import StructType

from infra.dev.benchmarks import quix_peer
from infra.dev.benchmarks.peak_memory import (
    driver_jvm,
    peak_rss,
    python_workers,
    this_process,
)
from infra.dev.benchmarks.sample_lake import (
    PROJECT_CONF,
    bench_settings,
    without_limits,
    write_tenants_conf,
)
from infra.dev.benchmarks.stream_processes import kind_of
from infra.dev.load_generator import LoadSpec, generate, send
from infra.dev.local_process import cpu_seconds, sigterm_as_interrupt
from infra.dev.local_stack import LocalKafka
from storage.lake.delta_lake import DeltaLake, compaction_app_id
from storage.lake.delta_log import checkpoint_batches
from storage.lake.tables import ALL_TABLES, EVENTS, LATE_EVENTS, STAGED, TableSpec
from storage.query.spark_views import register_views
from streaming.app import StreamApp
from streaming.pipeline.spark_session import build_spark, session_master
from streaming.pipeline.stream_plan import read_kafka, windowed_rows
from streaming.records.routing import KAFKA_COLUMNS_SQL, ROUTED_SCHEMA, make_router
from streaming.state.bucket_placement import BUCKET_COLUMN, bucket_expression
from streaming.state.state_layouts import LAYOUTS
from streaming.state.union_rows import PACKED_OUTPUT_SCHEMA
from tenants.api_keys import issue_key
from tenants.conf_reader import load_registry
from tenants.models import SourceConfig
from tenants.settings import AppSettings

QUERY_TIMEOUT_S = 3_600
LAKE_CHECK_FILES = 300_000
"""Above this many files in `events` and `late_events`, the lake's checks count rows per key
from the log instead of reading every file."""


@dataclass
class StageFigures:
    stage: str
    tenants: int
    records: int
    seconds: float
    batches: int
    overall_rate: float
    steady_rate: float
    batch_p50_s: float
    batch_p95_s: float
    driver_peak_mib: float
    workers_peak_mib: float
    state_rows: int | None = None
    state_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tw-scale-"))
    lakes = (
        Path(tempfile.mkdtemp(prefix="tw-scale-", dir=args.lake_dir)) if args.lake_dir else workdir
    )
    try:
        # SIGTERM stops the broker and streams started here, as Ctrl-C does.
        with sigterm_as_interrupt(), LocalKafka(workdir / "kafka") as kafka:
            # The JIT the stream runs with (`run_stream`), so that its rates are the product's.
            spark = build_spark(
                "tenant-windows-scale", args.master, shuffle_partitions=4, quick_jit=True
            )
            try:
                results = run(spark, kafka, lakes, args)
            finally:
                spark.stop()
    finally:
        if args.keep_workdir:
            print(f"lakes and checkpoints kept in {lakes}, topics in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
            shutil.rmtree(lakes, ignore_errors=True)
    print(_report(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "machine": _machine(session_master(args.master)),
                "results": [asdict(r) for r in results],
                "steady_ratios": steady_ratios(results),
            },
            indent=2,
        )
    )
    print(f"figures written to {args.json}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", default="10,1000,10000", help="comma-separated counts")
    parser.add_argument("--sources", type=int, default=2, choices=[1, 2])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--max-offsets", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--jitter", default="5s", help="out-of-orderness of event times")
    parser.add_argument("--late-share", type=float, default=0.02)
    parser.add_argument("--stages", default="read,builtin,product")
    parser.add_argument(
        "--state-buckets", type=int, default=None, help="stream.state_buckets (app.yaml's if unset)"
    )
    parser.add_argument(
        "--master",
        default=None,
        help="the Spark master of every stage (default: the stream's, local[N] with two task "
        "slots a core), e.g. local[2] for a baseline",
    )
    parser.add_argument(
        "--peer-processes",
        # One by default: on two cores shared with the broker, two processes of one group ran
        # the peer 30-40 % slower, and quixstreams fails a run whose group rebalances while a
        # process commits ("Specified group generation id is not valid").
        default="1",
        help="process counts of one consumer group the peer runs in, e.g. 1,2; the faster is "
        "reported",
    )
    parser.add_argument("--json", type=Path, default=Path("data/bench/scale.json"))
    parser.add_argument(
        "--lake-dir",
        type=Path,
        default=None,
        help="where the lakes and checkpoints go (default: TMPDIR, with the broker's data). A "
        "million tenants write millions of files, more than a tmpfs has inodes for: a disk's "
        "folder here, and the broker's data on a tmpfs as TMPDIR",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        type=_setting,
        default=[],
        metavar="FIELD=VALUE",
        help="a setting of every stage's stream by dotted name, its value read as YAML, e.g. "
        "kafka.mirror_offsets=false (repeatable)",
    )
    parser.add_argument(
        "--keep-workdir",
        action="store_true",
        help="leave the lakes behind, to query them after the run (a million tenants: 10M files)",
    )
    return parser


def _setting(text: str) -> tuple[str, Any]:
    field_name, equals, value = text.partition("=")
    if not equals or not field_name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIELD=VALUE")
    return field_name, yaml.safe_load(value)


def run(
    spark: SparkSession, kafka: LocalKafka, workdir: Path, args: argparse.Namespace
) -> list[StageFigures]:
    """Every stage for every tenant count, in `spark`, over topics preloaded into `kafka`."""
    results = []
    assert kafka.pid is not None  # started by `main`
    for number, tenants in enumerate(int(n) for n in args.tenants.split(",")):
        dataset = _Dataset.create(kafka, workdir / f"t{tenants}", tenants, args)
        if number == 0:
            _warm_up(spark, dataset)
        for stage in args.stages.split(","):
            broker_cpu_s = cpu_seconds(kafka.pid)
            figures = _STAGES[stage](spark, dataset)
            # The test broker rewrites its whole store at every offset commit, which a Kafka
            # broker does not: the stages that commit offsets (the product's offsets mirror,
            # the peer) pay it on the same cores, the others do not.
            figures.extra["broker_cpu_s"] = round(cpu_seconds(kafka.pid) - broker_cpu_s, 2)
            results.append(figures)
            print(_row(figures), flush=True)
        # The next tenant count's stages pay only for their own topic: the test broker's work
        # at every offset commit grows with the records it holds.
        kafka.delete_records(dataset.settings.kafka.topic)
    return results


def _warm_up(spark: SparkSession, dataset: _Dataset) -> None:
    """The stateful plan once over the first topic, its figures thrown away: the first stage
    measured would otherwise run on a cold JVM and cold Python workers (one of its batches took
    8 s where the next ones took 2), which makes any stage measured after it look faster."""
    started = time.monotonic()
    _STAGES["state_empty"](spark, replace(dataset, workdir=dataset.workdir / "warm-up"))
    print(f"warm-up (not counted): {time.monotonic() - started:.1f} s", flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    return _parser().parse_args(argv)


@dataclass
class _Dataset:
    tenants: int
    records: int
    settings: AppSettings
    workdir: Path
    sources: Mapping[str, SourceConfig]
    peer_processes: tuple[int, ...] = (1,)

    @classmethod
    def create(cls, kafka: LocalKafka, workdir: Path, tenants: int, args: Any) -> _Dataset:
        topic = f"scale-{tenants}"
        kafka.create_topic(topic, args.partitions)
        conf = workdir / "conf"
        tenant_ids = tuple(f"t{n:06d}" for n in range(tenants))
        sources = ("web", "billing")[: args.sources]
        write_tenants_conf(conf, tenant_ids, sources, listed=True)
        registry = load_registry(conf)
        spec = LoadSpec(
            tenants=tenant_ids,
            sources=sources,
            count=args.records,
            jitter=args.jitter,
            late_share=args.late_share,
            malformed_share=0.0,
            seed=20261123,
            # Midday, not the generator's midnight: jitter and late records would put every key
            # in two window dates, so compaction would write two files per key where a real
            # interval (all but one a day) writes one.
            start_ms=LoadSpec().start_ms + 12 * 3_600_000,
        )
        started = time.monotonic()
        sent = send(
            generate(spec, {n: s.event_time for n, s in registry.sources.items()}),
            kafka.bootstrap_servers,
            topic,
            timeout_s=1_800,
        )
        print(f"{tenants} tenants: produced {sent} records in {time.monotonic() - started:.0f}s")
        overrides: dict[str, Any] = {"kafka.max_offsets_per_trigger": args.max_offsets}
        if args.state_buckets is not None:
            overrides["stream.state_buckets"] = args.state_buckets
        overrides.update(args.settings)
        settings = bench_settings(
            conf, kafka.bootstrap_servers, topic, workdir, f"scale-{tenants}", overrides
        )
        settings = without_limits(settings)
        peer_processes = tuple(int(n) for n in args.peer_processes.split(","))
        used = {name: registry.sources[name] for name in sources}
        return cls(tenants, sent, settings, workdir, used, peer_processes)


# --- the three stages --------------------------------------------------------------------------


def _read_stage(spark: SparkSession, dataset: _Dataset) -> StageFigures:
    frame = read_kafka(spark, dataset.settings)
    return _measure(
        "read",
        dataset,
        lambda: (
            frame.writeStream.format("noop")
            .option("checkpointLocation", str(dataset.workdir / "cp-read"))
            .trigger(availableNow=True)
            .start()
        ),
    )


def _builtin_stage(spark: SparkSession, dataset: _Dataset) -> StageFigures:
    value = "CAST(value AS STRING)"
    frame = read_kafka(spark, dataset.settings).selectExpr(
        f"get_json_object({value}, '$.tenant') AS tenant",
        f"get_json_object({value}, '$.source') AS source",
        # web carries an ISO time in `ts`, billing epoch milliseconds in `meta.event_ms`.
        f"coalesce(to_timestamp(get_json_object({value}, '$.ts')), "
        f"timestamp_millis(CAST(get_json_object({value}, '$.meta.event_ms') AS BIGINT))) "
        "AS event_time",
    )
    counts = (
        frame.withWatermark("event_time", "10 seconds")
        .groupBy("tenant", "source", F.window("event_time", "1 minute"))
        .count()
    )
    return _measure(
        "builtin",
        dataset,
        lambda: (
            counts.writeStream.format("noop")
            .outputMode("append")
            .option("checkpointLocation", str(dataset.workdir / "cp-builtin"))
            .trigger(availableNow=True)
            .start()
        ),
    )


def _product_stage(spark: SparkSession, dataset: _Dataset) -> StageFigures:
    app = StreamApp(dataset.settings)
    figures = _measure("product", dataset, lambda: app.start(spark, available_now=True).query)
    # The batches' figures before the final settle, which may fail where the batches did not
    # (a million keys' folders on a tmpfs ran out of inodes).
    print("product, the batches:", _row(figures), flush=True)
    lake = DeltaLake.from_settings(dataset.settings.lake)
    try:
        streamed = _log_writes(lake, dataset.settings.stream.name)
        figures.extra["one_tenant_query_s"] = _one_tenant_query_s(spark, lake, "t000000")
        served = _ServedQuery(dataset.settings, "t000000")
        try:
            started = time.monotonic()
            with peak_rss(_PROCESSES) as settle_peaks:
                app.compact_now(spark)  # as `run --available-now` does at its end
            compaction_s = time.monotonic() - started
            figures.extra["settle_peak_mib"] = {k: round(v) for k, v in settle_peaks.items()}
            figures.extra.update(served.after_compaction())
        finally:
            served.stop()
    finally:
        app.stop()
    compacted = _log_writes(lake, dataset.settings.stream.name)
    figures.extra["one_tenant_query_compacted_s"] = _one_tenant_query_s(spark, lake, "t000000")
    figures.extra["one_tenant_sql_cli_compacted_s"] = _one_tenant_sql_cli_s(
        dataset.settings, "t000000"
    )
    figures.extra.update(
        _write_figures(streamed, compacted, figures, dataset.settings.stream.compact_interval_ms)
    )
    figures.extra["compaction_s"] = round(compaction_s, 1)
    # `run --available-now` as a user runs it: its batches, then the final settle.
    figures.extra["whole_run_rate"] = round(figures.records / (figures.seconds + compaction_s))
    # What the run measured, before the checks below read every table (at a million tenants,
    # minutes): a check that fails must not take the figures with it.
    print(_row(figures), json.dumps(figures.extra), file=sys.stderr, flush=True)
    counts = {spec.name: _counts_from_log(lake, spec) for spec in (EVENTS, LATE_EVENTS)}
    if sum(files for _, files, _ in counts.values()) > LAKE_CHECK_FILES:
        # Reading a million files' rows held 22 GB: count each key's rows from the log's
        # statistics of its settled files instead (one per key and table at that scale).
        figures.extra["files_per_table"] = {name: files for name, (_, files, _) in counts.items()}
        figures.extra["staged_files_left"] = sum(staged for _, _, staged in counts.values())
        held = pa.concat_tables([rows for rows, _, _ in counts.values()])
        held = held.group_by(["tenant", "source"]).aggregate([("n", "sum")])
        figures.extra["records_once"] = _per_key_counts(
            held.rename_columns(["tenant", "source", "n"]), dataset, None
        )
        keys = held.num_rows
    else:
        tables = _lake_views(lake)
        figures.extra["files_per_table"] = tables.files
        figures.extra["pane_delay_batches"] = _pane_delay(tables.database)
        figures.extra["records_once"] = _every_record_once(tables.database, dataset)
        counted = tables.database.execute(
            "SELECT count(*) FROM (SELECT DISTINCT tenant, source FROM tenant_status)"
        ).fetchall()[0]
        keys = int(counted[0])
    figures.extra["keys"] = keys
    if figures.state_bytes is not None and keys:
        figures.extra["state_bytes_per_key"] = round(figures.state_bytes / keys)
    return figures


@dataclass
class _LakeViews:
    database: Any
    """A DuckDB connection with a view per table of the lake."""
    files: dict[str, int]
    """Each table's file count."""


def _lake_views(lake: DeltaLake) -> _LakeViews:
    """The lake's tables as DuckDB views of their current files. DuckDB reads the files itself:
    through a pyarrow dataset, which keeps each file's footer, 100,000 tenants (200,000 files)
    held 23 GB and swapped the machine, and a million tenants' `windows` read into pandas
    passed 11 GB."""
    import duckdb

    database = duckdb.connect()
    files = {}
    for spec in ALL_TABLES:
        uris = lake.open(spec).file_uris()
        files[spec.name] = len(uris)
        relation = (
            database.read_parquet(uris, union_by_name=True, hive_partitioning=False)
            if uris
            else database.from_arrow(spec.schema.empty_table())
        )
        relation.create_view(spec.name)
    return _LakeViews(database, files)


def _every_record_once(database: Any, dataset: _Dataset) -> dict[str, int | None]:
    """Every produced record in `events` or `late_events` exactly once: per (tenant, source),
    the rows the tables hold against the records the generator sent that key (round-robin over
    the keys), and no record id (partition, offset) twice. Column-wise, in DuckDB: a million
    keys are a million rows, not a Python loop."""
    held = database.sql(
        "SELECT tenant, source, count(*) AS n "
        'FROM (SELECT tenant, source, partition, "offset" FROM events '
        'UNION ALL SELECT tenant, source, partition, "offset" FROM late_events) '
        "GROUP BY tenant, source"
    ).to_arrow_table()
    distinct = database.execute(
        'SELECT count(*) FROM (SELECT DISTINCT partition, "offset" FROM events '
        'UNION SELECT DISTINCT partition, "offset" FROM late_events)'
    ).fetchall()[0]
    return _per_key_counts(held, dataset, int(distinct[0]))


def _per_key_counts(
    held: pa.Table, dataset: _Dataset, distinct_records: int | None
) -> dict[str, int | None]:
    """`held` (rows per tenant and source, column `n`) against the records the generator sent
    each key (round-robin over the keys); `distinct_records`: the distinct record ids (partition,
    offset) the tables hold, None where not read."""
    tenants = dataset.tenants
    sources = list(dataset.sources)
    keys = tenants * len(sources)
    tenant_index = pc.cast(pc.utf8_slice_codeunits(held["tenant"], 1), pa.int64()).to_numpy()
    source_index = pd.Categorical(held["source"].to_pandas(), categories=sources).codes
    key_index = tenant_index * len(sources) + source_index
    expected = dataset.records // keys + (key_index < dataset.records % keys)
    counts = held["n"].to_numpy()
    total = int(counts.sum())
    return {
        "keys_expected": keys,
        "keys_held": held.num_rows,
        "keys_with_other_counts": int((counts != expected).sum()),
        "rows": total,
        "records_produced": dataset.records,
        "duplicate_rows": None if distinct_records is None else total - distinct_records,
    }


def _counts_from_log(lake: DeltaLake, spec: TableSpec) -> tuple[pa.Table, int, int]:
    """Per (tenant, source) of `spec`'s settled files at the newest version, their rows (`n`)
    as the log's statistics count them; the table's file count; its staged files' count. Read
    from the newest checkpoint's columns and the commits after it."""
    delta_log = lake.log(spec)
    checkpoint = delta_log.checkpointed_version()
    if checkpoint is None:
        raise RuntimeError(f"{spec.name}: a checkpoint this benchmark cannot read")
    fields = ("path", "partitionValues", "stats")
    adds_type = pa.struct(
        [("path", pa.string()), ("partitionValues", pa.map_(pa.string(), pa.string())),
         ("stats", pa.string())]
    )  # fmt: skip
    adds = pa.array([], adds_type)
    if checkpoint >= 0:
        columns = [f"add.{name}" for name in fields]
        batches = checkpoint_batches(delta_log.open_checkpoint(checkpoint), columns)
        read = pa.Table.from_batches(list(batches))
        adds = pc.drop_null(read.column("add")).combine_chunks()
    live: dict[str, dict[str, Any]] = {}
    removed: set[str] = set()
    version = checkpoint + 1
    while (actions := delta_log.actions(version)) is not None:
        for action in actions:
            if (file := action.get("remove")) is not None:
                removed.add(file["path"])
                live.pop(file["path"], None)
            elif (file := action.get("add")) is not None:
                values = list((file.get("partitionValues") or {}).items())
                live[file["path"]] = {"path": file["path"], "partitionValues": values,
                                      "stats": file.get("stats")}  # fmt: skip
        version += 1
    adds = pa.concat_arrays([adds, pa.array(list(live.values()), adds.type)])
    gone = pc.is_in(pc.struct_field(adds, "path"), pa.array(list(removed), pa.string()))
    adds = adds.filter(pc.invert(gone))
    partition_values = pc.struct_field(adds, "partitionValues")
    tenants = pc.map_lookup(partition_values, "layout_tenant", "first")
    numbers = pc.extract_regex(pc.struct_field(adds, "stats"), r'"numRecords":(?P<n>\d+)')
    rows = pa.table(
        {
            "tenant": tenants,
            "source": pc.map_lookup(partition_values, "layout_source", "first"),
            "n": pc.cast(pc.struct_field(numbers, "n"), pa.int64()),
        }
    )
    staged = pc.fill_null(pc.equal(tenants, STAGED), False)
    staged_files = int(pc.sum(pc.cast(staged, pa.int64())).as_py() or 0)
    return rows.filter(pc.invert(staged)), len(adds), staged_files


def _peer_stage(_spark: SparkSession, dataset: _Dataset) -> StageFigures:
    """quixstreams doing the product's job over the same topic (see `quix_peer.py`), in each
    of `--peer-processes` processes of one consumer group; the faster's figures are the stage's
    (by steady rate), every count's in `extra`."""
    kafka = dataset.settings.kafka
    chunk = kafka.max_offsets_per_trigger or dataset.records
    runs = []
    for processes in dataset.peer_processes:
        run = quix_peer.run_peer(
            kafka.bootstrap_servers,
            kafka.topic,
            dataset.records,
            chunk,
            dataset.sources,
            dataset.workdir / f"peer-{processes}",
            timeout_s=QUERY_TIMEOUT_S,
            processes=processes,
        )
        if run.records != dataset.records or run.parquet_records != dataset.records:
            raise RuntimeError(
                f"the peer in {processes} processes windowed {run.records} and wrote "
                f"{run.parquet_records} of {dataset.records} records"
            )
        runs.append(run)
    steady = {run.processes: quix_peer.steady_rate(run, chunk) for run in runs}
    run = max(runs, key=lambda r: steady[r.processes])
    durations = quix_peer.chunk_seconds(run)
    return StageFigures(
        stage="peer",
        tenants=dataset.tenants,
        records=run.records,
        seconds=round(run.seconds, 1),
        batches=len(durations),
        overall_rate=round(run.records / run.seconds),
        steady_rate=round(steady[run.processes]),
        batch_p50_s=round(statistics.median(durations), 2) if durations else 0,
        batch_p95_s=round(_percentile(durations, 0.95), 2) if durations else 0,
        # No workers: the processes' summed peak RSS goes in the driver's column.
        driver_peak_mib=round(run.peak_mib),
        workers_peak_mib=0,
        extra={
            "library": quix_peer.PEER_REQUIREMENT,
            "processes": run.processes,
            "by_processes": {
                other.processes: {
                    "steady_rate": round(steady[other.processes]),
                    "overall_rate": round(other.records / other.seconds),
                    "seconds": round(other.seconds, 1),
                }
                for other in runs
            },
            "parquet_records": run.parquet_records,
            "late_dropped": run.late_dropped,
            "windows_emitted": run.windows_emitted,
            # Before its first chunk: the Application made, its topic looked up and its
            # changelog topics created (`start_s`); then it joins its group (in the first chunk).
            "start_s": round(run.run_started_s, 2),
            "close_s": round(run.close_s, 2) if run.close_s is not None else None,
        },
    )


def _plan_stage(stage: str) -> Callable[[SparkSession, _Dataset], StageFigures]:
    """A prefix of the product's plan into `noop`, or for `state_parquet` into Spark's Parquet
    file sink (see the module's docstring)."""

    def measure(spark: SparkSession, dataset: _Dataset) -> StageFigures:
        app = StreamApp(dataset.settings)
        app.watcher.publish_at_start(0)  # what `run` does first: executors read this snapshot
        settings = dataset.settings
        app.check()  # settles the state buckets, as `run` does
        identity = app.identity
        assert identity.state_buckets is not None
        kafka = read_kafka(spark, settings)
        if stage == "windowed":
            frame = windowed_rows(kafka, app.snapshots, settings, identity)
        else:
            frame = kafka.selectExpr(*KAFKA_COLUMNS_SQL).mapInArrow(
                make_router(app.snapshots, settings.stream.max_record_bytes), ROUTED_SCHEMA
            )
        stateful = _STATE_FUNCTIONS.get(stage)
        if stateful is not None:
            function, schema = stateful
            frame = (
                frame.selectExpr(
                    "*", bucket_expression(identity.state_buckets, identity.balanced_for_tasks)
                )
                .groupBy(BUCKET_COLUMN)
                .applyInPandasWithState(
                    function,
                    schema,
                    LAYOUTS[identity.state_layout].schema,
                    "append",
                    GroupStateTimeout.NoTimeout,
                )
            )
        writer = frame.writeStream.option(
            "checkpointLocation", str(dataset.workdir / f"cp-{stage}")
        ).trigger(availableNow=True)
        output = str(dataset.workdir / stage)
        keeps_records = stage == "state_parquet"
        if keeps_records:
            writer = writer.format("parquet").option("path", output)
        else:
            writer = writer.format("noop")
        figures = _measure(stage, dataset, writer.start)
        if keeps_records:
            figures.extra["records_written"] = spark.read.parquet(output).count()
        return figures

    return measure


def _nothing(_bucket: Any, frames: Iterator[pd.DataFrame], _state: Any) -> Iterator[pd.DataFrame]:
    for _ in frames:
        pass
    yield pd.DataFrame({name: [] for name in PACKED_OUTPUT_SCHEMA.fieldNames()})


def _records(_bucket: Any, frames: Iterator[pd.DataFrame], _state: Any) -> Iterator[pd.DataFrame]:
    for frame in frames:
        yield frame[ROUTED_SCHEMA.fieldNames()]


_STATE_FUNCTIONS: dict[str, tuple[Callable[..., Iterator[pd.DataFrame]], StructType]] = {
    "state_empty": (_nothing, PACKED_OUTPUT_SCHEMA),
    "state_parquet": (_records, ROUTED_SCHEMA),
}
"""The stages that end in `applyInPandasWithState`: their state function and its output's schema."""

_STAGES: dict[str, Callable[[SparkSession, _Dataset], StageFigures]] = {
    "read": _read_stage,
    "route": _plan_stage("route"),
    "state_empty": _plan_stage("state_empty"),
    "state_parquet": _plan_stage("state_parquet"),
    "windowed": _plan_stage("windowed"),
    "builtin": _builtin_stage,
    "product": _product_stage,
    "peer": _peer_stage,
}


# --- measuring ---------------------------------------------------------------------------------

_PROCESSES = {"driver": this_process, "jvm": driver_jvm, "workers": python_workers}


def _measure(stage: str, dataset: _Dataset, start: Callable[[], StreamingQuery]) -> StageFigures:
    with peak_rss(_PROCESSES) as peaks:
        started = time.monotonic()
        query = start()
        if not query.awaitTermination(timeout=QUERY_TIMEOUT_S):
            query.stop()
            raise TimeoutError(f"{stage} did not finish within {QUERY_TIMEOUT_S}s")
        seconds = time.monotonic() - started
    if query.exception() is not None:
        raise RuntimeError(f"{stage} failed: {query.exception()}")
    progress = [p for p in query.recentProgress if int(p["numInputRows"]) > 0]
    durations = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    rows = [int(p["numInputRows"]) for p in progress]
    steady_rows, steady_s = sum(rows[1:]), sum(durations[1:])
    state = (progress[-1].get("stateOperators") or [{}])[0] if progress else {}
    return StageFigures(
        stage=stage,
        tenants=dataset.tenants,
        records=sum(rows),
        seconds=round(seconds, 1),
        batches=len(progress),
        overall_rate=round(sum(rows) / seconds),
        steady_rate=round(steady_rows / steady_s) if steady_s else 0,
        batch_p50_s=round(statistics.median(durations), 2) if durations else 0,
        batch_p95_s=round(_percentile(durations, 0.95), 2) if durations else 0,
        driver_peak_mib=round(peaks["driver"]),
        workers_peak_mib=round(peaks["workers"]),
        state_rows=state.get("numRowsTotal"),
        state_bytes=state.get("memoryUsedBytes"),
        extra={"jvm_peak_mib": round(peaks["jvm"]), "batch_phases_ms": _phases_ms(progress[1:])},
    )


def _phases_ms(progress: list[StreamingQueryProgress]) -> dict[str, float]:
    """Per phase of Spark's `durationMs` (`addBatch`: the plan and the sink; `walCommit`,
    `commitOffsets`: the checkpoint's logs; ...), its median over `progress`: where a steady
    batch's time goes."""
    phases = sorted({phase for p in progress for phase in p["durationMs"]})
    return {
        phase: statistics.median(p["durationMs"].get(phase, 0) for p in progress)
        for phase in phases
    }


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _pane_delay(database: Any) -> dict[str, float]:
    """Batches between the one in which a key's W passed a window's end and its ON_TIME pane."""
    found = database.execute(
        """
        WITH on_time AS (
            SELECT tenant, source, window_start, window_end, batch_id FROM windows
            WHERE timing = 'ON_TIME' AND pane_index = 0
        ), passed AS (
            SELECT o.tenant, o.source, o.window_start, min(s.batch_id) AS first_passed
            FROM on_time o JOIN tenant_status s ON o.tenant = s.tenant AND o.source = s.source
            WHERE s.watermark >= o.window_end
            GROUP BY o.tenant, o.source, o.window_start
        )
        SELECT median(o.batch_id - p.first_passed), max(o.batch_id - p.first_passed), count(*)
        FROM on_time o JOIN passed p USING (tenant, source, window_start)
        """
    ).fetchall()[0]
    if not found[2]:
        return {}
    return {"p50": float(found[0]), "max": float(found[1]), "panes": int(found[2])}


@dataclass(frozen=True)
class _LogWrites:
    """What the tables' Delta logs say was written: per batch commit, and by compaction."""

    adds_per_batch: dict[str, list[int]]
    """Per table, the `add` actions of each of the stream's batch commits."""
    compaction_adds: int
    commits: int
    """Log files (one PUT each) of the stream's batch and compaction commits."""


def _log_writes(lake: DeltaLake, stream: str) -> _LogWrites:
    adds_per_batch: dict[str, list[int]] = {}
    compaction_adds = commits = 0
    for spec in ALL_TABLES:
        adds_per_batch[spec.name] = []
        for log_file in sorted(Path(lake.table_uri(spec), "_delta_log").glob("*.json")):
            actions = [json.loads(line) for line in log_file.read_text().splitlines()]
            apps = {action["txn"]["appId"] for action in actions if "txn" in action}
            adds = sum(1 for action in actions if "add" in action)
            if stream in apps:
                adds_per_batch[spec.name].append(adds)
                commits += 1
            elif compaction_app_id(stream) in apps:
                compaction_adds += adds
                commits += 1
    return _LogWrites(adds_per_batch, compaction_adds, commits)


def _write_figures(
    streamed: _LogWrites, compacted: _LogWrites, figures: StageFigures, interval_ms: int
) -> dict[str, Any]:
    """Files per batch, and PUTs per million records: while streaming, with one compaction of
    the run, and at `interval_ms` between compactions at this run's steady rate."""
    per_batch = {
        table: {"max": max(adds, default=0), "mean": round(statistics.fmean(adds or [0]), 1)}
        for table, adds in streamed.adds_per_batch.items()
    }
    batch_puts = sum(map(sum, streamed.adds_per_batch.values())) + streamed.commits
    compaction_puts = compacted.compaction_adds + (compacted.commits - streamed.commits)
    records = max(figures.records, 1)
    interval_records = figures.steady_rate * interval_ms / 1000
    return {
        "adds_per_batch": per_batch,
        "compaction_files": compacted.compaction_adds,
        "puts_per_million_streaming": round(batch_puts * 1e6 / records),
        "puts_per_million_with_one_compaction": round(
            (batch_puts + compaction_puts) * 1e6 / records
        ),
        # A compaction writes one file per partition its interval touched: about as many as
        # this run's compaction, when every tenant is active in both.
        "puts_per_million_at_compact_interval": round(
            batch_puts * 1e6 / records
            + (compaction_puts * 1e6 / interval_records if interval_records else 0)
        ),
    }


def _one_tenant_query_s(spark: SparkSession, lake: DeltaLake, tenant: str) -> float:
    """The statement on Spark's views, in this session: what the query service's Spark path
    pays to open the tables at their current version."""
    started = time.monotonic()
    register_views(spark, lake, tenant)
    spark.sql("SELECT count(*) FROM events").collect()
    return round(time.monotonic() - started, 2)


class _ServedQuery:
    """One tenant's statement on a warm query service, `tenant-windows serve` as a user runs it
    beside the stream (its own process, tables followed in a thread, defaults), asked before a
    compaction and just after it. Started detached (its parent exits at once): it is no
    descendant of this process, so its memory is not counted as the stream's driver's."""

    STATEMENT = "SELECT count(*) AS n FROM events"

    def __init__(self, settings: AppSettings, tenant: str) -> None:
        self.key = issue_key(settings.conf_dir, tenant)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        command = shlex.join([
            sys.executable, "-m", "infra.cli", "serve", "--port", str(port),
            "--conf", str(settings.conf_dir), "--lake-root", settings.lake.root,
        ])  # fmt: skip
        log_file = shlex.quote(str(settings.conf_dir.parent / "serve.log"))
        launched = subprocess.run(
            ["bash", "-c", f"{command} > {log_file} 2>&1 & echo $!"],
            cwd=PROJECT_CONF.parent,
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
        self.pid = int(launched.stdout.strip())
        deadline = time.monotonic() + 300
        while not self._healthy():
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"serve did not start; see {log_file}")
            time.sleep(0.5)
        started = time.monotonic()
        self.before = self._ask()
        self.open_s = time.monotonic() - started

    def after_compaction(self) -> dict[str, Any]:
        try:
            started = time.monotonic()
            after = self._ask()
            served_s = time.monotonic() - started
            peak_mib = _serve_peak_mib(self.pid)
        finally:
            self.stop()
        if after != self.before:
            raise RuntimeError(f"the compaction changed the tenant's rows: {self.before} {after}")
        # To the microsecond: a warm answer from rows kept in memory takes well under 1 ms, and
        # rounded to the millisecond it read as 0, as if it had not been timed.
        return {
            "one_tenant_served_open_s": round(self.open_s, 6),
            "one_tenant_served_compacted_s": round(served_s, 6),
            "serve_peak_mib": peak_mib,
        }

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while Path(f"/proc/{self.pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            return requests.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def _ask(self) -> Any:
        answer = requests.post(
            f"{self.url}/v1/query",
            json={"sql": self.STATEMENT},
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=QUERY_TIMEOUT_S,
        )
        answer.raise_for_status()
        return answer.json()["rows"]


def _serve_peak_mib(pid: int) -> dict[str, int]:
    """The peak resident memory (VmHWM) of `serve`'s Python and of its JVM, in MiB."""
    children = [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and _parent_of(int(entry.name)) == pid
    ]
    jvms = [child for child in children if kind_of(child, pid) == "jvm"]
    return {"python": _vm_hwm_mib(pid), "jvm": sum(map(_vm_hwm_mib, jvms))}


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _vm_hwm_mib(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    kib = next((line.split()[1] for line in status.splitlines() if line.startswith("VmHWM")), "0")
    return round(int(kib) / 1024)


def _one_tenant_sql_cli_s(settings: AppSettings, tenant: str) -> float:
    """The same statement as a user types it, `tenant-windows sql --tenant`, timed as a whole
    process: start, the tenant's config, the tables' logs and the in-process answer."""
    command = [
        sys.executable, "-m", "infra.cli", "sql", "--tenant", tenant,
        "SELECT count(*) AS n FROM events",
        "--conf", str(settings.conf_dir), "--lake-root", settings.lake.root,
    ]  # fmt: skip
    started = time.monotonic()
    subprocess.run(command, cwd=PROJECT_CONF.parent, check=True, capture_output=True, timeout=600)
    return round(time.monotonic() - started, 2)


# --- reporting ---------------------------------------------------------------------------------

_HEADER = (
    f"{'stage':<8} {'tenants':>8} {'records':>8} {'s':>6} {'batches':>7} {'rec/s':>8} "
    f"{'steady':>8} {'p50 s':>6} {'p95 s':>6} {'drv MiB':>7} {'wrk MiB':>7} {'state B':>10}"
)


def _row(f: StageFigures) -> str:
    return (
        f"{f.stage:<8} {f.tenants:>8} {f.records:>8} {f.seconds:>6.1f} {f.batches:>7} "
        f"{f.overall_rate:>8,} {f.steady_rate:>8,} {f.batch_p50_s:>6.2f} {f.batch_p95_s:>6.2f} "
        f"{f.driver_peak_mib:>7.0f} {f.workers_peak_mib:>7.0f} {f.state_bytes or 0:>10,}"
    )


def steady_ratios(results: list[StageFigures]) -> dict[int, dict[str, float]]:
    """Per tenant count, the product's steady rate over each other stage's (`product/peer` is
    issue 37's), and over the product's at the smallest tenant count."""
    by = {(f.stage, f.tenants): f for f in results}
    tenant_counts = sorted({f.tenants for f in results})
    ratios: dict[int, dict[str, float]] = {}
    for tenants in tenant_counts:
        product = by.get(("product", tenants))
        if product is None:
            continue
        ratios[tenants] = {}
        for stage in ("read", "state_empty", "builtin", "peer"):
            other = by.get((stage, tenants))
            if other is not None and other.steady_rate:
                ratios[tenants][f"product/{stage}"] = round(
                    product.steady_rate / other.steady_rate, 2
                )
        peer = by.get(("peer", tenants))
        whole_run = product.extra.get("whole_run_rate", product.overall_rate)
        if peer is not None and peer.overall_rate:
            # The whole run: start-up and, for the product, the final settle; for the peer its
            # sinks' last writes.
            ratios[tenants]["product/peer, whole run"] = round(whole_run / peer.overall_rate, 2)
        base_whole = by.get(("product", tenant_counts[0]))
        if base_whole is not None and tenants != tenant_counts[0]:
            base_rate = base_whole.extra.get("whole_run_rate", base_whole.overall_rate)
            ratios[tenants][f"whole run/whole run at {tenant_counts[0]} tenants"] = round(
                whole_run / base_rate, 2
            )
        base = by.get(("product", tenant_counts[0]))
        if base is not None and base.steady_rate and tenants != tenant_counts[0]:
            ratios[tenants][f"product/product at {tenant_counts[0]} tenants"] = round(
                product.steady_rate / base.steady_rate, 2
            )
    return ratios


def _report(results: list[StageFigures]) -> str:
    lines = ["", _HEADER, *(_row(f) for f in results), ""]
    by = {(f.stage, f.tenants): f for f in results}
    for tenants, ratios in steady_ratios(results).items():
        described = ", ".join(f"{name} {ratio:.2f}" for name, ratio in ratios.items())
        lines.append(f"{tenants} tenants: {described}; {json.dumps(by['product', tenants].extra)}")
    return "\n".join(lines)


def _machine(master: str | None) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "spark_master": master,
        "load_average": os.getloadavg(),
        "when": pd.Timestamp.now(tz="UTC").isoformat(),
    }


if __name__ == "__main__":
    raise SystemExit(main())
