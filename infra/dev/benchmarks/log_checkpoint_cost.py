"""What checkpointing a table's log costs once a settle has added a file per tenant: delta-rs
(which loads the whole table first) against the product's own writer (`log_checkpoint`, a batch
of actions at a time); without Spark, a broker or data files.

    .venv/bin/python -m infra.dev.benchmarks.log_checkpoint_cost --files 1000000

It builds an `events` log as a sliced settle leaves it: a checkpoint of the empty table, then
commits of `--slice-files` settled files each (one tenant each, the statistics the product
writes: `file_stats.SETTLED_FILE_STATS`); the data files themselves are never written. Then, in
a fresh process for each writer, on its own copy of the log, it checkpoints the newest version
and reports the time and the process's peak resident memory. It checks that delta-rs reads the
same files from both checkpoints.

Figures of one run on one machine, comparable with each other only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from deltalake import DeltaTable

from infra.dev.benchmarks.figures_file import write_figures
from infra.dev.benchmarks.table_state_memory import settled_partitions
from storage.lake.delta_log import DeltaLog
from storage.lake.log_checkpoint import write_checkpoint
from storage.lake.tables import EVENTS
from storage.upkeep.settle_slices import SLICE_FILES

MODULE = "infra.dev.benchmarks.log_checkpoint_cost"
WRITERS = ("delta-rs", "streamed")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.checkpoint is not None:
        print(json.dumps(_checkpointed(args.checkpoint, args.table)))
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="tw-log-checkpoint-") as work:
        built = Path(work) / "built"
        build(built, args.files, args.slice_files)
        files_read = {}
        for writer in WRITERS:
            table = Path(work) / writer
            done = on_a_copy(MODULE, built, table, "--checkpoint", writer)
            result = {"writer": writer, "files": args.files, **done}
            results.append(result)
            print(json.dumps(result), flush=True)
            files_read[writer] = sorted(
                uri.removeprefix(f"{table}/") for uri in DeltaTable(str(table)).file_uris()
            )
            shutil.rmtree(table)
        if files_read["delta-rs"] != files_read["streamed"]:
            raise RuntimeError("the two checkpoints hold different files")
    write_figures(args.json, results)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--slice-files", type=int, default=SLICE_FILES)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--checkpoint", choices=WRITERS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--table", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def on_a_copy(module: str, built: Path, copy: Path, *args: str) -> dict[str, Any]:
    """`module`'s answer (JSON) for `args` and `--table` a copy of the log at `built`, in a
    fresh process: its peak memory is its own, and what it changes leaves `built` as it was."""
    shutil.copytree(built, copy)
    done = subprocess.run(
        [sys.executable, "-m", module, *args, "--table", str(copy)],
        capture_output=True,
        text=True,
        check=True,
    )
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def build(table: Path, files: int, slice_files: int) -> None:
    """`events` at `table`: checkpointed empty, then `files` settled files in commits of
    `slice_files`, written to the log directly."""
    DeltaTable.create(str(table), EVENTS.storage_schema, partition_by=list(EVENTS.partition_by))
    DeltaTable(str(table)).create_checkpoint()
    delta_log = DeltaLog(str(table), None)
    now_ms = int(time.time() * 1000)
    for version, start in enumerate(range(0, files, slice_files), start=1):
        keys = np.arange(start, min(files, start + slice_files), dtype=np.int64)
        adds = [
            {
                "add": {
                    "path": f"settled-{start + index:012d}.parquet",
                    "partitionValues": values,
                    "size": 3_300,
                    "modificationTime": now_ms,
                    "dataChange": False,
                    "stats": stats,
                }
            }
            for index, (values, _rows, stats) in enumerate(settled_partitions(keys, "product"))
        ]
        if not delta_log.try_commit(version, [{"commitInfo": {"timestamp": now_ms}}, *adds]):
            raise RuntimeError(f"version {version} exists already")


def _checkpointed(writer: str, table: Path) -> dict[str, Any]:
    delta_log = DeltaLog(str(table), None)
    version = delta_log.newest_version_after(0)
    before_mib = peak_mib()
    started = time.monotonic()
    if writer == "delta-rs":
        DeltaTable(str(table)).create_checkpoint()
    elif not write_checkpoint(delta_log, version):
        raise RuntimeError("the streamed writer declined")
    return {
        "version": version,
        "seconds": round(time.monotonic() - started, 1),
        "peak_mib_before": round(before_mib),
        "peak_mib": round(peak_mib()),
    }


def peak_mib() -> float:
    # The address space's high-water mark, which starts afresh at exec (`ru_maxrss` would
    # carry the parent's from before it).
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


if __name__ == "__main__":
    raise SystemExit(main())
