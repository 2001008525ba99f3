"""The lake at scale without Spark: staged files, settling, optimize, log checkpoints, streams
sharing a lake, and all of them at once.

Files are written by the executor-side code (`write_task_files`, `write_settled_files`) and
committed by the driver's (`commit_files`, `settle`), exactly as a micro-batch and a compaction
do, only called directly (a compaction's Spark job only moves the same rows between tasks).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from storage.lake.commits import FencedError
from storage.lake.delta_lake import DeltaLake
from storage.lake.delta_log import DeltaLog
from storage.lake.file_names import BatchFiles, SettledFiles
from storage.lake.file_writer import write_task_files
from storage.lake.newest_tables import NewestTables
from storage.lake.packed_rows import packed_table
from storage.lake.snapshot_reader import read_newest_first
from storage.lake.table_files import TableFiles
from storage.lake.tables import EVENTS, STAGED, TENANT_STATUS
from storage.lake.writer_lease import WriterLease
from storage.lake.written_files import WrittenFile
from storage.query.query_service import OPERATOR, QueryService
from storage.upkeep.compaction import PACK_FILES, Compaction
from storage.upkeep.compaction_tasks import read_staged_files, write_settled_files
from storage.upkeep.stream_vacuum import StreamVacuum
from streaming.observe.stream_status import latest_of_each, latest_per_key, latest_status_rows
from streaming.state.configured_status import status_rows
from streaming.state.union_rows import union_table
from tenants.models import QueryLimits
from tenants.settings import StreamSettings
from tests.support.timestamps import T0_MS


def _event_rows(tenants: list[str], batch_id: int) -> pa.Table:
    count = len(tenants)
    return union_table(
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
        },
        count,
    )


def _commit_batch(
    lake: DeltaLake, stream: str, epoch: int, batch_id: int, tenants: list[str], task: int = 0
) -> bool:
    target = BatchFiles(lake.root, None, stream, epoch, batch_id, (EVENTS.name,))
    batches = write_task_files(target, lambda: task)(
        iter(packed_table(_event_rows(tenants, batch_id)).to_batches())
    )
    files = [WrittenFile.from_row(row) for batch in batches for row in batch.to_pylist()]
    return lake.commit_files(EVENTS, files, stream, batch_id, epoch)


def _settle(
    lake: DeltaLake, stream: str, epoch: int, version: int, log_checkpoint_files: int | None = None
) -> bool:
    """What `storage.upkeep.compaction` does, in one process: read this stream's staged files, write
    their rows as settled files, commit the swap."""
    staged = lake.staged_files(EVENTS, stream)
    if not staged:
        return False
    paths = pa.RecordBatch.from_pylist([{"path": file.path} for file in staged])
    rows = list(read_staged_files(lake.root, None, EVENTS.name)(iter([paths])))
    target = SettledFiles(lake.root, None, stream, epoch, f"v{version}", EVENTS.name)
    written = write_settled_files(target)(iter(rows))
    settled = [WrittenFile.from_row(row) for batch in written for row in batch.to_pylist()]
    return lake.settle(
        EVENTS, staged, settled, stream, version, epoch, log_checkpoint_files=log_checkpoint_files
    )


def _paths(lake: DeltaLake) -> list[str]:
    """The data files of the current version, relative to the table."""
    actions = DeltaTable(lake.table_uri(EVENTS)).get_add_actions(flatten=True)
    return sorted(str(path) for path in actions.column("path").to_pylist())


def _lake(tmp_path: Path) -> DeltaLake:
    lake = DeltaLake(str(tmp_path / "lake"))
    lake.ensure_tables()
    return lake


def test_a_task_stages_one_file_named_by_stream_epoch_and_batch_then_it_settles_per_tenant(
    tmp_path: Path,
) -> None:
    lake = _lake(tmp_path)
    epoch = WriterLease.for_stream(lake, StreamSettings(name="orders")).acquire()
    assert _commit_batch(lake, "orders", epoch, 0, ["acme", "acme", "globex"], task=3)

    [staged] = _paths(lake)  # one file, whatever the tenants
    assert staged.startswith(f"layout_tenant={STAGED}/")
    assert f"part-orders-e{epoch}-b0000000000-t00003-" in staged

    assert _settle(lake, "orders", epoch, version=0)
    settled = _paths(lake)
    assert len(settled) == 2  # one per tenant partition
    for path in settled:
        assert path.startswith(
            (
                "layout_tenant=acme/layout_source=web/layout_window_date=2026-01-01/",
                "layout_tenant=globex/",
            )
        )
    rows = DeltaTable(lake.table_uri(EVENTS)).to_pandas()
    assert sorted(rows["tenant"]) == ["acme", "acme", "globex"]
    assert not _settle(lake, "orders", epoch, version=1)  # nothing staged any more


def test_a_zombie_instance_cannot_settle_staged_rows(tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    zombie = WriterLease.for_stream(lake, StreamSettings(name="orders", lease_ttl="1s"))
    old_epoch = zombie.acquire()
    assert _commit_batch(lake, "orders", old_epoch, 0, ["acme"])
    successor = WriterLease.for_stream(lake, StreamSettings(name="orders", lease_ttl="1s"))
    later_ms = zombie.clock_ms() + 1_001
    successor.clock_ms = lambda: later_ms  # the zombie went silent for longer than its lease
    new_epoch = successor.acquire()
    assert new_epoch > old_epoch
    with pytest.raises(FencedError):
        _settle(lake, "orders", old_epoch, version=0)
    assert _paths(lake)[0].startswith(f"layout_tenant={STAGED}/")
    assert _settle(lake, "orders", new_epoch, version=0)


def test_a_retried_batch_writes_the_same_file_names(tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    target = BatchFiles(lake.root, None, "orders", 1, 7, (EVENTS.name,))
    names = []
    for _attempt in range(2):
        written = write_task_files(target, lambda: 0)(
            iter(packed_table(_event_rows(["acme"], 7)).to_batches())
        )
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
        assert _settle(lake, "orders", epoch, batch_id)
    assert _commit_batch(lake, "orders", epoch, 6, tenants)  # staged: the stream's to settle
    before = DeltaTable(lake.table_uri(EVENTS))
    rows_before = before.to_pandas().sort_values("offset").reset_index(drop=True)
    assert len(_paths(lake)) == 31

    done = lake.optimize()

    after = DeltaTable(lake.table_uri(EVENTS))
    assert done["events"].files_removed == 30
    assert len(_paths(lake)) == 6  # one file per tenant partition, and the staged one
    rows_after = after.to_pandas().sort_values("offset").reset_index(drop=True)
    pd.testing.assert_frame_equal(rows_after, rows_before)
    checkpoints = list((tmp_path / "lake" / "events" / "_delta_log").glob("*.checkpoint.parquet"))
    assert checkpoints, "no log checkpoint was written"
    # The stream goes on committing and settling after an optimize, exactly once.
    assert _commit_batch(lake, "orders", epoch, 7, tenants)
    assert not _commit_batch(lake, "orders", epoch, 7, tenants)
    assert _settle(lake, "orders", epoch, 7)
    assert len(DeltaTable(lake.table_uri(EVENTS)).to_pandas()) == 40


def _log_checkpoints(lake: DeltaLake) -> list[int]:
    log = Path(lake.table_uri(EVENTS)) / "_delta_log"
    return sorted(int(path.name.split(".")[0]) for path in log.glob("*.checkpoint.parquet"))


def test_a_compaction_that_swaps_many_files_checkpoints_the_log_and_a_small_one_does_not(
    tmp_path: Path,
) -> None:
    lake = _lake(tmp_path)
    epoch = WriterLease.for_stream(lake, StreamSettings(name="orders")).acquire()
    # Three staged files become 40 settled ones: 43 actions.
    for batch_id, task in enumerate(range(3)):
        assert _commit_batch(lake, "orders", epoch, batch_id, [f"t{i}" for i in range(40)], task)
    assert _settle(lake, "orders", epoch, version=0, log_checkpoint_files=44)
    assert _log_checkpoints(lake) == []

    for batch_id, task in enumerate(range(3), start=3):
        assert _commit_batch(lake, "orders", epoch, batch_id, [f"t{i}" for i in range(40)], task)
    assert _settle(lake, "orders", epoch, version=1, log_checkpoint_files=43)

    table = DeltaTable(lake.table_uri(EVENTS))
    assert _log_checkpoints(lake) == [table.version()]
    # The checkpoint holds the table as the log does: every row once.
    assert len(table.to_pandas()) == 240
    assert len(_paths(lake)) == 80  # a settled file per tenant and compaction


def test_a_streams_hundredth_commit_to_a_table_checkpoints_its_log(tmp_path: Path) -> None:
    """As Delta writers do every `delta.checkpointInterval` commits: without, a restarting
    stream, and every reader, replayed each batch's commit since the last big compaction."""
    lake = _lake(tmp_path)
    epoch = WriterLease.for_stream(lake, StreamSettings(name="orders")).acquire()
    table_uri = lake.table_uri(EVENTS)
    for batch_id in range(120):  # bounded: the table passes version 100 well within it
        assert _commit_batch(lake, "orders", epoch, batch_id, ["acme", f"t{batch_id % 7}"])
        lake.wait_for_checkpoints()  # written beside the batches
        version = DeltaTable(table_uri).version()
        assert _log_checkpoints(lake) == ([100] if version >= 100 else [])
    assert DeltaLog(table_uri, None).checkpointed_version() == 100
    assert len(DeltaTable(table_uri).to_pandas()) == 240  # read from the checkpoint on
    assert lake.committed_batch(EVENTS, "orders") == 119


def test_the_query_services_files_of_each_tenant_are_delta_rs_s_at_every_step(
    tmp_path: Path,
) -> None:
    """`NewestTables` indexes a tenant's files on its own, from the checkpoint (none yet, then
    a compaction's) and the commits after it, read once for every tenant: batches and settles
    list, tenant by tenant, what delta-rs lists at that version, and the version is delta-rs'."""
    lake = _lake(tmp_path)
    epoch = WriterLease.for_stream(lake, StreamSettings(name="orders")).acquire()
    newest = NewestTables(lake)
    tenants = [f"t{number}" for number in range(6)]
    rng = random.Random(11)

    def same_as_delta_rs() -> None:
        loaded = DeltaTable(lake.table_uri(EVENTS))
        for tenant in [*tenants, "nobody"]:
            files = newest.files(EVENTS, tenant)
            assert files.version == loaded.version()
            expected = TableFiles.of_table(loaded, only_tenant=tenant).files_of(tenant)
            assert files.files_of(tenant) == expected, tenant
        # What an operator's statement needs (Spark reads its files): no index of them.
        assert newest.version(EVENTS) == loaded.version()

    batch_id = 0
    for compaction in range(3):  # no checkpoint, then the second compaction's
        for _ in range(4):
            assert _commit_batch(lake, "orders", epoch, batch_id, rng.sample(tenants, 3))
            batch_id += 1
            same_as_delta_rs()
        checkpoint_at = 1 if compaction == 1 else None
        assert _settle(lake, "orders", epoch, compaction, log_checkpoint_files=checkpoint_at)
        same_as_delta_rs()
    assert _log_checkpoints(lake)

    newest.follow(0.05)
    try:
        assert _commit_batch(lake, "orders", epoch, batch_id, ["t0"])
        version = DeltaTable(lake.table_uri(EVENTS)).version()
        for _ in range(200):  # bounded: 10 s
            if newest.files(EVENTS, "t0").version == version:
                break
            time.sleep(0.05)
        same_as_delta_rs()
    finally:
        newest.close()


def test_an_operators_statement_counts_every_tenant_and_sees_each_new_commit(
    tmp_path: Path, spark: SparkSession
) -> None:
    """The operator's statements are Spark's to read: the service knows only the tables'
    versions, and a remembered result is answered again only while they stand."""
    lake = _lake(tmp_path)
    epoch = WriterLease.for_stream(lake, StreamSettings(name="orders")).acquire()
    service = QueryService(spark, lake, lambda scope: QueryLimits())
    statement = "SELECT tenant, count(*) AS n FROM events GROUP BY tenant ORDER BY tenant"

    def counts() -> dict[str, int]:
        table = service.run(OPERATOR, statement).table
        return dict(zip(table["tenant"].to_pylist(), table["n"].to_pylist(), strict=True))

    assert _commit_batch(lake, "orders", epoch, 0, ["t0", "t1"])
    assert counts() == {"t0": 1, "t1": 1}
    assert _commit_batch(lake, "orders", epoch, 1, ["t1", "t2"])
    assert counts() == {"t0": 1, "t1": 2, "t2": 1}
    assert _settle(lake, "orders", epoch, 0)
    assert counts() == {"t0": 1, "t1": 2, "t2": 1}
    assert _commit_batch(lake, "orders", epoch, 2, ["t0"])
    assert counts() == {"t0": 2, "t1": 2, "t2": 1}


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
    # Each stream settles its own staged rows, and only those.
    assert _settle(lake, "stream-0", epochs["stream-0"], 7)
    rows = DeltaTable(lake.table_uri(EVENTS)).to_pandas()
    settled = rows[rows["layout_tenant"] != STAGED]
    assert set(settled["tenant"]) == {"stream-0"} and len(settled) == 8
    others = [file.path for stream in streams[1:] for file in lake.staged_files(EVENTS, stream)]
    assert sorted(others) == [file.path for file in lake.staged_files(EVENTS)]


def test_batches_settling_optimize_and_vacuum_at_once_lose_and_duplicate_nothing(
    tmp_path: Path,
) -> None:
    lake = _lake(tmp_path)
    epoch = WriterLease.for_stream(lake, StreamSettings(name="orders")).acquire()
    tenants = [f"t{i}" for i in range(6)]
    batches = 12
    failures: list[BaseException] = []
    done = threading.Event()

    def stream() -> None:
        try:
            for batch_id in range(batches):
                assert _commit_batch(lake, "orders", epoch, batch_id, tenants)
                if batch_id % 3 == 2:
                    _settle(lake, "orders", epoch, batch_id)
        except BaseException as error:  # reported by the main thread
            failures.append(error)
        finally:
            done.set()

    def maintenance() -> None:
        try:
            for _ in range(20):  # bounded; usually ends with the stream
                if done.is_set():
                    return
                lake.optimize()
                lake.vacuum(retention_ms=3_600_000, dry_run=False)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=stream), threading.Thread(target=maintenance)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert not failures, failures
    _settle(lake, "orders", epoch, batches)
    rows = DeltaTable(lake.table_uri(EVENTS)).to_pandas()
    assert len(rows) == batches * len(tenants)
    assert not rows.duplicated(["partition", "offset"]).any()
    assert not any(path.startswith(f"layout_tenant={STAGED}/") for path in _paths(lake))


def _commit_status(lake: DeltaLake, epoch: int, batch_id: int, keys: list[tuple[str, str]]) -> None:
    target = BatchFiles(lake.root, None, "orders", epoch, batch_id, (TENANT_STATUS.name,))
    rows = status_rows(keys, T0_MS + batch_id)
    written = write_task_files(target, lambda: 0)(iter(packed_table(rows).to_batches()))
    files = [WrittenFile.from_row(row) for batch in written for row in batch.to_pylist()]
    assert lake.commit_files(TENANT_STATUS, files, "orders", batch_id, epoch)


def test_the_latest_row_per_key_is_read_from_the_newest_batches_only(tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    epoch = WriterLease.for_stream(lake, StreamSettings(name="orders")).acquire()
    keys = [("acme", "web"), ("acme", "billing"), ("globex", "web")]
    for batch_id in range(30):
        # Every key until batch 24; then only acme/web has records.
        _commit_status(lake, epoch, batch_id, keys if batch_id <= 24 else keys[:1])

    columns = TENANT_STATUS.schema.names
    read = read_newest_first(
        lake.open(TENANT_STATUS), TENANT_STATUS.schema, None, columns, latest_of_each(set(keys)), 2
    )
    assert min(read["batch_id"].to_pylist()) >= 24  # 6 of 30 files, in 3 reads of 2
    everything = lake.read_arrow(TENANT_STATUS, columns=columns)
    assert latest_per_key(read).equals(latest_per_key(everything))


def _status_history(rows: list[tuple[str, str, int]]) -> pa.Table:
    """`tenant_status` rows of (tenant, source, batch_id), the other columns null."""
    return pa.Table.from_pylist(
        [{"tenant": tenant, "source": source, "batch_id": batch} for tenant, source, batch in rows],
        schema=TENANT_STATUS.schema,
    )


def test_a_key_s_latest_status_row_is_found_when_a_packed_file_spans_many_batches(
    tmp_path: Path,
) -> None:
    lake = _lake(tmp_path)
    uri = lake.table_uri(TENANT_STATUS)
    # A packed file read first (its newest batch is 100) holds acme/web's batch 0; the newest
    # read of 64 files sees every key; acme/web's batch 20 is in the 65th file only.
    write_deltalake(
        uri, _status_history([("acme", "web", 0), ("globex", "web", 100)]), mode="append"
    )
    for batch in range(37, 100):
        write_deltalake(uri, _status_history([("initech", "web", batch)]), mode="append")
    write_deltalake(uri, _status_history([("acme", "web", 20)]), mode="append")

    keys = {("acme", "web"), ("globex", "web"), ("initech", "web")}
    latest = latest_status_rows(lake, keys)

    newest = dict(zip(latest["tenant"].to_pylist(), latest["batch_id"].to_pylist(), strict=True))
    assert newest == {"acme": 20, "globex": 100, "initech": 99}


def test_compaction_packs_the_status_history_once_it_holds_many_files_and_keeps_every_row(
    tmp_path: Path,
) -> None:
    lake = _lake(tmp_path)
    epoch = WriterLease.for_stream(lake, StreamSettings(name="orders")).acquire()
    keys = [("acme", "web"), ("acme", "billing"), ("globex", "web")]
    compaction = Compaction(lake, "orders", epoch, tasks=1)
    for batch_id in range(PACK_FILES):
        compaction.pack_appended_tables()  # fewer files than PACK_FILES: left as they are
        # Every key until batch 24, then acme/web alone: the others' latest rows get packed.
        _commit_status(lake, epoch, batch_id, keys if batch_id <= 24 else keys[:1])
    assert len(lake.open(TENANT_STATUS).file_uris()) == PACK_FILES
    before = lake.read_arrow(TENANT_STATUS).sort_by(
        [("batch_id", "ascending"), ("source", "ascending")]
    )

    compaction.pack_appended_tables()
    _commit_status(lake, epoch, PACK_FILES, keys[:1])  # the stream goes on appending

    assert len(lake.open(TENANT_STATUS).file_uris()) == 2
    after = lake.read_arrow(TENANT_STATUS).sort_by(
        [("batch_id", "ascending"), ("source", "ascending")]
    )
    assert after.slice(0, before.num_rows).equals(before)
    assert after.num_rows == before.num_rows + 1
    latest = latest_status_rows(lake, set(keys))
    assert latest.equals(latest_per_key(after))
    assert latest["batch_id"].to_pylist() == [24, PACK_FILES, 24]  # acme/billing, acme/web, globex


def test_one_tenants_files_are_its_partition_and_the_staged_files_that_may_hold_it(
    tmp_path: Path,
) -> None:
    lake = _lake(tmp_path)
    epoch = WriterLease.for_stream(lake, StreamSettings(name="orders")).acquire()
    tenants = [f"t{i:02d}" for i in range(40)]
    assert _commit_batch(lake, "orders", epoch, 0, tenants)
    assert _settle(lake, "orders", epoch, version=0)
    assert _commit_batch(lake, "orders", epoch, 1, tenants[:10], task=1)  # staged: t00-t09
    assert _commit_batch(lake, "orders", epoch, 2, tenants[30:], task=2)  # staged: t30-t39
    table = DeltaTable(lake.table_uri(EVENTS))

    for tenant in ("t05", "t20", "t35"):
        files = TableFiles.of_table(table).files_of(tenant)
        assert files == TableFiles.of_table(table, only_tenant=tenant).files_of(tenant)
        holding = {
            uri
            for uri in table.file_uris()
            if tenant in pq.read_table(uri, columns=["tenant"])["tenant"].to_pylist()
        }
        # Every file with the tenant's rows, and no other tenant's settled partition.
        assert holding <= set(files), tenant
        assert all(f"layout_tenant={tenant}/" in uri or STAGED in uri for uri in files)
        assert all(size == Path(uri).stat().st_size for uri, size in files.items())
    assert (
        len(TableFiles.of_table(table).files_of("t20")) == 1
    )  # no staged file's statistics cover it


def test_the_stream_s_vacuum_deletes_only_files_older_versions_needed_past_retention(
    tmp_path: Path,
) -> None:
    lake = _lake(tmp_path)
    epoch = WriterLease.for_stream(lake, StreamSettings(name="orders")).acquire()
    keys = [("acme", "web"), ("globex", "web")]
    for batch_id in range(PACK_FILES):
        _commit_status(lake, epoch, batch_id, keys)
    Compaction(lake, "orders", epoch, tasks=1).pack_appended_tables()
    before = lake.read_arrow(TENANT_STATUS)
    folder = Path(lake.table_uri(TENANT_STATUS))
    # A batch in flight: written, not yet committed. Only `tenant-windows vacuum` may take it.
    in_flight = folder / "in-flight.parquet"
    pq.write_table(before.slice(0, 1), in_flight)
    data_files = lambda: {  # noqa: E731
        path.name for path in folder.rglob("*.parquet") if "_delta_log" not in path.parts
    }
    assert len(data_files()) == PACK_FILES + 2  # the packed file, and the in-flight one

    hour_ms = 3_600_000
    StreamVacuum(lake, retention_ms=hour_ms, interval_ms=hour_ms).run()
    assert len(data_files()) == PACK_FILES + 2  # removed a moment ago: kept

    StreamVacuum(lake, retention_ms=0, interval_ms=hour_ms).run()
    current = {Path(uri).name for uri in lake.open(TENANT_STATUS).file_uris()}
    assert data_files() == current | {in_flight.name}
    assert lake.read_arrow(TENANT_STATUS).sort_by("batch_id").equals(before.sort_by("batch_id"))
