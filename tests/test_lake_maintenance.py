"""The lake at scale without Spark: compaction, log checkpoints, and streams sharing a lake.

Files are written by the executor-side code (`write_task_files`) and committed by the driver's
(`commit_files`), exactly as a micro-batch does, only called directly.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pandas as pd
import pyarrow as pa
from deltalake import DeltaTable

from storage.data_files import BatchFiles, WrittenFile, write_task_files
from storage.delta_lake import DeltaLake
from storage.tables import EVENTS
from storage.writer_lease import WriterLease
from streaming.keyed_state import output_frame
from tenants.settings import StreamSettings

T0_MS = 1_767_225_600_000


def _event_rows(tenants: list[str], batch_id: int) -> pa.Table:
    count = len(tenants)
    frame = output_frame(
        pd.DataFrame(
            {
                "kind": ["events"] * count,
                "tenant": tenants,
                "source": ["web"] * count,
                "window_id": ["w"] * count,
                "window_start_ms": [T0_MS] * count,
                "window_end_ms": [T0_MS + 60_000] * count,
                "pane_index": [0] * count,
                "timing": ["ON_TIME"] * count,
                "event_time_ms": [T0_MS + batch_id] * count,
                "partition": [0] * count,
                "offset": list(range(batch_id * count, (batch_id + 1) * count)),
                "kafka_timestamp_ms": [T0_MS] * count,
                "value": [b"{}"] * count,
            }
        )
    )
    return pa.Table.from_pandas(frame, preserve_index=False)


def _commit_batch(
    lake: DeltaLake, stream: str, epoch: int, batch_id: int, tenants: list[str], task: int = 0
) -> bool:
    target = BatchFiles(lake.root, None, stream, epoch, batch_id, (EVENTS.name,))
    batches = write_task_files(target, lambda: task)(
        iter(_event_rows(tenants, batch_id).to_batches())
    )
    files = [WrittenFile.from_row(row) for batch in batches for row in batch.to_pylist()]
    return lake.commit_files(EVENTS, files, stream, batch_id, epoch)


def _paths(lake: DeltaLake) -> list[str]:
    """The data files of the current version, relative to the table."""
    actions = DeltaTable(lake.table_uri(EVENTS)).get_add_actions(flatten=True)
    return sorted(str(path) for path in actions.column("path").to_pylist())


def _lake(tmp_path: Path) -> DeltaLake:
    lake = DeltaLake(str(tmp_path / "lake"))
    lake.ensure_tables()
    return lake


def test_each_partition_of_a_task_gets_one_file_named_by_stream_epoch_and_batch(
    tmp_path: Path,
) -> None:
    lake = _lake(tmp_path)
    epoch = WriterLease.for_stream(lake, StreamSettings(name="orders")).acquire()
    assert _commit_batch(lake, "orders", epoch, 0, ["acme", "acme", "globex"], task=3)

    files = _paths(lake)
    assert len(files) == 2  # one per tenant partition
    for path in files:
        assert path.startswith(("tenant=acme/source=web/window_date=2026-01-01/", "tenant=globex/"))
        assert f"part-orders-e{epoch}-b0000000000-t00003-" in path
    rows = DeltaTable(lake.table_uri(EVENTS)).to_pandas()
    assert sorted(rows["tenant"]) == ["acme", "acme", "globex"]


def test_a_retried_batch_writes_the_same_file_names(tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    target = BatchFiles(lake.root, None, "orders", 1, 7, (EVENTS.name,))
    names = []
    for _attempt in range(2):
        written = write_task_files(target, lambda: 0)(iter(_event_rows(["acme"], 7).to_batches()))
        names.append([row["path"] for batch in written for row in batch.to_pylist()])
    assert names[0] == names[1]


def test_optimize_compacts_small_files_keeps_every_row_and_checkpoints_the_log(
    tmp_path: Path,
) -> None:
    lake = _lake(tmp_path)
    epoch = WriterLease.for_stream(lake, StreamSettings(name="orders")).acquire()
    tenants = [f"t{i}" for i in range(5)]
    for batch_id in range(6):
        assert _commit_batch(lake, "orders", epoch, batch_id, tenants)
    before = DeltaTable(lake.table_uri(EVENTS))
    rows_before = before.to_pandas().sort_values("offset").reset_index(drop=True)
    assert len(_paths(lake)) == 30

    done = lake.optimize()

    after = DeltaTable(lake.table_uri(EVENTS))
    assert done["events"].files_removed == 30
    assert len(_paths(lake)) == 5  # one file per tenant partition
    rows_after = after.to_pandas().sort_values("offset").reset_index(drop=True)
    pd.testing.assert_frame_equal(rows_after, rows_before)
    checkpoints = list((tmp_path / "lake" / "events" / "_delta_log").glob("*.checkpoint.parquet"))
    assert checkpoints, "no log checkpoint was written"
    # The stream goes on committing after a compaction, exactly once.
    assert _commit_batch(lake, "orders", epoch, 6, tenants)
    assert not _commit_batch(lake, "orders", epoch, 6, tenants)
    assert len(DeltaTable(lake.table_uri(EVENTS)).to_pandas()) == 35


def test_four_streams_commit_into_one_lake_at_once_and_every_batch_lands(tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    streams = [f"stream-{n}" for n in range(4)]
    epochs = {
        stream: WriterLease.for_stream(lake, StreamSettings(name=stream)).acquire()
        for stream in streams
    }
    failures: list[BaseException] = []

    def run(stream: str) -> None:
        try:
            for batch_id in range(8):
                assert _commit_batch(lake, stream, epochs[stream], batch_id, [stream])
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=run, args=(stream,)) for stream in streams]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    table = DeltaTable(lake.table_uri(EVENTS))
    for stream in streams:
        assert table.transaction_version(stream) == 7
    assert table.to_pandas().groupby("tenant").size().to_dict() == dict.fromkeys(streams, 8)
