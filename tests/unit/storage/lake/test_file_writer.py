"""The executors' Parquet writer on its own (no Spark): staged files per task, settled files per
partition, and Delta statistics that describe the file they are attached to; the compaction
tasks and manifests that use it (`storage.upkeep.compaction_tasks`, `compaction_manifests`)."""

from __future__ import annotations

import functools
import itertools
import json
import random
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyarrow.fs import LocalFileSystem

from storage.lake import file_writer
from storage.lake.file_names import (
    BatchFiles,
    MergeFiles,
    SettledFiles,
    run_inputs_digest,
    run_oldest_ms,
    stream_of_staged_file,
    write_task_of_staged_file,
)
from storage.lake.file_stats import SETTLED_FILE_STATS, split_by_partition
from storage.lake.file_writer import PLAIN_FILE_ROWS, write_task_files
from storage.lake.lake_filesystem import write_file
from storage.lake.packed_rows import packed_table
from storage.lake.tables import (
    ALL_TABLES,
    EVENTS,
    STAGED,
    WINDOWS,
    TableSpec,
    rows_for_table,
    with_layout,
)
from storage.lake.written_files import WRITTEN_FILE_SCHEMA, WrittenFile
from storage.upkeep.compaction_manifests import Manifests
from storage.upkeep.compaction_tasks import (
    RUN_ROW_GROUP_ROWS,
    TaskWriter,
    compact_write_tasks,
    read_staged_files,
    write_merged_files,
    write_settled_files,
    write_slice_runs,
)
from storage.upkeep.settle_slices import (
    SLICE_BUCKETS,
    plan_slices,
    slice_digest,
    slice_of_buckets,
    tenant_bucket,
    tenant_buckets,
)
from streaming.state.union_rows import union_table
from tests.support.timestamps import T0_MS

TENANTS = [f"t{number:03d}" for number in range(150)]


def _pane_rows(count: int, seed: int) -> pa.Table:
    """Union rows of `windows` panes for many tenants, in no particular order."""
    rng = random.Random(seed)
    starts = [
        T0_MS + rng.randrange(0, 3) * 86_400_000 + rng.randrange(0, 60) * 60_000
        for _ in range(count)
    ]
    return union_table(
        {
            "kind": [WINDOWS.name] * count,
            "tenant": [rng.choice(TENANTS) for _ in range(count)],
            "source": [rng.choice(["web", "billing"]) for _ in range(count)],
            "window_id": [f"w{index}" for index in range(count)],  # unique, as panes are
            "window_start_ms": starts,
            "window_end_ms": [start + 60_000 for start in starts],
            "pane_index": [rng.randrange(0, 3) for _ in range(count)],
            "timing": ["ON_TIME"] * count,
            "is_final": [False] * count,
            "count": [rng.randrange(1, 100) for _ in range(count)],
            "metrics": [[] for _ in range(count)],
            "merged_window_ids": [[] for _ in range(count)],
            "watermark_ms": starts,
        },
        count,
    )


def _assert_stats_describe_their_file(root: Path, files: list[WrittenFile]) -> None:
    """Each file's statistics are true of its content; a settled file's are those of
    `SETTLED_FILE_STATS` only, a staged file's (or a run's) are every column's."""
    for file in files:
        content = pq.read_table(root / file.table_name / file.path)
        stats = json.loads(file.stats)
        assert stats["numRecords"] == content.num_rows == file.num_records
        if file.partition_values["layout_tenant"] == STAGED:
            described = {f.name for f in content.schema if not pa.types.is_nested(f.type)}
        else:
            described = set(SETTLED_FILE_STATS)
        assert set(stats["nullCount"]) == described - set(file.partition_values), file.path
        for column in {"tenant", "source", "pane_index", "count", "batch_id"} & described:
            values = content[column].to_pylist()
            assert stats["minValues"][column] == min(values), (file.path, column)
            assert stats["maxValues"][column] == max(values), (file.path, column)
        # Dates and timestamps as Delta writes them: ISO-8601, timestamps in UTC to the
        # millisecond; a reader that skips files by them compares these strings' instants.
        for column in {"window_start", "window_end", "window_date"} & described:
            if column not in content.column_names:
                continue
            values = content[column].to_pylist()
            assert stats["minValues"][column] == _delta_text(min(values)), (file.path, column)
            assert stats["maxValues"][column] == _delta_text(max(values)), (file.path, column)
        for column in set(stats["nullCount"]):
            assert stats["nullCount"][column] == content[column].null_count, (file.path, column)


def _delta_text(value: date | datetime) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return value.isoformat()


def test_a_task_writes_one_staged_file_per_table_whatever_the_tenant_count(tmp_path: Path) -> None:
    union = _pane_rows(2_000, seed=1)
    target = BatchFiles(str(tmp_path), None, "s", 1, 7, (WINDOWS.name,))
    [written] = list(
        write_task_files(target, task_partition=lambda: 3)(iter(packed_table(union).to_batches()))
    )
    files = [WrittenFile.from_row(row) for row in written.to_pylist()]
    assert len(files) == 1
    assert files[0].partition_values == {
        "layout_tenant": STAGED,
        "layout_source": None,
        "layout_window_date": None,
    }
    assert files[0].path.endswith("-b0000000007-t00003-" + files[0].path[-20:])
    _assert_stats_describe_their_file(tmp_path, files)


def test_settled_files_hold_one_partition_each_with_their_own_statistics(tmp_path: Path) -> None:
    # Many partitions in one task: pyarrow's grouping does not keep the order of the sorted
    # runs, and statistics were once attached to the wrong file.
    rows = rows_for_table(_pane_rows(3_000, seed=2), WINDOWS, batch_id=7)
    target = SettledFiles(str(tmp_path), None, "s", 1, "abc", WINDOWS.name)
    written = list(write_settled_files(target)(iter(rows.to_batches())))
    files = [WrittenFile.from_row(row) for batch in written for row in batch.to_pylist()]
    partitions = {tuple(file.partition_values.values()) for file in files}
    assert len(files) == len(partitions) > 300
    for file in files:
        content = pq.read_table(tmp_path / WINDOWS.name / file.path)
        assert set(content["tenant"].to_pylist()) == {file.partition_values["layout_tenant"]}
    _assert_stats_describe_their_file(tmp_path, files)
    assert sum(file.num_records for file in files) == rows.num_rows


def test_a_file_of_a_few_rows_is_plain_and_a_big_one_compressed(tmp_path: Path) -> None:
    # Most settled files at many tenants hold a few rows: encoding them plainly is what keeps
    # a big settle's CPU down, and a big file keeps its compression and row-group statistics.
    rows = rows_for_table(_pane_rows(3_000, seed=5), WINDOWS, batch_id=7)
    big_tenant = pa.array(["acme"] * rows.num_rows)
    big = rows.set_column(rows.schema.get_field_index("tenant"), "tenant", big_tenant).filter(
        pc.equal(rows["source"], rows["source"][0])
    )
    assert big.num_rows > PLAIN_FILE_ROWS
    small = rows.slice(0, 1)
    for name, table in (("small", small), ("big", big)):
        target = SettledFiles(str(tmp_path / name), None, "s", 1, "abc", WINDOWS.name)
        batches = list(write_settled_files(target)(iter(table.to_batches())))
        files = [WrittenFile.from_row(row) for b in batches for row in b.to_pylist()]
        for file in files:
            path = tmp_path / name / WINDOWS.name / file.path
            column = pq.ParquetFile(path).metadata.row_group(0).column(0)
            plain = file.num_records <= PLAIN_FILE_ROWS
            assert column.compression == ("UNCOMPRESSED" if plain else "SNAPPY")
            assert column.is_stats_set is not plain
            # Either way the rows read back as written.
            assert pq.read_table(path).num_rows == file.num_records
        assert any(file.num_records > PLAIN_FILE_ROWS for file in files) is (name == "big")
        _assert_stats_describe_their_file(tmp_path / name, files)


def test_a_batchs_events_file_has_no_dictionary_for_a_records_own_values(tmp_path: Path) -> None:
    # A dictionary of values each row has its own was half the encoding time of a batch's
    # `events` file, for no smaller a file; the columns rows share keep theirs.
    count = 3_000
    union = union_table(
        {
            "kind": [EVENTS.name] * count,
            "tenant": [TENANTS[index % 3] for index in range(count)],
            "source": ["web"] * count,
            "window_id": [f"{T0_MS}-{T0_MS + 60_000}"] * count,
            "window_start_ms": [T0_MS] * count,
            "window_end_ms": [T0_MS + 60_000] * count,
            "pane_index": [0] * count,
            "timing": ["ON_TIME"] * count,
            "event_time_ms": [T0_MS + index for index in range(count)],
            "event_id": [f"e{index}" for index in range(count)],
            "topic": ["events"] * count,
            "partition": [0] * count,
            "offset": list(range(count)),
            "kafka_timestamp_ms": [T0_MS + index for index in range(count)],
            "value": [f'{{"n": {index}}}'.encode() for index in range(count)],
        },
        count,
    )
    target = BatchFiles(str(tmp_path), None, "s", 1, 7, (EVENTS.name,))
    [written] = list(
        write_task_files(target, task_partition=lambda: 0)(iter(packed_table(union).to_batches()))
    )
    [file] = [WrittenFile.from_row(row) for row in written.to_pylist()]
    path = tmp_path / EVENTS.name / file.path
    group = pq.ParquetFile(path).metadata.row_group(0)
    dictionary = {
        group.column(index).path_in_schema: group.column(index).has_dictionary_page
        for index in range(group.num_columns)
    }
    assert set(EVENTS.row_unique) <= set(dictionary)
    assert not any(dictionary[name] for name in EVENTS.row_unique)
    assert dictionary["tenant"] and dictionary["window_id"]
    read = pq.read_table(path).sort_by("offset")
    assert read["event_id"].to_pylist() == [f"e{index}" for index in range(count)]
    assert read["payload"].to_pylist() == [f'{{"n": {index}}}' for index in range(count)]


def test_every_tables_row_unique_columns_are_its_own() -> None:
    for spec in ALL_TABLES:
        assert set(spec.row_unique) <= set(spec.schema.names), spec.name


def test_settled_files_are_a_function_of_their_rows_not_of_their_order(tmp_path: Path) -> None:
    rows = rows_for_table(_pane_rows(500, seed=3), WINDOWS, batch_id=7)
    shuffled = rows.take(pa.array(random.Random(4).sample(range(rows.num_rows), rows.num_rows)))
    contents = []
    for name, table in (("a", rows), ("b", shuffled)):
        target = SettledFiles(str(tmp_path / name), None, "s", 1, "abc", WINDOWS.name)
        batches = list(write_settled_files(target)(iter(table.to_batches(max_chunksize=64))))
        files = sorted(
            (WrittenFile.from_row(row) for b in batches for row in b.to_pylist()),
            key=lambda file: file.path,
        )
        contents.append(
            [
                (file.path, (tmp_path / name / WINDOWS.name / file.path).read_bytes())
                for file in files
            ]
        )
    assert contents[0] == contents[1]


def test_a_task_with_many_partitions_writes_them_a_chunk_at_a_time_to_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A task's quarter of a million partitions at a million tenants are written a chunk at a
    # time, so a worker's memory is bounded; each partition must still get one file, its
    # bytes and statistics the same as when all are split at once.
    rows = rows_for_table(_pane_rows(1_500, seed=6), WINDOWS, batch_id=7)
    shuffled = rows.take(pa.array(random.Random(7).sample(range(rows.num_rows), rows.num_rows)))
    listings = []
    for name, chunk in (("whole", 1_000_000), ("chunked", 7)):
        monkeypatch.setattr(file_writer, "PARTITIONS_PER_CHUNK", chunk)
        target = SettledFiles(str(tmp_path / name), None, "s", 1, "abc", WINDOWS.name)
        files = file_writer.write_partitions(
            LocalFileSystem(),
            str(tmp_path / name),
            WINDOWS,
            with_layout(shuffled, WINDOWS, settled=True),
            target.file_name,
            "a test",
            target,
            stats_columns=SETTLED_FILE_STATS,
        )
        assert len({file.path for file in files}) == len(files) > 7 * 20
        _assert_stats_describe_their_file(tmp_path / name, files)
        listings.append(
            sorted(
                (
                    file.path,
                    file.stats,
                    (tmp_path / name / WINDOWS.name / file.path).read_bytes(),
                )
                for file in files
            )
        )
    assert listings[0] == listings[1]


def _merge(root: Path, rows: pa.Table, settle_rows: int) -> list[WrittenFile]:
    target = MergeFiles(
        str(root), None, "web-1", 2, "0123456789abcdef", WINDOWS.name, write_task=5, oldest_ms=T0_MS
    )
    merge = write_merged_files(target, settle_rows)
    batches = list(merge(iter(rows.to_batches(max_chunksize=100))))
    return [WrittenFile.from_row(row) for batch in batches for row in batch.to_pylist()]


def test_a_merge_settles_the_keys_worth_a_file_and_runs_the_rest_in_one_staged_file(
    tmp_path: Path,
) -> None:
    rows = rows_for_table(_pane_rows(3_000, seed=5), WINDOWS, batch_id=7)
    per_key = {}
    for tenant, source in zip(rows["tenant"].to_pylist(), rows["source"].to_pylist(), strict=True):
        per_key[(tenant, source)] = per_key.get((tenant, source), 0) + 1
    settle_rows = sorted(per_key.values())[len(per_key) // 2]  # about half the keys settle
    big = {key for key, count in per_key.items() if count >= settle_rows}
    assert 0 < len(big) < len(per_key)

    files = _merge(tmp_path, rows, settle_rows)

    [run] = [file for file in files if file.partition_values["layout_tenant"] == STAGED]
    settled = [file for file in files if file is not run]
    assert run.path.rsplit("/", 1)[-1].startswith(f"run-web-1-e2-c0123456789abcdef-a{T0_MS}-t00005")
    assert stream_of_staged_file(run.path) == "web-1"
    assert run_oldest_ms(run.path) == T0_MS
    assert run_oldest_ms(settled[0].path) is None
    run_rows = pq.read_table(tmp_path / WINDOWS.name / run.path)
    run_keys = list(
        zip(run_rows["tenant"].to_pylist(), run_rows["source"].to_pylist(), strict=True)
    )
    assert set(run_keys) == set(per_key) - big
    assert run_keys == sorted(run_keys)  # a tenant's rows are together
    # ... in row groups whose statistics let a tenant's query skip the others.
    metadata = pq.ParquetFile(tmp_path / WINDOWS.name / run.path).metadata
    assert metadata.num_row_groups == -(-run_rows.num_rows // RUN_ROW_GROUP_ROWS)
    settled_keys = {
        (file.partition_values["layout_tenant"], file.partition_values["layout_source"])
        for file in settled
    }
    assert settled_keys == big
    # Every row once: in the run or in its key's settled files.
    assert sum(file.num_records for file in files) == rows.num_rows
    _assert_stats_describe_their_file(tmp_path, files)


def test_a_merge_is_a_function_of_its_rows_not_of_their_order(tmp_path: Path) -> None:
    rows = rows_for_table(_pane_rows(800, seed=6), WINDOWS, batch_id=7)
    shuffled = rows.take(pa.array(random.Random(7).sample(range(rows.num_rows), rows.num_rows)))
    contents = []
    for name, table in (("a", rows), ("b", shuffled)):
        files = sorted(_merge(tmp_path / name, table, settle_rows=6), key=lambda f: f.path)
        contents.append(
            [(f.path, (tmp_path / name / WINDOWS.name / f.path).read_bytes()) for f in files]
        )
    assert contents[0] == contents[1]
    assert any("/run-" in path for path, _ in contents[0])


def test_staged_file_names_say_which_stream_and_write_task_wrote_them_and_only_runs_an_age() -> (
    None
):
    batch = BatchFiles("/lake", None, "orders-eu", 3, 12, ("events",)).file_name(1, "events", "x")
    run = MergeFiles(
        "/lake", None, "orders-eu", 3, "f" * 16, "events", write_task=2, oldest_ms=1_795_000_000_000
    )
    assert stream_of_staged_file(f"layout_tenant=_staged/{batch}") == "orders-eu"
    assert stream_of_staged_file(f"layout_tenant=_staged/{run.run_name()}") == "orders-eu"
    assert write_task_of_staged_file(f"layout_tenant=_staged/{batch}") == 1
    assert write_task_of_staged_file(run.run_name()) == 2
    assert run_oldest_ms(run.run_name()) == 1_795_000_000_000
    assert run_oldest_ms(batch) is None
    foreign = "part-00000-optimized-by-someone.parquet"
    assert stream_of_staged_file(foreign) is None
    assert write_task_of_staged_file(foreign) is None


def _written(task: int, count: int) -> list[WrittenFile]:
    return [
        WrittenFile(
            table_name="events",
            path=f"layout_tenant=t{task}-{n}/part-{n}.parquet",
            size=100 + n,
            partition_values={"layout_tenant": f"t{task}-{n}"},
            modification_time=T0_MS,
            stats='{"numRecords": 1}',
            num_records=1,
        )
        for n in range(count)
    ]


def _path(file: WrittenFile) -> str:
    return file.path


def test_tasks_list_their_files_in_manifests_the_driver_reads_back(tmp_path: Path) -> None:
    manifests = Manifests(str(tmp_path), None, "_compaction_manifests/orders/epoch-3/events")
    rows = []
    for task, count in ((0, 3), (1, 0), (2, 2)):
        files = _written(task, count)

        def writer(_batches: object, files: list[WrittenFile] = files) -> Iterator[pa.RecordBatch]:
            yield pa.RecordBatch.from_pylist(
                [file.to_row() for file in files], schema=WRITTEN_FILE_SCHEMA
            )

        rows += [
            row
            for batch in manifests.listing(writer, task_partition=lambda task=task: task)(iter([]))
            for row in batch.to_pylist()
        ]
    assert [row["files"] for row in rows] == [3, 2]  # a task that wrote nothing lists nothing
    paths = [row["manifest"] for row in rows]
    read = WrittenFile.from_table(manifests.read(paths))
    assert sorted(read, key=_path) == sorted(_written(0, 3) + _written(2, 2), key=_path)
    # And one slice of tenants at a time (`settle_slices`): each file in exactly one slice.
    per_bucket = manifests.files_per_bucket(paths)
    assert per_bucket.sum() == 5
    slices = plan_slices(per_bucket, slice_files=2)
    assert len(slices) >= 3
    by_slice = [WrittenFile.from_table(manifests.read(paths, buckets)) for buckets in slices]
    assert all(len(files) <= 2 for files in by_slice)
    assert sorted((f for files in by_slice for f in files), key=_path) == sorted(read, key=_path)
    for buckets, files in zip(slices, by_slice, strict=True):
        assert all(
            tenant_bucket(str(f.partition_values["layout_tenant"])) in buckets for f in files
        )

    # A crashed instance's (an older epoch's) manifests go when a newer one compacts.
    older = Manifests(str(tmp_path), None, "_compaction_manifests/orders/epoch-2/events")
    leftover = pa.RecordBatch.from_pylist([_written(9, 1)[0].to_row()], WRITTEN_FILE_SCHEMA)
    list(older.listing(lambda _: iter([leftover]), task_partition=lambda: 0)(iter([])))
    Manifests.remove_older(str(tmp_path), None, "_compaction_manifests/orders", epoch=3)
    folder = tmp_path / "_compaction_manifests" / "orders"
    assert sorted(path.name for path in folder.iterdir()) == ["epoch-3"]
    manifests.remove()
    assert not (folder / "epoch-3" / "events").exists()


def test_rows_split_into_one_slice_per_partition_whatever_their_order() -> None:
    # A batch's quarantine rows come in Kafka's order, partitions interleaved, some values null.
    rows = pa.table(
        {
            "reason": ["bad_json", "unknown_tenant", "bad_json", None, "unknown_tenant", None],
            "day": [1, 1, 2, 1, 1, 1],
            "offset": [0, 1, 2, 3, 4, 5],
        }
    )
    splits = split_by_partition(rows, ("reason", "day"))
    offsets = {tuple(values.values()): part["offset"].to_pylist() for values, part, _ in splits}
    assert offsets == {
        ("bad_json", "1"): [0],
        ("bad_json", "2"): [2],
        ("unknown_tenant", "1"): [1, 4],
        (None, "1"): [3, 5],
    }
    for _, part, stats in splits:
        assert json.loads(stats)["numRecords"] == part.num_rows
    # Already grouped (as a table's sort order leaves them), the slices keep the order.
    grouped = rows.take(pa.array([3, 5, 0, 2, 1, 4]))
    assert [
        part["offset"].to_pylist() for _, part, _ in split_by_partition(grouped, ("reason",))
    ] == [
        [3, 5],
        [0, 2],
        [1, 4],
    ]


def test_a_file_written_again_is_replaced_whole(tmp_path: Path) -> None:
    # A retried task writes its files again under the same names, maybe shorter.
    path = str(tmp_path / "part.parquet")
    write_file(LocalFileSystem(), path, b"a longer first attempt")
    write_file(LocalFileSystem(), path, pa.py_buffer(b"retry"))
    assert (tmp_path / "part.parquet").read_bytes() == b"retry"


@pytest.mark.parametrize(
    "value", ["t000042", "web", "2026-11-30", "", "a b", "x/y", "\u00e9t\u00e9", "100%", "a=b"]
)
def test_a_settled_files_folder_and_name_are_those_earlier_releases_wrote(value: str) -> None:
    # A retried settle must name its files as the attempt before it did, whichever release
    # that was: Hive-quoted partition folders, and a name digest from uuid5.
    target = SettledFiles(
        root="/lake",
        storage_options=None,
        stream="s",
        writer_epoch=3,
        inputs_digest="c" * 16,
        table_name="events",
    )
    folder = file_writer._escape(value)
    assert folder == quote(value, safe="-_.")
    digest = uuid.uuid5(uuid.NAMESPACE_URL, f"events/layout_tenant={folder}").hex[:12]
    assert target.file_name(f"layout_tenant={folder}").endswith(f"-t00000-{digest}.parquet")


@pytest.mark.parametrize("seed", range(40))
def test_a_partitions_statistics_do_not_depend_on_the_rows_beside_it(seed: int) -> None:
    # A staged file's rows are all in one partition, whose statistics come from whole-column
    # aggregates; in a table of several partitions they come from a grouped aggregation. Both
    # must say the same of the same rows: nulls, empty strings, one row, several chunks.
    rng = random.Random(seed)
    rows = rng.randint(1, 30)

    def maybe(value: object) -> object:
        return None if rng.random() < 0.25 else value

    start = datetime(2026, 11, 30, tzinfo=UTC)
    mine = pa.table(
        {
            "layout": pa.array(["_staged"] * rows),
            "tenant": pa.array(
                [maybe(rng.choice(["", "a", "b", "\u00e9t\u00e9"])) for _ in range(rows)]
            ),
            "offset": pa.array([maybe(rng.randint(-9, 9)) for _ in range(rows)], pa.int64()),
            "at": pa.array(
                [
                    maybe(start + timedelta(microseconds=rng.randint(0, 10**11)))
                    for _ in range(rows)
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "day": pa.array([maybe(date(2026, 11, rng.randint(1, 30))) for _ in range(rows)]),
            "score": pa.array([maybe(rng.random()) for _ in range(rows)], pa.float64()),
        }
    )
    if rng.random() < 0.5:
        mine = pa.Table.from_batches(mine.to_batches(max_chunksize=rng.randint(1, 5)))
    other = mine.slice(0, 1).set_column(0, "layout", pa.array(["settled"]))
    for stats_columns in (None, ("tenant", "offset")):
        [(_, _, alone)] = split_by_partition(mine, ("layout",), stats_columns)
        beside = {
            values["layout"]: stats
            for values, _, stats in split_by_partition(
                pa.concat_tables([other, mine]), ("layout",), stats_columns
            )
        }
        assert json.loads(alone) == json.loads(beside["_staged"])
        assert json.loads(alone)["numRecords"] == rows


def test_a_compaction_without_a_shuffle_settles_each_write_tasks_keys_on_their_own(
    tmp_path: Path,
) -> None:
    union = _pane_rows(1_200, seed=5)
    # As the query leaves them: each key's rows in the staged files of one write task only.
    staged_by_task: dict[int, list[str]] = {}
    for batch_id in (7, 8):
        for task in (0, 1, 2):
            mine = union.filter(
                pa.array([int(t[1:]) % 3 == task for t in union["tenant"].to_pylist()])
            )
            target = BatchFiles(str(tmp_path), None, "s", 1, batch_id, (WINDOWS.name,))
            written = write_task_files(target, task_partition=lambda task=task: task)(
                iter(packed_table(mine).to_batches())
            )
            staged_by_task.setdefault(task, []).extend(
                row["path"] for batch in written for row in batch.to_pylist()
            )
    settled = SettledFiles(str(tmp_path), None, "s", 1, "0123456789abcdef", WINDOWS.name)

    def compact(number: int, tasks: int) -> list[WrittenFile]:
        compact = compact_write_tasks(
            str(tmp_path),
            None,
            WINDOWS.name,
            staged_by_task,
            tasks,
            lambda task: write_settled_files(replace(settled, write_task=task)),
        )
        batches = compact(iter([pa.record_batch({"id": [number]})]))
        return [WrittenFile.from_row(row) for batch in batches for row in batch.to_pylist()]

    files = compact(0, tasks=1)
    assert sum(file.num_records for file in files) == 2 * union.num_rows  # two batches
    partitions = [tuple(file.partition_values.values()) for file in files]
    assert len(partitions) == len(set(partitions))  # one file per partition
    for file in files:
        task = int(str(file.partition_values["layout_tenant"])[1:]) % 3
        assert f"-t{task:05d}-" in file.path
    # Of two Spark tasks, the second takes write task 1 alone.
    second = compact(1, tasks=2)
    assert {file.path for file in second} == {
        file.path for file in files if "-t00001-" in file.path
    }


def test_a_settle_in_slices_cuts_runs_holding_exactly_each_slices_settled_rows(
    tmp_path: Path,
) -> None:
    union = _pane_rows(1_500, seed=11)
    staged_by_task: dict[int, list[str]] = {}
    for task in (0, 1):
        mine = union.filter(pa.array([int(t[1:]) % 2 == task for t in union["tenant"].to_pylist()]))
        target = BatchFiles(str(tmp_path), None, "s", 1, 4, (WINDOWS.name,))
        written = write_task_files(target, task_partition=lambda task=task: task)(
            iter(packed_table(mine).to_batches())
        )
        staged_by_task[task] = [row["path"] for batch in written for row in batch.to_pylist()]
    settled = SettledFiles(str(tmp_path), None, "s", 1, "0123456789abcdef", WINDOWS.name)

    def listed(kind: str, writer: TaskWriter) -> tuple[Manifests, list[str]]:
        manifests = Manifests(str(tmp_path), None, f"_manifests/{kind}")
        tasks = compact_write_tasks(str(tmp_path), None, WINDOWS.name, staged_by_task, 2, writer)
        paths = []
        for number in (0, 1):
            listing = manifests.listing(tasks, task_partition=lambda number=number: number)
            for batch in listing(iter([pa.record_batch({"id": [number]})])):
                paths += batch.column("manifest").to_pylist()
        return manifests, paths

    manifests, paths = listed(
        "settled", lambda task: write_settled_files(replace(settled, write_task=task))
    )
    slices = plan_slices(manifests.files_per_bucket(paths), slice_files=60)
    assert len(slices) > 3
    runs_target = MergeFiles(**vars(settled), oldest_ms=T0_MS)
    cut, run_paths = listed(
        "runs",
        lambda task: write_slice_runs(
            replace(runs_target, write_task=task), slice_of_buckets(slices)
        ),
    )
    runs = WrittenFile.from_table(cut.read(run_paths))
    slice_of_digest = {
        slice_digest(settled.inputs_digest, index): index for index in range(len(slices))
    }

    def rows_of(files: list[WrittenFile]) -> list[tuple[object, ...]]:
        rows = [
            row
            for file in files
            for row in pq.read_table(tmp_path / WINDOWS.name / file.path).to_pylist()
        ]
        return sorted((row["tenant"], row["source"], row["window_id"]) for row in rows)

    for index, buckets in enumerate(slices):
        mine = [run for run in runs if slice_of_digest[run_inputs_digest(run.path) or ""] == index]
        assert all(write_task_of_staged_file(run.path) in (0, 1) for run in mine)
        assert all(run.partition_values["layout_tenant"] == STAGED for run in mine)
        assert rows_of(mine) == rows_of(WrittenFile.from_table(manifests.read(paths, buckets)))
    assert sum(run.num_records for run in runs) == union.num_rows


def test_slices_hold_at_most_their_files_and_cover_every_bucket_once() -> None:
    per_bucket = np.zeros(SLICE_BUCKETS, dtype=np.int64)
    per_bucket[[3, 4, 9, 100, 4_000]] = [5, 4, 2, 30, 1]
    slices = plan_slices(per_bucket, slice_files=10)
    assert slices[0].start == 0 and slices[-1].stop == SLICE_BUCKETS
    assert all(a.stop == b.start for a, b in itertools.pairwise(slices))
    held = [int(per_bucket[s.start : s.stop].sum()) for s in slices]
    assert held == [9, 2, 30, 1]  # a bucket of more than 10 is a slice of its own
    owner = slice_of_buckets(slices)
    assert owner[4] == 0 and owner[9] == 1 and owner[100] == 2 and owner[4_095] == 3
    tenants = pa.chunked_array([["acme", "globex", "acme"], ["initech"]])
    assert tenant_buckets(tenants).tolist() == [
        tenant_bucket(name) for name in ("acme", "globex", "acme", "initech")
    ]
    assert tenant_bucket("acme") == zlib.crc32(b"acme") % SLICE_BUCKETS  # same on any machine


def test_staged_files_are_read_in_the_tables_schema_whatever_schema_wrote_them(
    tmp_path: Path,
) -> None:
    started = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    rows = pa.table(
        {
            "tenant": ["acme", "globex"],
            "source": ["web", "web"],
            "window_id": ["w1", "w2"],
            "window_start": [started, started],
            "window_end": [started + timedelta(minutes=1)] * 2,
            "window_date": [started.date()] * 2,
            "pane_index": [0, 1],
            "timing": ["on_time", "late"],
            "is_final": [True, False],
            "count": [3, 4],
            "metrics": [[("sum", 1.5)], []],
            "merged_window_ids": [[], ["w0"]],
            "watermark": [started, started],
            "batch_id": [7, 8],
        },
        schema=WINDOWS.schema,
    )
    folder = tmp_path / WINDOWS.name
    folder.mkdir()
    pq.write_table(rows, folder / "current.parquet")
    # As another version may have written it: narrower integers, milliseconds.
    older = rows.cast(
        pa.schema(
            [
                field.with_type(pa.int32())
                if field.name in ("count", "batch_id")
                else field.with_type(pa.timestamp("ms", tz="UTC"))
                if field.name == "watermark"
                else field
                for field in WINDOWS.schema
            ]
        )
    )
    pq.write_table(older, folder / "older.parquet")

    read = read_staged_files(str(tmp_path), None, WINDOWS.name)
    batches = list(read(iter([pa.record_batch({"path": ["current.parquet", "older.parquet"]})])))

    assert all(batch.schema == WINDOWS.schema for batch in batches)
    assert pa.Table.from_batches(batches).to_pylist() == rows.to_pylist() * 2


@pytest.mark.parametrize("spec", ALL_TABLES, ids=lambda spec: spec.name)
def test_every_tables_files_read_back_in_its_own_types_without_an_arrow_schema_inside(
    spec: TableSpec, tmp_path: Path
) -> None:
    # Files carry no copy of the Arrow schema (it was 40 % of a settled file): each column's
    # Parquet type alone must read back as the table's Arrow type, time zones and maps included.
    rows = pa.Table.from_pylist([{}, {}], schema=spec.storage_schema)
    target = BatchFiles(str(tmp_path), None, "s", 1, 0, (spec.name,))
    [written] = file_writer.write_partitions(
        LocalFileSystem(),
        str(tmp_path),
        spec,
        rows,
        functools.partial(target.file_name, 0, spec.name),
        "a test",
        target,
    )
    content = pq.read_table(tmp_path / spec.name / written.path)

    assert b"ARROW:schema" not in (content.schema.metadata or {})
    assert content.schema == pa.schema(
        f for f in spec.storage_schema if f.name not in spec.partition_by
    )
