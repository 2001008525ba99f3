"""A table's head read from the log holds what delta-rs loads for the same version (transaction
ids, protocol, columns, partitioning), whether read anew or moved forward commit by commit; and
a batch committed on the log is one delta-rs reads as its own."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.schema import Field

from storage.lake.commits import FencedError, fence_app_id
from storage.lake.delta_lake import DeltaLake, LakeLayoutError
from storage.lake.delta_log import DeltaLog
from storage.lake.log_checkpoint import write_checkpoint
from storage.lake.log_head import LogHead, LogHeads, read_head
from storage.lake.tables import QUARANTINE
from storage.lake.writer_lease import WriterLease
from tenants.settings import StreamSettings
from tests.support.lake_batches import commit_quarantine_row

APPS = ["orders", "orders/compaction", "orders/writer_epoch"]


def _append(uri: str, rng: random.Random, step: int) -> None:
    rows = pa.table({"layout": [rng.choice(["_staged", "acme"])], "value": [step]})
    transactions = [Transaction(app, step) for app in rng.sample(APPS, rng.randint(0, 2))]
    write_deltalake(
        uri,
        rows,
        mode="append",
        partition_by=["layout"],
        schema_mode="merge",
        commit_properties=CommitProperties(app_transactions=transactions),
    )


def _as_delta_rs_has_it(uri: str) -> tuple[int, dict[str, int | None], int, set[str], list[str]]:
    table = DeltaTable(uri)
    return (
        table.version(),
        {app: table.transaction_version(app) for app in APPS},
        table.protocol().min_writer_version,
        set(table.schema().to_arrow().names),
        table.metadata().partition_columns,
    )


def _as_read(head: LogHead | None) -> tuple[int, dict[str, int | None], int, set[str], list[str]]:
    assert head is not None
    return (
        head.version,
        {app: head.transactions.get(app) for app in APPS},
        head.writer_version,
        set(head.columns),
        list(head.partition_columns),
    )


@pytest.mark.parametrize("seed", range(4))
def test_the_head_holds_what_delta_rs_loads_read_anew_or_moved_on(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    uri = str(tmp_path / "events")
    delta_log = DeltaLog(uri, None)
    heads = LogHeads()
    _append(uri, rng, 0)
    for step in range(1, 30):
        roll = rng.random()
        if roll < 0.5:
            _append(uri, rng, step)
        elif roll < 0.6:
            DeltaTable(uri).delete(f"value = {rng.randint(0, step)}")
        elif roll < 0.7:
            DeltaTable(uri).optimize.compact()
        elif roll < 0.8:
            DeltaTable(uri).create_checkpoint()
        elif roll < 0.9:
            write_checkpoint(delta_log)
        elif roll < 0.95:
            DeltaTable(uri).alter.add_columns(Field(f"extra_{step}", "string"))
        else:
            DeltaTable(uri).alter.set_table_properties({"delta.appendOnly": "false"})

        expected = _as_delta_rs_has_it(uri)
        assert _as_read(read_head(delta_log)) == expected, step
        assert _as_read(heads.head(delta_log)) == expected, step


def test_a_table_that_does_not_exist_has_no_head(tmp_path: Path) -> None:
    assert read_head(DeltaLog(str(tmp_path / "none"), None)) is None


def test_file_lines_spelled_otherwise_than_delta_rs_writes_them_are_read_right(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "events")
    write_deltalake(uri, pa.table({"layout": ["a"], "value": [1]}), partition_by=["layout"])
    # Another writer's spelling: spaces, and the action's name not first in a line.
    lines = [
        b'{ "txn": {"appId": "orders", "version": 9, "lastUpdated": 1} }',
        b'{ "add": {"path": "layout=a/x.parquet", "partitionValues": {"layout": "a"}, '
        b'"size": 1, "modificationTime": 1, "dataChange": true} }',
        orjson.dumps({"commitInfo": {"operation": "WRITE"}}),
    ]
    (tmp_path / "events" / "_delta_log" / f"{1:020d}.json").write_bytes(b"\n".join(lines))

    head = read_head(DeltaLog(uri, None))

    assert head is not None and head.version == 1
    assert dict(head.transactions) == {"orders": 9}


def _fenced_lake(tmp_path: Path) -> tuple[DeltaLake, int]:
    lake = DeltaLake(str(tmp_path / "lake"))
    lake.ensure_tables()
    lease = WriterLease.for_stream(lake, StreamSettings(name="orders"))
    return lake, lease.acquire()


def test_a_batch_committed_on_the_log_is_read_by_delta_rs_once(tmp_path: Path) -> None:
    lake, epoch = _fenced_lake(tmp_path)
    heads = LogHeads()

    assert commit_quarantine_row(lake, "orders", 0, epoch, heads=heads)
    assert commit_quarantine_row(lake, "orders", 1, epoch, heads=heads)
    assert not commit_quarantine_row(lake, "orders", 1, epoch, heads=heads)
    assert not commit_quarantine_row(lake, "orders", 1, epoch)  # a head read anew agrees

    table = lake.open(QUARANTINE)
    assert table.transaction_version("orders") == 1
    assert sorted(table.to_pyarrow_table().column("offset").to_pylist()) == [0, 1]
    assert table.transaction_version(fence_app_id("orders")) == epoch
    assert lake.committed_batch(QUARANTINE, "orders", heads) == 1


def test_new_metadata_between_the_head_and_the_commit_is_looked_at_then_committed_after(
    tmp_path: Path,
) -> None:
    lake, epoch = _fenced_lake(tmp_path)
    uri = lake.table_uri(QUARANTINE)
    changed: list[int] = []

    def change_the_metadata_once() -> None:
        if not changed:
            DeltaTable(uri).alter.set_table_properties({"delta.logRetentionDuration": "7 days"})
            changed.append(DeltaTable(uri).version())

    assert commit_quarantine_row(lake, "orders", 0, epoch, change_the_metadata_once)

    table = DeltaTable(uri)
    assert table.version() == changed[0] + 1
    assert table.metadata().configuration["delta.logRetentionDuration"] == "7 days"
    assert table.to_pyarrow_table().num_rows == 1


def test_a_table_lacking_a_column_the_batch_holds_is_refused_with_the_column_named(
    tmp_path: Path,
) -> None:
    lake, epoch = _fenced_lake(tmp_path)
    uri = lake.table_uri(QUARANTINE)
    # The quarantine table as a release without its `error` column would have made it.
    fence = Transaction(fence_app_id("orders"), epoch)
    old_schema = pa.schema([f for f in QUARANTINE.storage_schema if f.name != "error"])
    write_deltalake(
        uri,
        old_schema.empty_table(),
        mode="overwrite",
        schema_mode="overwrite",
        partition_by=list(QUARANTINE.partition_by),
        commit_properties=CommitProperties(app_transactions=[fence]),
    )

    # delta-rs would commit them, and the table's readers never see the column's values.
    with pytest.raises(LakeLayoutError, match="lacks the columns error"):
        commit_quarantine_row(lake, "orders", 0, epoch)
    assert "error" not in DeltaTable(uri).schema().to_arrow().names
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 0


def test_a_batch_of_a_writer_whose_fence_was_replaced_raises_and_commits_nothing(
    tmp_path: Path,
) -> None:
    lake, epoch = _fenced_lake(tmp_path)
    heads = LogHeads()
    assert commit_quarantine_row(lake, "orders", 0, epoch, heads=heads)
    takeover = WriterLease.for_stream(lake, StreamSettings(name="orders"))
    takeover.clock_ms = lambda: 2**50  # the first holder's lease long expired
    takeover.acquire()

    with pytest.raises(FencedError):
        commit_quarantine_row(lake, "orders", 1, epoch, heads=heads)
    assert lake.open(QUARANTINE).transaction_version("orders") == 0
