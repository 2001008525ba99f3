"""What a Delta table's file list costs the process that opens it, per file, by the statistics its
files carry; without Spark, a broker or data files.

    .venv/bin/python -m infra.dev.benchmarks.table_state_memory --files 200000

The writer and the compaction keep each table open at its newest version (delta-rs), and delta-rs
holds every file of that version with its statistics. This builds an `events` table of
`--files` settled files, one tenant each, whose `add` actions carry the statistics the product
writes for a settled file (`file_stats`, from rows made as `settle_keys` makes them); the files
themselves are never written. Then, in a fresh process for each, it opens the table and reports
the resident memory that added, per file: with the product's statistics
(`file_stats.SETTLED_FILE_STATS`), with every column's (what a settled file carried before), and
with a row count only.

Figures of one run on one machine, comparable with each other only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from infra.dev.benchmarks.figures_file import write_figures
from infra.dev.benchmarks.settle_keys import synthetic_union_rows
from storage.lake.file_stats import SETTLED_FILE_STATS, split_by_partition
from storage.lake.tables import EVENTS, rows_for_table, with_layout

MODULE = "infra.dev.benchmarks.table_state_memory"
STATS_KINDS = ("product", "every_column", "none")
COMMIT_FILES = 50_000
"""`add` actions a commit carries while the table is built."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.open is not None:
        print(json.dumps(_opened(args.open)))
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="tw-table-state-") as work:
        for kind in STATS_KINDS:
            table = Path(work) / kind
            build(table, args.files, kind)
            opened = subprocess.run(
                [sys.executable, "-m", MODULE, "--open", str(table)],
                capture_output=True,
                text=True,
                check=True,
            )
            result = {"stats": kind, "files": args.files, **json.loads(opened.stdout)}
            result["bytes_per_file"] = round(result["added_mib"] * 2**20 / args.files)
            results.append(result)
            print(json.dumps(result), flush=True)
    write_figures(args.json, results)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--open", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def build(table: Path, files: int, kind: str) -> None:
    """`events` at `table`, of `files` settled files (a tenant each) carrying `kind` stats."""
    schema = EVENTS.storage_schema
    DeltaTable.create(str(table), schema, partition_by=list(EVENTS.partition_by))
    delta = DeltaTable(str(table))
    for start in range(0, files, COMMIT_FILES):
        keys = np.arange(start, min(files, start + COMMIT_FILES), dtype=np.int64)
        now_ms = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            AddAction(
                path=f"settled-{start + index:012d}.parquet",
                size=3_300,
                partition_values=values,
                modification_time=now_ms,
                data_change=True,
                stats=stats,
            )
            for index, (values, _rows, stats) in enumerate(settled_partitions(keys, kind))
        ]
        delta.create_write_transaction(
            actions, mode="append", schema=schema, partition_by=list(EVENTS.partition_by)
        )
        delta.update_incremental()
    delta.create_checkpoint()


def settled_partitions(
    keys: np.ndarray, kind: str
) -> list[tuple[dict[str, str | None], pa.Table, str]]:
    """An event of each key's tenant, settled in its own partition, with `kind` statistics."""
    rows = rows_for_table(synthetic_union_rows(keys, keys), EVENTS, 0)
    stats_columns = {"product": SETTLED_FILE_STATS, "every_column": None, "none": ()}[kind]
    return split_by_partition(
        with_layout(rows, EVENTS, settled=True), EVENTS.partition_by, stats_columns
    )


def _opened(table: Path) -> dict[str, Any]:
    before = _resident_mib()
    started = time.monotonic()
    delta = DeltaTable(str(table))
    return {
        "open_s": round(time.monotonic() - started, 2),
        "added_mib": round(_resident_mib() - before),
        "version": delta.version(),
    }


def _resident_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096 / 2**20


if __name__ == "__main__":
    raise SystemExit(main())
