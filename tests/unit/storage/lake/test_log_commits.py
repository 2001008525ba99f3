"""Swaps committed on the log's tail: delta-rs reads them as its own commits, and every check a
snapshot-based commit makes still holds (the fence, the removed files, a racing commit)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.lake.commits import FencedError, fence_app_id
from storage.lake.delta_lake import LakeFile
from storage.lake.delta_log import DeltaLog, lines
from storage.lake.log_commits import FencedCommit, _commit_actions, add_lines, commit_fenced
from storage.lake.written_files import WRITTEN_FILE_SCHEMA, WrittenFile

STREAM = "orders"
EPOCH = 3


def _table(tmp_path: Path, tenants: list[str]) -> str:
    uri = str(tmp_path / "events")
    rows = pa.table({"tenant": tenants, "value": list(range(len(tenants)))})
    fenced = CommitProperties(app_transactions=[Transaction(fence_app_id(STREAM), EPOCH)])
    write_deltalake(uri, rows, partition_by=["tenant"], commit_properties=fenced)
    return uri


def _files(uri: str) -> list[LakeFile]:
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    return [
        LakeFile(path=row["path"], size=row["size_bytes"], partition_values={"tenant": row[key]})
        for row in actions
        for key in ["partition.tenant"]
    ]


def _written(tenant: str, name: str) -> WrittenFile:
    return WrittenFile(
        table_name="events",
        path=f"tenant={tenant}/{name}.parquet",
        size=10,
        partition_values={"tenant": tenant},
        modification_time=1_795_000_000_000,
        stats=json.dumps({"numRecords": 1, "minValues": {"value": 7}, "maxValues": {"value": 7}}),
        num_records=1,
    )


def _swap(removed: list[LakeFile], added: list[WrittenFile], epoch: int = EPOCH) -> FencedCommit:
    return FencedCommit(removed, added, STREAM, epoch, (f"{STREAM}/compaction", 5))


def _paths(uri: str) -> set[str]:
    return {path.removeprefix(uri + "/") for path in DeltaTable(uri).file_uris()}


def test_delta_rs_reads_the_swap_as_one_commit_with_its_transaction(tmp_path: Path) -> None:
    uri = _table(tmp_path, ["acme", "a b%c"])
    removed = [file for file in _files(uri) if file.partition_values["tenant"] == "a b%c"]
    kept = _paths(uri) - {file.path for file in removed}

    version = commit_fenced(DeltaLog(uri, None), 0, _swap(removed, [_written("a b%c", "settled")]))

    assert version == 1
    table = DeltaTable(uri)
    assert table.version() == 1
    assert _paths(uri) == kept | {"tenant=a b%c/settled.parquet"}
    assert table.transaction_version(f"{STREAM}/compaction") == 5
    added = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    (settled,) = [row for row in added if row["path"].endswith("settled.parquet")]
    assert settled["min.value"] == 7 and settled["num_records"] == 1


def test_a_commit_since_the_checked_version_that_removed_a_file_stops_the_swap(
    tmp_path: Path,
) -> None:
    uri = _table(tmp_path, ["acme", "zeta"])
    removed = _files(uri)
    # Another writer's overwrite, after version 0 was checked, removed those files.
    write_deltalake(uri, pa.table({"tenant": ["x"], "value": [1]}), mode="overwrite")
    before = _paths(uri)

    assert commit_fenced(DeltaLog(uri, None), 0, _swap(removed, [_written("acme", "s")])) is None
    assert _paths(uri) == before and DeltaTable(uri).version() == 1


def test_a_newer_writers_fence_since_the_checked_version_raises(tmp_path: Path) -> None:
    uri = _table(tmp_path, ["acme"])
    fence = CommitProperties(app_transactions=[Transaction(fence_app_id(STREAM), EPOCH + 1)])
    DeltaTable(uri).create_write_transaction(
        [],
        mode="append",
        schema=pa.schema([("tenant", pa.string()), ("value", pa.int64())]),
        partition_by=["tenant"],
        commit_properties=fence,
    )

    with pytest.raises(FencedError):
        commit_fenced(DeltaLog(uri, None), 0, _swap(_files(uri), [_written("acme", "s")]))
    assert DeltaTable(uri).version() == 1


def test_a_commit_that_takes_the_version_first_is_read_and_the_swap_goes_after_it(
    tmp_path: Path,
) -> None:
    uri = _table(tmp_path, ["acme", "zeta"])
    removed = [file for file in _files(uri) if file.partition_values["tenant"] == "acme"]
    racing: list[int] = []

    def a_batch_commits_first() -> None:
        if not racing:  # once: the swap's retry must not race again
            racing.append(1)
            write_deltalake(uri, pa.table({"tenant": ["zeta"], "value": [9]}), mode="append")

    version = commit_fenced(
        DeltaLog(uri, None), 0, _swap(removed, [_written("acme", "s")]), a_batch_commits_first
    )

    assert version == 2
    assert len([path for path in _paths(uri) if path.startswith("tenant=zeta/")]) == 2
    assert "tenant=acme/s.parquet" in _paths(uri)
    assert not {file.path for file in removed} & _paths(uri)


def test_a_version_is_written_once_whoever_tries_it(tmp_path: Path) -> None:
    uri = _table(tmp_path, ["acme"])
    delta_log = DeltaLog(uri, None)
    commit = [{"commitInfo": {"timestamp": 1, "operation": "WRITE"}}]

    assert delta_log.try_commit(1, commit)
    assert not delta_log.try_commit(1, [{"commitInfo": {"timestamp": 2}}])
    assert list(delta_log.actions(1) or []) == commit
    assert delta_log.actions(2) is None
    assert delta_log.newest_version_after(0) == 1
    assert not [
        path for path in (tmp_path / "events" / "_delta_log").iterdir() if ".tmp" in path.name
    ]


def test_a_commit_is_read_a_line_at_a_time_whatever_the_chunks() -> None:
    text = b'{"a": 1}\n\n{"b": 22}\n{"c": 333}'
    for chunk_bytes in (1, 3, 7, 1 << 20):
        read = list(lines(pa.BufferReader(text), chunk_bytes))
        assert read == [b'{"a": 1}', b'{"b": 22}', b'{"c": 333}'], chunk_bytes


@settings(max_examples=100, deadline=None)
@given(
    files=st.lists(
        st.builds(
            WrittenFile,
            table_name=st.just("events"),
            path=st.text(min_size=1, max_size=30).map(lambda name: f"tenant={name}/f.parquet"),
            size=st.integers(min_value=0, max_value=2**40),
            partition_values=st.dictionaries(
                st.sampled_from(["tenant", "source", "window_date"]), st.none() | st.text()
            ),
            modification_time=st.integers(min_value=0, max_value=2**45),
            # Statistics as the writers make them (JSON text), and any text besides.
            stats=st.dictionaries(st.text(max_size=5), st.text() | st.integers()).map(json.dumps)
            | st.text(),
            num_records=st.integers(min_value=0, max_value=10),
        ),
        max_size=20,
    ),
    data_change=st.booleans(),
)
def test_files_as_rows_commit_the_add_actions_of_the_files_as_objects(
    files: list[WrittenFile], data_change: bool
) -> None:
    rows = pa.Table.from_pylist([file.to_row() for file in files], schema=WRITTEN_FILE_SCHEMA)
    as_objects = FencedCommit((), files, STREAM, EPOCH, ("t", 1), data_change)

    actions = [json.loads(line) for line in add_lines(rows, data_change).splitlines()]

    assert actions == [action for action in _commit_actions(as_objects, "id") if "add" in action]
