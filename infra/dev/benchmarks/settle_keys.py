"""The settle of many keys on its own: its time and the driver's peak memory, on synthetic staged
files, without a broker or a stream.

    .venv/bin/python -m infra.dev.benchmarks.settle_keys --keys 10000,100000 --records-per-key 2

For each key count it writes a lake as a run's batches leave it: `--batches` micro-batches, each
committing one staged file per write task (`--tasks`) to `events` and `windows`, every key
(one source per tenant) with `--records-per-key` events spread over the batches and one window
pane per event. Then it settles everything, as the end of `run --available-now` does
(`Compaction.run` with no timestamp), and prints: its time, the CPU seconds each kind of process
spent in it (the driver, its JVM, the Python workers: `stream_processes.ProcessTree`), the
files and commits it added, and the peak resident memory of the driver (this Python process
plus its JVM) during the settle, sampled every 0.2 s.
It checks that each table holds each row once after the settle.

The lake goes under `TMPDIR`: `TMPDIR=/dev/shm` leaves the disk's own cost per file (its
folders and inodes) out of the figures.

`--slice-files` is `stream.settle_slice_files`. Run it from another checkout (`PYTHONPATH`) to
compare with a release that settles in one commit; `--slice-files 0` leaves the setting out.
Figures of one run on one machine, comparable with each other only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from infra.dev.benchmarks.figures_file import write_figures
from infra.dev.benchmarks.peak_memory import driver_and_jvm, driver_jvm, peak_rss, this_process
from infra.dev.benchmarks.stream_processes import ProcessTree
from storage.lake.delta_lake import DeltaLake
from storage.lake.file_names import BatchFiles
from storage.lake.file_writer import write_batch_rows
from storage.lake.tables import EVENTS, METRICS, WINDOWS
from storage.lake.writer_lease import WriterLease
from storage.lake.written_files import WrittenFile
from storage.upkeep.compaction import Compaction
from streaming.pipeline.spark_session import build_spark
from streaming.state.union_rows import union_table

STREAM = "settle-bench"
T0_MS = 1_795_000_000_000  # midday, so a key's windows fall in one date
TABLES = (EVENTS, WINDOWS)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spark = build_spark("tenant-windows-settle-keys", shuffle_partitions=args.tasks)
    results = []
    try:
        for keys in (int(n) for n in args.keys.split(",")):
            workdir = Path(tempfile.mkdtemp(prefix="tw-settle-keys-"))
            try:
                result = settle_once(spark, workdir, keys, args)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            print(json.dumps(result), flush=True)
            results.append(result)
    finally:
        spark.stop()
    write_figures(args.json, results)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="10000,100000", help="comma-separated key counts")
    parser.add_argument("--records-per-key", type=int, default=2)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=4, help="write tasks (shuffle partitions)")
    parser.add_argument("--slice-files", type=int, default=0, help="0: the release's default")
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


def settle_once(spark: Any, workdir: Path, keys: int, args: argparse.Namespace) -> dict[str, Any]:
    lake = DeltaLake(str(workdir / "lake"))
    lake.ensure_tables()
    epoch = WriterLease(lake, STREAM, ttl_ms=3_600_000).acquire()
    started = time.monotonic()
    records = stage_keys(lake, epoch, keys, args.records_per_key, args.batches, args.tasks)
    staged_s = time.monotonic() - started
    versions = {spec.name: lake.open(spec).version() for spec in TABLES}
    options: dict[str, Any] = {"log_checkpoint_files": 5_000}
    if args.slice_files:
        options["slice_files"] = args.slice_files
    compaction = Compaction(lake, STREAM, epoch, tasks=args.tasks, **options)
    processes = {"python": this_process, "jvm": driver_jvm, "both": driver_and_jvm}
    processes_cpu = ProcessTree(os.getpid(), count_from_now=True)
    with peak_rss(processes) as peaks:
        started = time.monotonic()
        done = compaction.run(spark, version=args.batches - 1)
        settle_s = time.monotonic() - started
    processes_cpu.look(settle_s)
    tables = {}
    for spec in TABLES:
        table = lake.open(spec)
        actions = pa.table(table.get_add_actions(flatten=True))
        rows = _rows_in(table.file_uris())
        tables[spec.name] = {
            "files": actions.num_rows,
            "staged_files": int(
                pc.sum(pc.equal(actions[f"partition.{spec.partition_by[0]}"], "_staged")).as_py()
                or 0
            ),
            "commits": table.version() - versions[spec.name],
            "rows": rows,
        }
        if rows != records:
            raise RuntimeError(f"{spec.name}: {rows} rows after the settle, {records}")
    return {
        "keys": keys,
        "records": records,
        "stage_s": round(staged_s, 1),
        "settle_s": round(settle_s, 1),
        "settle_cpu_s": processes_cpu.cpu_s_by_kind(),
        "settled_files": sum(table.settled_files for table in done),
        "tables": tables,
        "driver_python_peak_mib": round(peaks["python"]),
        "driver_jvm_peak_mib": round(peaks["jvm"]),
        "driver_peak_mib": round(peaks["both"]),
    }


def _rows_in(files: list[str]) -> int:
    """The rows of the table version's `files`, counted by DuckDB from the footers: delta-rs's
    reader kept 100,000 tenants' 200,000 files at 11 GB resident for a minute."""
    import duckdb

    if not files:
        return 0
    counted = duckdb.connect().execute("SELECT count(*) FROM read_parquet(?)", [files]).fetchone()
    return int(counted[0]) if counted else 0


def stage_keys(
    lake: DeltaLake, epoch: int, keys: int, records_per_key: int, batches: int, tasks: int
) -> int:
    """Commit `batches` batches of staged `events` and `windows` files, as a stream of `tasks`
    write tasks leaves them: `keys` tenants (one source each), `records_per_key` events each and
    one window pane per event. The number of records (rows per table)."""
    per_batch = keys * records_per_key // batches
    total = 0
    for batch_id in range(batches):
        offsets = np.arange(batch_id * per_batch, (batch_id + 1) * per_batch, dtype=np.int64)
        key_of = offsets % keys
        union = synthetic_union_rows(key_of, offsets)
        written: dict[str, list[WrittenFile]] = {spec.name: [] for spec in TABLES}
        for task in range(tasks):
            mine = union.filter(pa.array(np.tile(key_of % tasks == task, 2)))
            target = BatchFiles(
                lake.root, None, STREAM, epoch, batch_id, tuple(spec.name for spec in TABLES)
            )
            for file in write_batch_rows(target, mine, task):
                written[file.table_name].append(file)
        for spec in TABLES:
            lake.commit_files(spec, written[spec.name], STREAM, batch_id, epoch)
        total += per_batch
    return total


def synthetic_union_rows(key_of: np.ndarray, offsets: np.ndarray) -> pa.Table:
    """One event and one window pane per offset, of tenant `t<key>` (source `web`)."""
    count = len(offsets)
    tenants = pa.array(np.char.add("t", key_of.astype(str)).tolist())
    event_ms = T0_MS + (offsets % 3_600) * 1_000
    start_ms = event_ms - event_ms % 60_000
    value = b'{"tenant": "t", "source": "web"}'
    events = union_table(
        {
            "kind": pa.array(["events"] * count),
            "tenant": tenants,
            "source": pa.array(["web"] * count),
            "window_id": pa.array(np.char.add("w", offsets.astype(str)).tolist()),
            "pane_index": np.zeros(count, dtype=np.int32),
            "timing": pa.array(["ON_TIME"] * count),
            "event_time_ms": event_ms,
            "event_id": pa.array(np.char.add("e", offsets.astype(str)).tolist()),
            "topic": pa.array(["bench"] * count),
            "partition": np.zeros(count, dtype=np.int32),
            "offset": offsets,
            "kafka_timestamp_ms": event_ms,
            "value": pa.array([value] * count, pa.binary()),
        },
        count,
    )
    windows = union_table(
        {
            "kind": pa.array(["windows"] * count),
            "tenant": tenants,
            "source": pa.array(["web"] * count),
            "window_id": pa.array(np.char.add("w", offsets.astype(str)).tolist()),
            "window_start_ms": start_ms,
            "window_end_ms": start_ms + 60_000,
            "pane_index": np.zeros(count, dtype=np.int32),
            "timing": pa.array(["ON_TIME"] * count),
            "is_final": pa.array([True] * count),
            "count": np.ones(count, dtype=np.int64),
            "metrics": pa.array([[]] * count, METRICS),
            "merged_window_ids": pa.array([[]] * count, pa.list_(pa.string())),
            "watermark_ms": event_ms,
        },
        count,
    )
    return pa.concat_tables([events, windows])


if __name__ == "__main__":
    raise SystemExit(main())
