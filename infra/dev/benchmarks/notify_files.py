"""What the notifier's lookup of a new batch's files costs once a settle has added a file per
tenant: delta-rs's load of the whole table (the notifier before `BatchFileIndex`) against the
index; without Spark, a broker or data files.

    .venv/bin/python -m infra.dev.benchmarks.notify_files --files 1000000

It builds a log as `log_checkpoint_cost` does (`--files` settled files, checkpointed by the
product's writer), then appends one batch's commit of `--batch-files` staged files. In a fresh
process for each reader it asks for the files that may hold that batch, twice (the first after
the settle, the second after one more batch), and reports the time of each ask and the
process's peak resident memory. It checks that both readers name the same files.

Figures of one run on one machine, comparable with each other only.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from infra.dev.benchmarks.figures_file import write_figures
from infra.dev.benchmarks.log_checkpoint_cost import build, on_a_copy, peak_mib
from storage.lake.batch_file_index import BatchFileIndex
from storage.lake.delta_log import DeltaLog
from storage.lake.log_checkpoint import write_checkpoint
from storage.lake.snapshot_reader import batch_files
from storage.lake.tables import EVENTS, STAGED
from storage.upkeep.settle_slices import SLICE_FILES

MODULE = "infra.dev.benchmarks.notify_files"
READERS = ("delta-rs", "index")
SETTLED_BATCH = 0
"""The batch id `log_checkpoint_cost.build`'s settled files hold."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.reader is not None:
        print(json.dumps(_asked(args.reader, args.table)))
        return 0
    with tempfile.TemporaryDirectory(prefix="tw-notify-files-") as work:
        table = Path(work) / "windows"
        build(table, args.files, SLICE_FILES)
        if not write_checkpoint(DeltaLog(str(table), None)):
            raise RuntimeError("the checkpoint writer declined")
        _append_batch(table, SETTLED_BATCH + 1, args.batch_files)
        # Each on its own copy: the second ask appends a batch.
        results = {
            reader: on_a_copy(MODULE, table, Path(work) / reader, "--reader", reader)
            for reader in READERS
        }
    named = {
        reader: [Path(found).name for found in result.pop("files")]
        for reader, result in results.items()
    }
    if named["delta-rs"] != named["index"]:
        raise RuntimeError(f"the readers name different files: {named}")
    figures = {"settled_files": args.files, "batch_files": args.batch_files, **results}
    for reader, result in results.items():
        print(
            f"{reader:<9} first ask {result['first_s']} s, next batch's {result['next_s']} s, "
            f"peak {result['peak_mib']} MiB ({result['files_named']} files named)"
        )
    if args.json is not None:
        write_figures(args.json, figures)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--batch-files", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--reader", choices=READERS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--table", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def _append_batch(table: Path, batch_id: int, files: int) -> None:
    """A batch's commit: `files` staged files holding `batch_id` only."""
    delta_log = DeltaLog(str(table), None)
    version = delta_log.newest_version_after(0) + 1
    now_ms = int(time.time() * 1000)
    stats = json.dumps(
        {"numRecords": 1, "minValues": {"batch_id": batch_id}, "maxValues": {"batch_id": batch_id}}
    )
    adds = [
        {
            "add": {
                "path": f"{EVENTS.partition_by[0]}={STAGED}/part-b{batch_id}-t{task:05d}.parquet",
                "partitionValues": {name: None for name in EVENTS.partition_by}
                | {EVENTS.partition_by[0]: STAGED},
                "size": 3_300,
                "modificationTime": now_ms,
                "dataChange": True,
                "stats": stats,
            }
        }
        for task in range(files)
    ]
    if not delta_log.try_commit(version, [{"commitInfo": {"timestamp": now_ms}}, *adds]):
        raise RuntimeError(f"version {version} exists already")


def _asked(reader: str, table: Path) -> dict[str, Any]:
    """The files that may hold the first batch after the settle, then those of the next."""
    uri = str(table)
    index = BatchFileIndex(uri, None)
    loaded: DeltaTable | None = None

    def files(after: int) -> list[str]:
        nonlocal loaded
        if reader == "index":
            found = index.files(after, after + 1)
            assert found is not None
            return found
        if loaded is None:
            loaded = DeltaTable(uri)
        else:
            loaded.update_incremental()
        return [found.removeprefix("file://") for found in batch_files(loaded, after, after + 1)]

    started = time.monotonic()
    first = files(SETTLED_BATCH)
    first_s = time.monotonic() - started
    _append_batch(table, SETTLED_BATCH + 2, 4)
    started = time.monotonic()
    files(SETTLED_BATCH + 1)
    return {
        "first_s": round(first_s, 2),
        "next_s": round(time.monotonic() - started, 3),
        "peak_mib": round(peak_mib()),
        "files_named": len(first),
        "files": sorted(first),
    }


if __name__ == "__main__":
    raise SystemExit(main())
