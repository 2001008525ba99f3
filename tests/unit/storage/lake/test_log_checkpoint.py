"""A checkpoint written a batch at a time holds the table delta-rs would: the same files with their
statistics, transaction ids, metadata and tombstones, read from it alone."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from storage.lake import log_checkpoint
from storage.lake.delta_lake import LakeFile
from storage.lake.delta_log import DeltaLog
from storage.lake.log_checkpoint import write_checkpoint
from storage.lake.log_commits import FencedCommit, commit_fenced
from storage.lake.written_files import WrittenFile

TENANTS = ("acme", "a b%c", "zeta", "é")


def _append(uri: str, rng: random.Random, app_version: int | None = None) -> None:
    tenants = [rng.choice(TENANTS) for _ in range(rng.randint(1, 4))]
    rows = pa.table({"tenant": tenants, "value": [rng.randint(0, 99) for _ in tenants]})
    transactions = [] if app_version is None else [Transaction("stream", app_version)]
    write_deltalake(
        uri,
        rows,
        mode="append",
        partition_by=["tenant"],
        commit_properties=CommitProperties(app_transactions=transactions),
    )


def _swap_one_tenant(uri: str, rng: random.Random, name: str) -> None:
    """Replace one tenant's files by one file (as a settle does), on the log's tail."""
    table = DeltaTable(uri)
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    tenant = rng.choice(sorted({row["partition.tenant"] for row in actions}))
    removed = [
        LakeFile(row["path"], row["size_bytes"], {"tenant": tenant})
        for row in actions
        if row["partition.tenant"] == tenant
    ]
    path = f"tenant={tenant}/{name}.parquet"
    Path(f"{uri}/{path}").parent.mkdir(exist_ok=True)
    pq.write_table(pa.table({"value": [1, 2]}), f"{uri}/{path}")
    added = WrittenFile(
        table_name="events",
        path=path,
        size=Path(f"{uri}/{path}").stat().st_size,
        partition_values={"tenant": tenant},
        modification_time=1_795_000_000_000,
        stats=orjson.dumps(
            {"numRecords": 2, "minValues": {"value": 1}, "maxValues": {"value": 2}}
        ).decode(),
        num_records=2,
    )
    swap = FencedCommit(removed, [added], "stream", 0, ("stream/compaction", rng.randint(1, 9)))
    assert commit_fenced(DeltaLog(uri, None), table.version(), swap) is not None


def _state(uri: str) -> dict[str, object]:
    table = DeltaTable(uri)
    adds = pa.table(table.get_add_actions(flatten=True)).select(
        ["path", "size_bytes", "partition.tenant", "num_records", "min.value", "max.value"]
    )
    return {
        "files": sorted(adds.to_pylist(), key=lambda row: row["path"]),
        "stream": table.transaction_version("stream"),
        "compaction": table.transaction_version("stream/compaction"),
        "schema": table.schema().to_json(),
        "protocol": table.protocol(),
    }


def _from_checkpoint_alone(uri: str, copy: Path) -> str:
    """A copy of the table whose log is its newest checkpoint and nothing before it."""
    shutil.copytree(uri, copy)
    version = int(orjson.loads((copy / "_delta_log" / "_last_checkpoint").read_bytes())["version"])
    for commit in (copy / "_delta_log").glob("*.json"):
        if int(commit.name.split(".")[0]) <= version:
            commit.unlink()
    return str(copy)


def _removed_paths(checkpoint: Path) -> set[str]:
    removes = pq.read_table(checkpoint, columns=["remove"]).column("remove").drop_null()
    return {row["path"] for row in removes.to_pylist()}


def test_the_checkpoint_holds_what_delta_rs_loads_from_the_whole_log(tmp_path: Path) -> None:
    for seed in range(6):
        rng = random.Random(seed)
        uri = str(tmp_path / f"events-{seed}")
        _append(uri, rng, app_version=0)
        for step in range(rng.randint(2, 5)):
            _append(uri, rng, app_version=step + 1)
        DeltaTable(uri).create_checkpoint()
        for step in range(rng.randint(3, 8)):
            roll = rng.random()
            if roll < 0.5:
                _swap_one_tenant(uri, rng, f"settled-{step}")
            elif roll < 0.8:
                _append(uri, rng, app_version=10 + step)
            else:
                DeltaTable(uri).delete(f"value > {rng.randint(0, 99)}")
        expected = _state(uri)
        by_delta_rs = tmp_path / f"by-delta-rs-{seed}"
        shutil.copytree(uri, by_delta_rs)
        DeltaTable(str(by_delta_rs)).create_checkpoint()
        version = DeltaTable(uri).version()

        assert write_checkpoint(DeltaLog(uri, None), version), seed

        alone = _from_checkpoint_alone(uri, tmp_path / f"alone-{seed}")
        assert _state(alone) == expected, seed
        name = f"{version:020d}.checkpoint.parquet"
        ours = Path(uri) / "_delta_log" / name
        assert _removed_paths(ours) == _removed_paths(by_delta_rs / "_delta_log" / name), seed
        last = orjson.loads((Path(uri) / "_delta_log" / "_last_checkpoint").read_bytes())
        assert last["version"] == version
        assert last["numOfAddFiles"] == len(expected["files"])  # type: ignore[arg-type]
        assert last["size"] == pq.ParquetFile(ours).metadata.num_rows


def test_tombstones_past_the_tables_retention_are_left_out(tmp_path: Path) -> None:
    uri = str(tmp_path / "events")
    rows = pa.table({"tenant": ["acme", "zeta"], "value": [1, 2]})
    write_deltalake(
        uri,
        rows,
        partition_by=["tenant"],
        configuration={"delta.deletedFileRetentionDuration": "interval 1 hour"},
    )
    DeltaTable(uri).create_checkpoint()
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    now_ms = 1_795_000_000_000
    old, recent = sorted(actions, key=lambda row: row["path"])
    delta_log = DeltaLog(uri, None)
    removes = [
        {"remove": {"path": row["path"], "deletionTimestamp": at_ms, "dataChange": True}}
        for row, at_ms in ((old, now_ms - 2 * 3_600_000), (recent, now_ms - 60_000))
    ]
    assert delta_log.try_commit(1, [{"commitInfo": {"timestamp": now_ms}}, *removes])

    log_checkpoint_now = log_checkpoint.time.time
    try:
        log_checkpoint.time.time = lambda: now_ms / 1000  # type: ignore[assignment]
        assert write_checkpoint(delta_log, 1)
    finally:
        log_checkpoint.time.time = log_checkpoint_now  # type: ignore[assignment]

    checkpoint = Path(uri) / "_delta_log" / f"{1:020d}.checkpoint.parquet"
    assert _removed_paths(checkpoint) == {recent["path"]}
    assert DeltaTable(_from_checkpoint_alone(uri, tmp_path / "alone")).file_uris() == []


def test_it_declines_a_log_without_a_checkpoint_to_start_from(tmp_path: Path) -> None:
    uri = str(tmp_path / "events")
    write_deltalake(uri, pa.table({"tenant": ["acme"], "value": [1]}), partition_by=["tenant"])
    write_deltalake(uri, pa.table({"tenant": ["acme"], "value": [2]}), mode="append")

    assert not write_checkpoint(DeltaLog(uri, None), 1)
    assert not list((Path(uri) / "_delta_log").glob("*.parquet"))


def test_partition_values_keep_their_nulls_and_a_tagged_file_leaves_the_checkpoint_to_delta_rs(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "events")
    rows = pa.table({"tenant": ["acme", None], "day": ["d1", None], "value": [1, 2]})
    write_deltalake(uri, rows, partition_by=["tenant", "day"])
    DeltaTable(uri).create_checkpoint()
    write_deltalake(uri, rows, mode="append", partition_by=["tenant", "day"])
    expected = _state_by_partition(uri)
    delta_log = DeltaLog(uri, None)

    assert write_checkpoint(delta_log, 1)
    assert _state_by_partition(_from_checkpoint_alone(uri, tmp_path / "alone")) == expected

    # Tags the checkpoint would drop: this writer declines, and writes nothing.
    tagged = {
        "add": {
            "path": "tenant=zeta/day=d1/tagged.parquet",
            "partitionValues": {"tenant": "zeta", "day": "d1"},
            "size": 1,
            "modificationTime": 1_795_000_000_000,
            "dataChange": True,
            "tags": {"origin": "elsewhere"},
        }
    }
    assert delta_log.try_commit(2, [{"commitInfo": {"timestamp": 1_795_000_000_000}}, tagged])
    assert not write_checkpoint(delta_log, 2)
    assert not (Path(uri) / "_delta_log" / f"{2:020d}.checkpoint.parquet").exists()


def _state_by_partition(uri: str) -> list[dict[str, object]]:
    adds = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
    columns = ["path", "size_bytes", "partition.tenant", "partition.day", "num_records"]
    return sorted(adds.select(columns).to_pylist(), key=lambda row: str(row["path"]))


def test_a_table_without_partitions_is_checkpointed_with_empty_partition_values(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "status")
    write_deltalake(uri, pa.table({"tenant": ["acme"], "value": [1]}))
    DeltaTable(uri).create_checkpoint()
    write_deltalake(uri, pa.table({"tenant": ["zeta"], "value": [2]}), mode="append")

    assert write_checkpoint(DeltaLog(uri, None), 1)
    alone = DeltaTable(_from_checkpoint_alone(uri, tmp_path / "alone"))
    assert sorted(alone.to_pyarrow_table()["value"].to_pylist()) == [1, 2]
