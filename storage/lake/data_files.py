"""Executors write a micro-batch's Parquet data files; the driver only commits their paths.

Collecting every batch on the driver bounded the stream by one process's memory and bandwidth.
Instead, each executor task turns its union rows into the output tables' rows and writes one
Parquet file per (table, partition) it holds, straight into the table's folder; for a table whose
rows settle per tenant that is one staged file (`storage.lake.tables`), whatever the number of
tenants. Compaction writes the settled files the same way (`write_settled_files`). It returns one
small row per file (path, size, partition values, stats): all the driver needs to build the
Delta `add` actions and commit them with the batch's transaction id (`DeltaLake.commit_files`).

File names are derived from the stream, its writer epoch, the batch, the table and the Spark
partition, so a retried task or batch of the same instance writes the same names, and an
instance that took over (a new epoch) never overwrites a file an older one may have committed.
Files of an attempt that was never committed are referenced by no version: `vacuum` removes
them.

Runs on executors: pyarrow and pyspark only.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs

from storage.lake.packed_rows import unpacked
from storage.lake.tables import ALL_TABLES, TableSpec, rows_for_table, with_layout

MapInArrow = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""A function Spark's `mapInArrow` runs on executors: Arrow batches in, Arrow batches out."""
WRITTEN_FILE_FIELDS = [
    ("table_name", pa.string()),
    ("path", pa.string()),
    ("size", pa.int64()),
    ("partition_values_json", pa.string()),
    ("modification_time", pa.int64()),
    ("stats", pa.string()),
    ("num_records", pa.int64()),
    ("value_counts_json", pa.string()),
]
WRITTEN_FILE_SCHEMA = pa.schema(WRITTEN_FILE_FIELDS)
WRITTEN_FILE_DDL = ", ".join(
    f"{name} {'STRING' if field_type == pa.string() else 'BIGINT'}"
    for name, field_type in WRITTEN_FILE_FIELDS
)
_SPECS = {spec.name: spec for spec in ALL_TABLES}
log = logging.getLogger(__name__)
WRITER_THREADS = 4
# Stats let readers skip files; min/max only for the types Delta compares without surprises,
# and for the id columns: ids are short (at most 63 characters), so their stats are exact, and
# they let a reader skip the files (settled, or staged) that hold no row of a tenant.
_STATS_TYPES = (pa.types.is_integer, pa.types.is_timestamp, pa.types.is_date)
_ID_COLUMNS = ("tenant", "source")


@dataclass(frozen=True)
class WrittenFile:
    """One Parquet file an executor wrote, as the driver commits it."""

    table_name: str
    path: str
    """Relative to the table's root, as Delta's `add` action wants it."""
    size: int
    partition_values: dict[str, str | None]
    modification_time: int
    stats: str
    num_records: int
    value_counts: dict[str, int] = field(default_factory=dict)
    """Rows per value of the table's `counted_by` column; empty for other tables."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> WrittenFile:
        return cls(
            table_name=row["table_name"],
            path=row["path"],
            size=int(row["size"]),
            partition_values=json.loads(row["partition_values_json"]),
            modification_time=int(row["modification_time"]),
            stats=row["stats"],
            num_records=int(row["num_records"]),
            value_counts=json.loads(row.get("value_counts_json") or "{}"),
        )

    def to_row(self) -> dict[str, Any]:
        """The row `from_row` reads: what an executor sends the driver for this file."""
        return {
            "table_name": self.table_name,
            "path": self.path,
            "size": self.size,
            "partition_values_json": json.dumps(self.partition_values),
            "modification_time": self.modification_time,
            "stats": self.stats,
            "num_records": self.num_records,
            "value_counts_json": json.dumps(self.value_counts),
        }


@dataclass(frozen=True)
class BatchFiles:
    """Where and under which names one micro-batch's files go; pickled to the executors.

    `storage_options` may hold S3 keys: they travel to the executors (which must reach the
    lake) but are never printed.
    """

    root: str
    storage_options: dict[str, str] | None
    stream: str
    writer_epoch: int
    batch_id: int
    table_names: tuple[str, ...]

    def __repr__(self) -> str:
        return f"BatchFiles({self.root!r}, batch {self.batch_id}, {self.table_names})"

    def file_name(self, task_partition: int, table_name: str, partition_values: str) -> str:
        # The partition's folder already tells the partition apart; the task partition tells
        # apart the files two tasks write into one folder. A short digest keeps names bounded.
        return (
            f"part-{self.stream}-e{self.writer_epoch}-b{self.batch_id:010d}-"
            f"t{task_partition:05d}-{_digest(table_name, partition_values)}.parquet"
        )


# `BatchFiles.file_name` and `MergeFiles.run_name`, read back: the stream is whatever precedes the
# fixed-format tail, so a stream name that itself contains dashes parses the same.
_BATCH_FILE_NAME = re.compile(
    r"^part-(?P<stream>.+)-e\d+-b\d{10}-t(?P<task>\d{5})-[0-9a-f]{12}\.parquet$"
)
_RUN_FILE_NAME = re.compile(
    r"^run-(?P<stream>.+)-e\d+-c[0-9a-f]{16}-a(?P<oldest_ms>\d{13,})-t(?P<task>\d{5})\.parquet$"
)


def _staged_file_name(path: str) -> re.Match[str] | None:
    """A staged file's name read back: a batch's, or a run's; None for another name."""
    name = path.rsplit("/", 1)[-1]
    return _BATCH_FILE_NAME.match(name) or _RUN_FILE_NAME.match(name)


def stream_of_staged_file(path: str) -> str | None:
    """The stream that wrote a staged file (a batch's, or a run compaction merged); None for
    another name."""
    match = _staged_file_name(path)
    return None if match is None else match["stream"]


def written_by_a_batch(path: str) -> bool:
    """Whether a micro-batch wrote the file (`BatchFiles.file_name`): its rows are new to the
    table, where a compaction's files hold rows that a batch's file held before."""
    return _BATCH_FILE_NAME.match(path.rsplit("/", 1)[-1]) is not None


def write_task_of_staged_file(path: str) -> int | None:
    """The write task whose keys a staged file holds: the batch's write task that wrote it, or
    the one whose files a compaction merged into it (a run); None for another name."""
    match = _staged_file_name(path)
    return None if match is None else int(match["task"])


def run_oldest_ms(path: str) -> int | None:
    """When the oldest row of a run (`MergeFiles`) was staged; None for a file that is no run."""
    match = _RUN_FILE_NAME.match(path.rsplit("/", 1)[-1])
    return None if match is None else int(match["oldest_ms"])


@dataclass(frozen=True)
class SettledFiles:
    """Where and under which names one compaction's settled files go; pickled to executors.

    A settled partition gets one file per compaction (its rows all reach one task), named by
    the stream, the writer epoch, a digest of the staged files consumed and the write task: the
    same inputs always give the same name and the same bytes, and other inputs never overwrite
    it. The write task keeps two tasks apart if a key's rows ever reached both.
    """

    root: str
    storage_options: dict[str, str] | None
    stream: str
    writer_epoch: int
    inputs_digest: str
    table_name: str
    write_task: int = 0
    """The compaction's write task: a batch's write task whose staged files it compacts
    (`compact_write_tasks`), or its Spark partition after a shuffle."""

    def __repr__(self) -> str:
        return f"SettledFiles({self.root!r}, {self.table_name}, inputs {self.inputs_digest})"

    def file_name(self, partition_values: str) -> str:
        return (
            f"settled-{self.stream}-e{self.writer_epoch}-c{self.inputs_digest}-"
            f"t{self.write_task:05d}-{_digest(self.table_name, partition_values)}.parquet"
        )


RUN_ROW_GROUP_ROWS = 8_192
"""A run holds many tenants' rows sorted by tenant and waits for hours: small row groups let a
tenant's query read only the groups whose statistics hold it."""


@dataclass(frozen=True)
class MergeFiles(SettledFiles):
    """Where and under which names a merging compaction's files go: its settled files, named as
    any compaction's, and its runs.

    A run is a staged file that compaction merged from batches' staged files: the rows of keys
    not yet worth a settled file, sorted by key, one file per write task. Its name carries when
    its oldest row was staged, so the compaction that settles it by age needs no read of it.
    """

    oldest_ms: int = 0

    def __repr__(self) -> str:
        return f"MergeFiles({self.root!r}, {self.table_name}, inputs {self.inputs_digest})"

    def run_name(self) -> str:
        return (
            f"run-{self.stream}-e{self.writer_epoch}-c{self.inputs_digest}-"
            f"a{self.oldest_ms:013d}-t{self.write_task:05d}.parquet"
        )


def _digest(table_name: str, partition_values: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"{table_name}/{partition_values}").hex[:12]


def spark_task_partition() -> int:
    """The Spark partition the calling executor task works on (0 outside a task)."""
    # Imported here: the driver-side readers of this module (`tenant-windows sql` answering
    # in-process, `status`) must not load pyspark.
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def write_task_files(
    target: BatchFiles, task_partition: Callable[[], int] = spark_task_partition
) -> MapInArrow:
    """The `mapInArrow` function: union rows in, packed (`packed_rows`), one row per written
    file out.

    It needs only this module, `storage.lake.tables`, `storage.lake.packed_rows` and pyarrow:
    executors import no more.
    """

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        union = unpacked(batches)
        if union is None:
            return
        written = write_batch_rows(target, union, task_partition())
        if written:
            yield _written_batch(written)

    return write


def write_batch_rows(target: BatchFiles, union: pa.Table, task_partition: int) -> list[WrittenFile]:
    """The files of one task's union rows: a staged file per staged table, a file per partition
    of the others, named for `task_partition`."""
    if union.num_rows == 0:
        return []
    filesystem, base = filesystem_of(target.root, target.storage_options)
    written = []
    for table_name in target.table_names:
        spec = _SPECS[table_name]
        rows = rows_for_table(union, spec, target.batch_id)
        if rows.num_rows == 0:
            continue
        if spec.staged:
            # One staged file per task, ordered so that a tenant's rows are together.
            rows = with_layout(_sorted(rows, ("tenant", "source")), spec, settled=False)
        written += _write_partitions(
            filesystem,
            base,
            spec,
            rows,
            functools.partial(target.file_name, task_partition, spec.name),
            f"batch {target.batch_id}",
            target,
        )
    return written


def read_staged_files(
    root: str, storage_options: dict[str, str] | None, spec_name: str
) -> MapInArrow:
    """The `mapInArrow` function that reads staged files: their paths (relative to the table,
    column `path`) in, their rows (in the table's `schema`, without layout columns) out."""
    spec = _SPECS[spec_name]

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        filesystem, base = filesystem_of(root, storage_options)
        for batch in batches:
            for path in batch.column("path").to_pylist():
                with filesystem.open_input_file(f"{base}/{spec.name}/{path}") as handle:
                    rows = pq.read_table(handle, columns=spec.schema.names)
                yield from rows.cast(spec.schema).to_batches()

    return read


TaskWriter = Callable[[int], MapInArrow]
"""A compaction's writer (`write_settled_files`, `write_merged_files`) for one write task's rows,
its files named for that task."""


def compact_write_tasks(
    root: str,
    storage_options: dict[str, str] | None,
    spec_name: str,
    staged_by_task: dict[int, list[str]],
    tasks: int,
    writer: TaskWriter,
) -> MapInArrow:
    """The `mapInArrow` function of a compaction without a shuffle: numbers `n` in (column `id`,
    of `spark.range(tasks)`), one row per written file out. Each number takes the write tasks `t`
    of `staged_by_task` (their staged files' paths) with `t % tasks == n`, and hands each one's
    rows to `writer(t)` on their own.

    A (tenant, source) key's rows are in one write task's staged files only: its state lives in
    one of the query's shuffle partitions, fixed by the checkpoint, and the sink writes each
    partition in its own task (`write_task_files`). So each key still settles in one file, and no
    row crosses the network or the JVM on its way."""
    read = read_staged_files(root, storage_options, spec_name)

    def compact(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        numbers = [number for batch in batches for number in batch.column("id").to_pylist()]
        for number in numbers:
            for task in sorted(staged_by_task):
                if task % tasks != number:
                    continue
                paths = pa.record_batch({"path": staged_by_task[task]})
                yield from writer(task)(read(iter([paths])))

    return compact


def in_spark_task(writer: TaskWriter) -> MapInArrow:
    """`writer` for the rows a shuffle brought to a Spark task, its files named for the task."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from writer(spark_task_partition())(batches)

    return write


def write_settled_files(
    target: SettledFiles,
) -> MapInArrow:
    """The `mapInArrow` function of compaction: rows of whole (tenant, source) keys in, one
    settled file per partition they belong to written, one row per file out."""
    spec = _SPECS[target.table_name]

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = [batch for batch in batches if batch.num_rows > 0]
        if not received:
            return
        rows = pa.Table.from_batches(received).cast(spec.schema)
        yield _written_batch(write_settled(target, rows, "compaction"))

    return write


def write_merged_files(target: MergeFiles, settle_rows: int) -> MapInArrow:
    """The `mapInArrow` function of a compaction that merges: rows of whole (tenant, source)
    keys in; a key with `settle_rows` rows or more settles (`write_settled`), the others' rows
    go to one run file for the write task, sorted by key; one row per written file out."""
    spec = _SPECS[target.table_name]

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = [batch for batch in batches if batch.num_rows > 0]
        if not received:
            return
        # A total order (`sort_by` starts with the key): the run's bytes are a function of the
        # rows, whatever order Spark hands them over in.
        rows = _sorted(pa.Table.from_batches(received).cast(spec.schema), spec.sort_by)
        worth_a_file = pa.array(_rows_per_key(rows) >= settle_rows)
        written = write_settled(target, rows.filter(worth_a_file), "compaction")
        waiting = rows.filter(pc.invert(worth_a_file))
        if waiting.num_rows:
            name = target.run_name()
            filesystem, base = filesystem_of(target.root, target.storage_options)
            laid_out = with_layout(waiting, spec, settled=False)
            written += _write_partitions(
                filesystem,
                base,
                spec,
                laid_out,
                lambda _: name,
                "compaction",
                target,
                row_group_rows=RUN_ROW_GROUP_ROWS,
            )
        yield _written_batch(written)

    return write


def _rows_per_key(rows: pa.Table) -> np.ndarray:
    """Per row of `rows` (sorted by tenant and source): how many rows its key has."""
    starts = _run_starts(rows, ("tenant", "source"))
    lengths = np.diff(np.append(starts, rows.num_rows))
    return np.repeat(lengths, lengths)


def _run_starts(rows: pa.Table, columns: tuple[str, ...]) -> np.ndarray:
    """The row indices where the values of `columns` differ from the row before (and 0): the
    starts of `rows`' runs of equal keys, nulls equal to nulls. Column-wise: no Python per row."""
    if rows.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    follows = rows.num_rows - 1
    changes = np.zeros(follows, dtype=bool)
    for column in columns:
        before, after = rows[column].slice(0, follows), rows[column].slice(1)
        differs = pc.or_(
            pc.fill_null(pc.not_equal(after, before), False),
            pc.xor(pc.is_null(after), pc.is_null(before)),
        )
        changes |= differs.to_numpy(zero_copy_only=False)
    return np.flatnonzero(np.concatenate([[True], changes]))


def write_settled(target: SettledFiles, rows: pa.Table, doing: str) -> list[WrittenFile]:
    """One file per partition of `rows` (in the table's `schema`), settled in its own
    partition, rows in the table's `sort_by` order: the bytes are a function of the rows."""
    spec = _SPECS[target.table_name]
    if rows.num_rows == 0:
        return []
    if spec.sort_by:
        # Spark hands rows over in an order of its own.
        rows = _sorted(rows, spec.sort_by)
    filesystem, base = filesystem_of(target.root, target.storage_options)
    laid_out = with_layout(rows, spec, settled=True)
    return _write_partitions(filesystem, base, spec, laid_out, target.file_name, doing, target)


MANIFEST_DDL = "manifest STRING, files BIGINT"


@dataclass(frozen=True)
class Manifests:
    """Where a job's tasks list the files they wrote, instead of sending the list through Spark:
    settling everything writes a file per key, and a million keys' list outgrew a 1 GB driver
    heap on its way through the JVM. One manifest per task, named by its partition, so a
    retried task rewrites its own."""

    root: str
    storage_options: Mapping[str, str] | None
    folder: str
    """Relative to `root`."""

    def listing(
        self,
        writer: MapInArrow,
        task_partition: Callable[[], int] = spark_task_partition,
    ) -> MapInArrow:
        """`writer` (a `mapInArrow` function whose rows are written files), listing its rows
        in the task's manifest; one row (`MANIFEST_DDL`) per task out."""

        def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            listed = pa.Table.from_batches(list(writer(batches)), schema=WRITTEN_FILE_SCHEMA)
            if listed.num_rows == 0:
                return
            filesystem, base = filesystem_of(self.root, self.storage_options)
            path = f"{base}/{self.folder}/task-{task_partition():05d}.parquet"
            filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
            pq.write_table(listed, path, filesystem=filesystem)
            yield pa.record_batch(
                {"manifest": [path], "files": [listed.num_rows]},
                schema=pa.schema([("manifest", pa.string()), ("files", pa.int64())]),
            )

        return write

    def read(self, paths: list[str]) -> list[WrittenFile]:
        filesystem, _ = filesystem_of(self.root, self.storage_options)
        return [
            WrittenFile.from_row(row)
            for path in paths
            for row in pq.read_table(path, filesystem=filesystem).to_pylist()
        ]

    def remove(self) -> None:
        """Best effort: a manifest left behind is read by nothing."""
        filesystem, base = filesystem_of(self.root, self.storage_options)
        try:
            filesystem.delete_dir(f"{base}/{self.folder}")
        except FileNotFoundError:
            pass
        except OSError as error:
            log.warning("could not remove the manifests in %s: %s", self.folder, error)

    @staticmethod
    def remove_older(
        root: str, storage_options: Mapping[str, str] | None, folder: str, epoch: int
    ) -> None:
        """Remove `folder`'s `epoch-N` folders older than `epoch` (best effort)."""
        filesystem, base = filesystem_of(root, storage_options)
        selector = fs.FileSelector(f"{base}/{folder}", allow_not_found=True)
        for info in filesystem.get_file_info(selector):
            number = info.base_name.removeprefix("epoch-")
            if info.type == fs.FileType.Directory and number.isdigit() and int(number) < epoch:
                Manifests(root, storage_options, f"{folder}/{info.base_name}").remove()


def _sorted(rows: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    return rows.take(pc.sort_indices(rows, [(column, "ascending") for column in columns]))


def _written_batch(written: list[WrittenFile]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [file.to_row() for file in written], schema=WRITTEN_FILE_SCHEMA
    )


def _write_partitions(
    filesystem: fs.FileSystem,
    base: str,
    spec: TableSpec,
    rows: pa.Table,
    file_name: Callable[[str], str],
    doing: str,
    target: BatchFiles | SettledFiles,
    row_group_rows: int | None = None,
) -> list[WrittenFile]:
    """One file per partition of `rows` (in `spec.storage_schema`), named by `file_name` of the
    partition's folder; `row_group_rows` bounds its row groups (None: pyarrow's default)."""
    # At thousands of tenants a task writes thousands of small files, and each costs about as
    # much in file system calls as in encoding. pyarrow releases the GIL for both, so a few
    # threads overlap them.
    splits = _split_by_partition(rows, spec.partition_by)
    with ThreadPoolExecutor(max_workers=WRITER_THREADS) as pool:
        return list(
            pool.map(
                lambda split: _write_file(
                    filesystem, base, spec, file_name, doing, target, row_group_rows, *split
                ),
                splits,
            )
        )


def _write_file(
    filesystem: fs.FileSystem,
    base: str,
    spec: TableSpec,
    file_name: Callable[[str], str],
    doing: str,
    target: BatchFiles | SettledFiles,
    row_group_rows: int | None,
    partition_values: dict[str, str | None],
    part: pa.Table,
    stats: str,
) -> WrittenFile:
    folder = "/".join(f"{column}={_escape(value)}" for column, value in partition_values.items())
    name = file_name(folder)
    relative = f"{folder}/{name}" if folder else name
    data = part.drop_columns(list(spec.partition_by))
    # Snappy: a batch's files are small and short-lived (`optimize` rewrites them), and it
    # encodes about twice as fast as zstd here.
    encoded = pa.BufferOutputStream()
    pq.write_table(data, encoded, compression="snappy", row_group_size=row_group_rows)
    content = encoded.getvalue()
    full_path = f"{base}/{spec.name}/{relative}"
    try:
        filesystem.create_dir(full_path.rsplit("/", 1)[0], recursive=True)
        with filesystem.open_output_stream(full_path) as out:
            out.write(content)
    except OSError as error:
        if target.storage_options is None:
            raise
        # pyarrow names the key, never the store: the operator needs both.
        raise OSError(
            f"the lake {target.root} is unreachable at {lake_endpoint(target.storage_options)} "
            f"while writing {doing}'s file {spec.name}/{relative}: {error}"
        ) from error
    return WrittenFile(
        table_name=spec.name,
        path=relative,
        size=content.size,
        partition_values=partition_values,
        modification_time=time.time_ns() // 1_000_000,
        stats=stats,
        num_records=data.num_rows,
        value_counts=_value_counts(part, spec.counted_by),
    )


def _value_counts(rows: pa.Table, column: str | None) -> dict[str, int]:
    if column is None or rows.num_rows == 0:
        return {}
    counted = pc.value_counts(rows[column]).to_pylist()
    return {str(entry["values"]): int(entry["counts"]) for entry in counted}


def _split_by_partition(
    rows: pa.Table, partition_by: tuple[str, ...]
) -> list[tuple[dict[str, str | None], pa.Table, str]]:
    """(partition values, that partition's rows, their Delta stats) for each partition.

    Each partition's rows must be next to each other, so that a partition is a zero-copy slice;
    they are sorted only when they are not (a table's `sort_by` and a staged file's single
    partition already are). One grouped aggregation gives every partition's stats at once.
    """
    if not partition_by:
        return [({}, rows, _stats(rows, _aggregate(rows, ()).to_pylist()[0]))]
    # Matched by key: pyarrow does not promise the groups in the order of the runs (in one
    # table here they came out swapped, and each file carried another's statistics).
    aggregated = {
        tuple(row[column] for column in partition_by): row
        for row in _aggregate(rows, partition_by).to_pylist()
    }
    starts = _run_starts(rows, partition_by)
    if len(starts) != len(aggregated):
        rows = _sorted(rows, partition_by)
        starts = _run_starts(rows, partition_by)
    ends = [*starts[1:].tolist(), rows.num_rows]
    first_rows = rows.select(list(partition_by)).take(pa.array(starts)).to_pylist()
    splits = []
    for first, last, values in zip(starts.tolist(), ends, first_rows, strict=True):
        key = tuple(values[column] for column in partition_by)
        part = rows.slice(first, last - first)
        texts = {column: partition_text(value) for column, value in values.items()}
        splits.append((texts, part, _stats(part, aggregated[key])))
    return splits


def _stat_columns(schema: pa.Schema) -> list[str]:
    return [
        f.name
        for f in schema
        if f.name in _ID_COLUMNS or any(is_type(f.type) for is_type in _STATS_TYPES)
    ]


def _aggregate(rows: pa.Table, partition_by: tuple[str, ...]) -> pa.Table:
    """Min, max and null count of every stats column, per partition."""
    columns = [c for c in _stat_columns(rows.schema) if c not in partition_by]
    aggregations: list[Any] = [(c, kind) for c in columns for kind in ("min", "max")]
    aggregations += [
        (name, "count", pc.CountOptions(mode="only_null"))
        for name in rows.schema.names
        if name not in partition_by
        and not pa.types.is_map(rows.schema.field(name).type)
        and not pa.types.is_list(rows.schema.field(name).type)
    ]
    return rows.group_by(list(partition_by), use_threads=False).aggregate(aggregations)


def partition_text(value: Any) -> str | None:
    """A partition value as Delta's log spells it (a date as YYYY-MM-DD)."""
    if value is None:
        return None
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def _escape(value: str | None) -> str:
    # Hive's convention, which Spark and Delta readers understand.
    return "__HIVE_DEFAULT_PARTITION__" if value is None else quote(value, safe="-_.")


def _stats(data: pa.Table, aggregates: dict[str, Any]) -> str:
    """Delta's per-file stats from the partition's aggregated row."""
    stat_columns = _stat_columns(data.schema)
    return json.dumps(
        {
            "numRecords": data.num_rows,
            "minValues": {
                c: _stat_value(aggregates[f"{c}_min"])
                for c in stat_columns
                if aggregates.get(f"{c}_min") is not None
            },
            "maxValues": {
                c: _stat_value(aggregates[f"{c}_max"])
                for c in stat_columns
                if aggregates.get(f"{c}_max") is not None
            },
            "nullCount": {
                name.removesuffix("_count"): count
                for name, count in aggregates.items()
                if name.endswith("_count")
            },
        }
    )


def _stat_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    return value


# pyarrow's default retries each request 3 times; with a timeout per attempt, a stalled store
# would hold a task for 3 timeouts. Two attempts ride out a dropped connection and keep a task
# within about twice `lake.s3.timeout`, like delta-rs on the driver.
S3_ATTEMPTS = 2


def filesystem_of(
    root: str, storage_options: Mapping[str, str] | None
) -> tuple[fs.FileSystem, str]:
    """A pyarrow filesystem and base path for the lake root (local, or `s3://` with the same
    endpoint, keys and timeouts delta-rs gets)."""
    if not root.startswith("s3://"):
        local = root.removeprefix("file://")
        return fs.LocalFileSystem(), local.rstrip("/")
    options = storage_options or {}
    endpoint = options.get("AWS_ENDPOINT_URL")
    scheme = "https"
    if endpoint is not None and "://" in endpoint:
        scheme, endpoint = endpoint.split("://", 1)
    s3 = fs.S3FileSystem(
        access_key=options.get("AWS_ACCESS_KEY_ID"),
        secret_key=options.get("AWS_SECRET_ACCESS_KEY"),
        region=options.get("AWS_REGION"),
        endpoint_override=endpoint,
        scheme=scheme,
        connect_timeout=duration_s(options.get("connect_timeout", "5s")),
        request_timeout=duration_s(options.get("timeout", "20s")),
        retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=S3_ATTEMPTS),
    )
    return s3, root.removeprefix("s3://").rstrip("/")


def lake_endpoint(storage_options: Mapping[str, str]) -> str:
    """The S3 endpoint the options point at, for error messages (never the keys)."""
    return storage_options.get("AWS_ENDPOINT_URL", f"AWS S3 ({storage_options.get('AWS_REGION')})")


def duration_s(text: str) -> float:
    """Seconds of an object_store duration as `s3_options` writes them: `250ms` or `5s`."""
    if text.endswith("ms"):
        return int(text[:-2]) / 1000
    if text.endswith("s"):
        return float(text[:-1])
    raise ValueError(f"expected a duration like 250ms or 5s; got {text!r}")
