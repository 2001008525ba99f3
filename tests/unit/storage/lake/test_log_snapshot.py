"""One partition's files read from the log are the ones delta-rs loads for the same version, with
the transaction ids and protocol; the reader declines what it does not follow."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from storage.lake.delta_log import DeltaLog
from storage.lake.log_snapshot import partition_snapshot

STAGED = "_staged"


def _append(uri: str, layouts: list[str], app_version: int | None = None) -> None:
    rows = pa.table({"layout": layouts, "value": list(range(len(layouts)))})
    transactions = [] if app_version is None else [Transaction("stream", app_version)]
    write_deltalake(
        uri,
        rows,
        mode="append",
        partition_by=["layout"],
        commit_properties=CommitProperties(app_transactions=transactions),
    )


def _delta_rs_files(uri: str, value: str) -> list[tuple[str, int, int]]:
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    return sorted(
        (row["path"], row["size_bytes"], row["modification_time"])
        for row in actions
        if row["partition.layout"] == value
    )


def test_the_partitions_files_are_those_delta_rs_lists_at_every_version(tmp_path: Path) -> None:
    rng = random.Random(7)
    uri = str(tmp_path / "events")
    _append(uri, [STAGED, "acme"], app_version=0)
    for step in range(1, 25):
        roll = rng.random()
        if roll < 0.5:
            _append(uri, [rng.choice([STAGED, "acme", "zeta"]) for _ in range(3)], step)
        elif roll < 0.7:
            DeltaTable(uri).delete(f"value = {rng.randint(0, 2)}")
        elif roll < 0.85:
            DeltaTable(uri).optimize.compact()
        else:
            DeltaTable(uri).create_checkpoint()
        snapshot = partition_snapshot(DeltaLog(uri, None), "layout", STAGED)

        assert snapshot is not None
        table = DeltaTable(uri)
        assert snapshot.version == table.version()
        assert [
            (file.path, file.size, file.modification_time) for file in snapshot.files
        ] == _delta_rs_files(uri, STAGED), step
        assert all(file.partition_values == {"layout": STAGED} for file in snapshot.files)
        assert snapshot.transactions.get("stream") == table.transaction_version("stream")
        assert snapshot.writer_version == table.protocol().min_writer_version


def test_new_metadata_after_the_checkpoint_is_left_to_delta_rs(tmp_path: Path) -> None:
    uri = str(tmp_path / "events")
    _append(uri, [STAGED])
    DeltaTable(uri).create_checkpoint()
    DeltaTable(uri).alter.set_table_properties({"delta.appendOnly": "false"})

    assert partition_snapshot(DeltaLog(uri, None), "layout", STAGED) is None


def test_a_table_that_does_not_exist_has_no_snapshot(tmp_path: Path) -> None:
    assert partition_snapshot(DeltaLog(str(tmp_path / "none"), None), "layout", STAGED) is None
