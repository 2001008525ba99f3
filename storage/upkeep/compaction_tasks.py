"""Compaction's executor side: the tasks that read staged files and write settled files and runs.

`storage.upkeep.compaction` runs them and commits what they wrote. Runs on executors: pyarrow
and pyspark only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from storage.lake.file_names import MergeFiles, SettledFiles
from storage.lake.file_stats import run_starts, sorted_rows
from storage.lake.file_writer import (
    MapInArrow,
    spark_task_partition,
    write_partitions,
    write_settled,
)
from storage.lake.lake_filesystem import filesystem_of
from storage.lake.tables import ALL_TABLES, with_layout
from storage.lake.written_files import WrittenFile, written_batch
from storage.upkeep.settle_slices import slice_digest, tenant_buckets
from storage.upkeep.worker_memory import returning_what_it_takes

_SPECS = {spec.name: spec for spec in ALL_TABLES}
RUN_ROW_GROUP_ROWS = 8_192
"""A run holds many tenants' rows sorted by tenant and waits for hours: small row groups let a
tenant's query read only the groups whose statistics hold it."""


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
                # A compaction reads thousands of small files: `ParquetFile` reads one without
                # `read_table`'s dataset set-up, and a file already in the table's schema (all but
                # those an older version wrote) needs no cast; together half the CPU per file.
                # On the task's thread alone: Spark gives a task one core, and pyarrow's pool
                # took the others from the batches beside it, for 1.6x the CPU of a 500-row file.
                with filesystem.open_input_file(f"{base}/{spec.name}/{path}") as handle:
                    rows = pq.ParquetFile(handle).read(columns=spec.schema.names, use_threads=False)
                if rows.schema != spec.schema:
                    rows = rows.cast(spec.schema)
                yield from rows.to_batches()

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


def returning_memory(task: MapInArrow) -> MapInArrow:
    """`task`, after which its worker gives back what it took (`returning_what_it_takes`): a
    compaction task holds thousands of staged files' rows at once, the most a worker ever
    allocates, and Spark reuses the worker for every batch after it."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with returning_what_it_takes():
            yield from task(batches)

    return run


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
        yield written_batch(write_settled(target, rows, "compaction"))

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
        rows = sorted_rows(pa.Table.from_batches(received).cast(spec.schema), spec.sort_by)
        worth_a_file = pa.array(_rows_per_key(rows) >= settle_rows)
        written = write_settled(target, rows.filter(worth_a_file), "compaction")
        waiting = rows.filter(pc.invert(worth_a_file))
        if waiting.num_rows:
            name = target.run_name()
            filesystem, base = filesystem_of(target.root, target.storage_options)
            laid_out = with_layout(waiting, spec, settled=False)
            written += write_partitions(
                filesystem,
                base,
                spec,
                laid_out,
                lambda _: name,
                "compaction",
                target,
                row_group_rows=RUN_ROW_GROUP_ROWS,
            )
        yield written_batch(written)

    return write


def _rows_per_key(rows: pa.Table) -> np.ndarray:
    """Per row of `rows` (sorted by tenant and source): how many rows its key has."""
    starts = run_starts(rows, ("tenant", "source"))
    lengths = np.diff(np.append(starts, rows.num_rows))
    return np.repeat(lengths, lengths)


def write_slice_runs(target: MergeFiles, slice_of_bucket: np.ndarray) -> MapInArrow:
    """The `mapInArrow` function that cuts a write task's staged rows into slices
    (`storage.upkeep.settle_slices`): rows of whole (tenant, source) keys in, one run per slice
    they hold out, sorted by key and named for `target` with the slice's inputs digest
    (`slice_digest`); one row per written file out."""
    spec = _SPECS[target.table_name]

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = [batch for batch in batches if batch.num_rows > 0]
        if not received:
            return
        rows = sorted_rows(pa.Table.from_batches(received).cast(spec.schema), spec.sort_by)
        slices = slice_of_bucket[tenant_buckets(rows["tenant"])]
        filesystem, base = filesystem_of(target.root, target.storage_options)
        written: list[WrittenFile] = []
        for index in np.unique(slices).tolist():
            run = replace(target, inputs_digest=slice_digest(target.inputs_digest, index))
            name = run.run_name()
            written += write_partitions(
                filesystem,
                base,
                spec,
                with_layout(rows.filter(pa.array(slices == index)), spec, settled=False),
                functools.partial(_same_name, name),
                "compaction",
                target,
                row_group_rows=RUN_ROW_GROUP_ROWS,
            )
        yield written_batch(written)

    return write


def _same_name(name: str, _partition_folder: str) -> str:
    return name
