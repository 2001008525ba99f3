"""`BatchFileIndex` lists, for batches above its floor, the files delta-rs's load would: through
batches, rewrites, removals and a checkpoint, read from the start or from the checkpoint."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from storage.lake.batch_file_index import BatchFileIndex
from storage.lake.delta_log import DeltaLog
from storage.lake.log_checkpoint import write_checkpoint
from storage.lake.snapshot_reader import batch_files

_LAYOUT = ["layout_tenant"]


def _batch(uri: str, batch_id: int, tenants: list[str], mode: str = "append") -> None:
    rows = pa.table(
        {
            "tenant": tenants,
            "batch_id": pa.array([batch_id] * len(tenants), pa.int64()),
            "layout_tenant": ["_staged"] * len(tenants),
        }
    )
    write_deltalake(uri, rows, mode=mode, partition_by=_LAYOUT)  # type: ignore[call-overload]


def _settle(uri: str, tenants: list[str], batch_ids: list[int]) -> None:
    """A compaction's swap: every file out, the same rows back, a file per tenant."""
    rows = pa.table(
        {
            "tenant": tenants,
            "batch_id": pa.array(batch_ids, pa.int64()),
            "layout_tenant": tenants,
        }
    )
    write_deltalake(uri, rows, mode="overwrite", partition_by=_LAYOUT)  # type: ignore[call-overload]


def _loaded(uri: str, after: int, through: int) -> set[str]:
    table = DeltaTable(uri)
    return {_plain(found) for found in batch_files(table, after, through)}


def _plain(uri: str) -> str:
    return uri.removeprefix("file://")


def _listed(index: BatchFileIndex, after: int, through: int) -> set[str]:
    files = index.files(after, through)
    assert files is not None
    return {_plain(found) for found in files}


def _rows_of(files: set[str]) -> list[int]:
    return sorted(
        batch_id for path in files for batch_id in pq.read_table(path)["batch_id"].to_pylist()
    )


@pytest.mark.parametrize("checkpointed", [False, True])
def test_the_files_of_new_batches_are_those_a_fresh_load_lists(
    tmp_path: Path, checkpointed: bool
) -> None:
    uri = str(tmp_path / "windows")

    def checkpoint() -> None:
        if not checkpointed:
            return
        if not write_checkpoint(DeltaLog(uri, None)):
            DeltaTable(uri).create_checkpoint()  # the first one: delta-rs's

    def same_from_the_start(followed: BatchFileIndex, floor: int, through: int) -> None:
        """A new index, read from the newest checkpoint, lists what the followed one does."""
        fresh = BatchFileIndex(uri, None)
        assert _listed(fresh, floor, through) == _listed(followed, floor, through)

    for batch_id in range(3):
        _batch(uri, batch_id, ["acme", "b"])
    checkpoint()
    index = BatchFileIndex(uri, None)
    assert _listed(index, -1, 2) == _loaded(uri, -1, 2)
    assert _listed(index, 1, 2) == _loaded(uri, 1, 2)
    assert _rows_of(_listed(index, 1, 2)) == [2, 2]

    _batch(uri, 3, ["zeta"])
    _settle(uri, ["acme", "b", "zeta"], [2, 3, 3])  # batches 0-3, settled per tenant
    _batch(uri, 4, ["acme"])
    checkpoint()
    assert _listed(index, 1, 4) == _loaded(uri, 1, 4)
    assert _rows_of(_listed(index, 3, 4)) == [4]
    same_from_the_start(index, 3, 4)
    with pytest.raises(ValueError, match="let go"):
        index.files(1, 4)  # batches it has let go of

    assert index.files(4, 4) == []  # every file held only batches announced already
    _batch(uri, 5, ["b", "mid"])
    assert _listed(index, 4, 5) == _loaded(uri, 4, 5)
    checkpoint()
    same_from_the_start(index, 4, 5)
    if checkpointed:
        assert DeltaLog(uri, None).checkpointed_version() == DeltaTable(uri).version()


def test_a_file_without_batch_statistics_may_hold_any_batch(tmp_path: Path) -> None:
    uri = str(tmp_path / "windows")
    _batch(uri, 0, ["acme"])
    rows = pa.table(
        {"tenant": ["b"], "batch_id": pa.array([7], pa.int64()), "layout_tenant": ["b"]}
    )
    write_deltalake(uri, rows, mode="append", partition_by=_LAYOUT)  # type: ignore[call-overload]
    log = DeltaLog(uri, None)
    # The last commit's `add` as a writer that keeps no statistics writes it.
    newest = DeltaTable(uri).version()
    commit = Path(log.commit_file(newest))
    commit.write_text(
        "\n".join(
            line.replace('"stats":', '"no_stats":') for line in commit.read_text().splitlines()
        )
        + "\n"
    )
    index = BatchFileIndex(uri, None)
    assert _rows_of(_listed(index, 20, 30)) == [7]  # kept: it may hold any batch


def test_a_log_it_cannot_follow_is_left_to_delta_rs(tmp_path: Path) -> None:
    uri = str(tmp_path / "windows")
    _batch(uri, 0, ["acme"])
    # A multi-part checkpoint, which this reader does not read.
    Path(uri, "_delta_log", "_last_checkpoint").write_text('{"version": 0, "size": 2, "parts": 2}')
    assert BatchFileIndex(uri, None).files(-1, 0) is None
