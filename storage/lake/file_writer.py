"""Executors write a table's Parquet data files; the driver only commits their paths.

Collecting every batch on the driver bounded the stream by one process's memory and bandwidth.
Instead, each executor task turns its union rows into the output tables' rows and writes one
Parquet file per (table, partition) it holds, straight into the table's folder; for a table whose
rows settle per tenant that is one staged file (`storage.lake.tables`), whatever the number of
tenants (`write_task_files`). Compaction and repair write settled files the same way
(`write_settled`). Each returns one small row per file (`storage.lake.written_files`): all the
driver needs to build the Delta `add` actions and commit them with the batch's transaction id
(`DeltaLake.commit_files`). Names come from `storage.lake.file_names`.

Runs on executors: pyarrow and pyspark only.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs

from storage.lake.file_names import BatchFiles, SettledFiles, percent_encoded
from storage.lake.file_stats import (
    SETTLED_FILE_STATS,
    partitioned,
    run_starts,
    sorted_rows,
)
from storage.lake.lake_filesystem import filesystem_of, lake_endpoint, make_folder, write_file
from storage.lake.packed_rows import unpacked
from storage.lake.plain_parquet import PlainParquet
from storage.lake.tables import ALL_TABLES, TableSpec, rows_for_table, with_layout
from storage.lake.written_files import WrittenFile, written_batch

MapInArrow = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""A function Spark's `mapInArrow` runs on executors: Arrow batches in, Arrow batches out."""
_SPECS = {spec.name: spec for spec in ALL_TABLES}
WRITER_THREADS = 4
"""Threads that write a task's files to an object store (`writer_threads`)."""
PARTITIONS_PER_CHUNK = 4_096
"""A task writes its files this many partitions at a time (`_partition_chunks`)."""
PLAIN_FILE_ROWS = 256
"""A file of this many rows or fewer is written plainly: no dictionary, no compression and no
statistics inside it, one page per column (`storage.lake.plain_parquet`). For so few rows those
save nothing (readers skip files by the log's statistics), and a settle at many tenants writes
a file of a few rows per key."""


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
            yield written_batch(written)

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
            rows = with_layout(sorted_rows(rows, ("tenant", "source")), spec, settled=False)
        written += write_partitions(
            filesystem,
            base,
            spec,
            rows,
            functools.partial(target.file_name, task_partition, spec.name),
            f"batch {target.batch_id}",
            target,
        )
    return written


def write_settled(target: SettledFiles, rows: pa.Table, doing: str) -> list[WrittenFile]:
    """One file per partition of `rows` (in the table's `schema`), settled in its own
    partition, rows in the table's `sort_by` order: the bytes are a function of the rows."""
    spec = _SPECS[target.table_name]
    if rows.num_rows == 0:
        return []
    if spec.sort_by:
        # Spark hands rows over in an order of its own.
        rows = sorted_rows(rows, spec.sort_by)
    filesystem, base = filesystem_of(target.root, target.storage_options)
    laid_out = with_layout(rows, spec, settled=True)
    return write_partitions(
        filesystem,
        base,
        spec,
        laid_out,
        target.file_name,
        doing,
        target,
        stats_columns=SETTLED_FILE_STATS,
    )


def write_partitions(
    filesystem: fs.FileSystem,
    base: str,
    spec: TableSpec,
    rows: pa.Table,
    file_name: Callable[[str], str],
    doing: str,
    target: BatchFiles | SettledFiles,
    row_group_rows: int | None = None,
    stats_columns: Collection[str] | None = None,
) -> list[WrittenFile]:
    """One file per partition of `rows` (in `spec.storage_schema`), named by `file_name` of the
    partition's folder; `row_group_rows` bounds its row groups (None: pyarrow's default), and
    its statistics are those of `stats_columns` (None: every column's that has some)."""

    def write(
        laid_out: pa.Table,
        data: pa.Table,
        partition: tuple[dict[str, str | None], tuple[int, int], str, bytes | None],
    ) -> WrittenFile:
        """The file of one partition: rows [first, end) of `laid_out`, whose `data` columns
        it holds."""
        values, (first, end), stats, content = partition
        # Sliced only where needed: at a file per key the slices cost more than the writes.
        if content is None:
            content = _compressed(data.slice(first, end - first), row_group_rows, spec)
        path = _write_file(filesystem, base, spec, file_name, doing, target, values, content)
        return WrittenFile(
            table_name=spec.name,
            path=path,
            size=len(content),
            partition_values=values,
            modification_time=time.time_ns() // 1_000_000,
            stats=stats,
            num_records=end - first,
            # Only a batch's files are counted: the stream's metrics read them, never a
            # compaction's.
            value_counts=(
                _value_counts(laid_out.slice(first, end - first), spec.counted_by)
                if isinstance(target, BatchFiles)
                else {}
            ),
        )

    threads = writer_threads(filesystem)
    written: list[WrittenFile] = []
    with ThreadPoolExecutor(max_workers=threads) as pool:
        each = pool.map if threads > 1 else map
        for chunk in _partition_chunks(rows, spec.partition_by):
            partitions = partitioned(chunk, spec.partition_by, stats_columns)
            data = partitions.rows.drop_columns(list(spec.partition_by))
            files = zip(
                partitions.values,
                itertools.pairwise(partitions.bounds),
                partitions.stats,
                _plain_files(data, partitions.bounds),
                strict=True,
            )
            written += each(functools.partial(write, partitions.rows, data), files)
    return written


def _plain_files(data: pa.Table, bounds: list[int]) -> list[bytes | None]:
    """The file of each partition ([bounds[i], bounds[i + 1]) of `data`) that has at most
    `PLAIN_FILE_ROWS` rows, all encoded at once (`PlainParquet`); None for a bigger one (or for
    every one, of a schema the plain writer declines)."""
    encoder = PlainParquet.of(data.schema)
    sizes = np.diff(bounds)
    small = sizes <= PLAIN_FILE_ROWS
    if encoder is None or not small.any():
        return [None] * len(sizes)
    if not small.all():
        # Only the small partitions' rows: the plain writer encodes every row it is given.
        data = data.filter(pa.array(np.repeat(small, sizes)))
    ends = np.cumsum(sizes[small]).tolist()
    encoded = iter(encoder.encode(data, list(zip([0, *ends[:-1]], ends, strict=True))))
    return [next(encoded) if is_small else None for is_small in small.tolist()]


def writer_threads(filesystem: fs.FileSystem) -> int:
    """Threads that write one task's files.

    At thousands of tenants a task writes thousands of small files. To an object store each is
    a request that waits on the network with the GIL released, so a few threads overlap them.
    To a local disk each is CPU work (encoding, then the kernel's), and the task's core is
    already busy: more threads only add handing the GIL over (in a settle of 20,000 keys on
    tmpfs, 0.69 ms of CPU a file with one thread, 0.85-1.19 ms with four)."""
    return 1 if isinstance(filesystem, fs.LocalFileSystem) else WRITER_THREADS


def _partition_chunks(rows: pa.Table, partition_by: tuple[str, ...]) -> Iterator[pa.Table]:
    """`rows` in slices of at most `PARTITIONS_PER_CHUNK` whole partitions.

    A settle at a million tenants hands a task a quarter of a million partitions: split all at
    once, their slices and statistics held several GB in each Python worker."""
    starts = run_starts(rows, partition_by)
    if len(starts) <= PARTITIONS_PER_CHUNK:
        yield rows
        return
    # A stable sort: each partition's rows together, in the order they came (a file's bytes
    # stay a function of its rows), so no partition is cut across two chunks.
    rows = sorted_rows(rows, partition_by)
    starts = run_starts(rows, partition_by)
    bounds = [*starts[::PARTITIONS_PER_CHUNK].tolist(), rows.num_rows]
    for first, end in itertools.pairwise(bounds):
        yield rows.slice(first, end - first)


def _compressed(data: pa.Table, row_group_rows: int | None, spec: TableSpec) -> pa.Buffer:
    """A file of more than `PLAIN_FILE_ROWS` rows: Snappy, which encodes about twice as fast as
    zstd here, dictionaries but for `spec.row_unique`, and in-file statistics."""
    encoded = pa.BufferOutputStream()
    pq.write_table(
        data,
        encoded,
        compression="snappy",
        use_dictionary=(
            [name for name in data.column_names if name not in spec.row_unique]
            if spec.row_unique
            else True
        ),
        row_group_size=row_group_rows,
        # The Arrow schema pyarrow copies into each file's footer by default was 1.3 KB of a
        # settled file's 3.2: every column's Parquet type already reads back as the table's
        # Arrow type (the file-writer tests read each table's files back in its schema).
        store_schema=False,
    )
    return encoded.getvalue()


def _write_file(
    filesystem: fs.FileSystem,
    base: str,
    spec: TableSpec,
    file_name: Callable[[str], str],
    doing: str,
    target: BatchFiles | SettledFiles,
    partition_values: dict[str, str | None],
    content: bytes | pa.Buffer,
) -> str:
    """Write a partition's file; its path in the table."""
    folder = "/".join(f"{column}={_escape(value)}" for column, value in partition_values.items())
    name = file_name(folder)
    relative = f"{folder}/{name}" if folder else name
    full_path = f"{base}/{spec.name}/{relative}"
    try:
        make_folder(filesystem, full_path.rsplit("/", 1)[0])
        write_file(filesystem, full_path, content)
    except OSError as error:
        if target.storage_options is None:
            raise
        # pyarrow names the key, never the store: the operator needs both.
        raise OSError(
            f"the lake {target.root} is unreachable at {lake_endpoint(target.storage_options)} "
            f"while writing {doing}'s file {spec.name}/{relative}: {error}"
        ) from error
    return relative


def _value_counts(rows: pa.Table, column: str | None) -> dict[str, int]:
    if column is None or rows.num_rows == 0:
        return {}
    counted = pc.value_counts(rows[column]).to_pylist()
    return {str(entry["values"]): int(entry["counts"]) for entry in counted}


def _escape(value: str | None) -> str:
    # Hive's convention, which Spark and Delta readers understand.
    return "__HIVE_DEFAULT_PARTITION__" if value is None else percent_encoded(value, "-_.")
