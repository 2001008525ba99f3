"""Where a compaction's tasks list the files they wrote, for the driver to read back: all at
once, or one slice of tenants at a time (`storage.upkeep.settle_slices`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs

from storage.lake.file_writer import MapInArrow, spark_task_partition
from storage.lake.lake_filesystem import filesystem_of, make_folder, remove_folder
from storage.lake.written_files import WRITTEN_FILE_SCHEMA
from storage.upkeep.settle_slices import SLICE_BUCKETS, tenant_bucket

log = logging.getLogger(__name__)

MANIFEST_DDL = "manifest STRING, files BIGINT"
MANIFEST_ROW_GROUP_ROWS = 2_048
"""A manifest's rows are sorted by slice bucket in groups this small, so reading one slice's
rows skips the groups of the others by their statistics."""


@dataclass(frozen=True)
class Manifests:
    """Where a job's tasks list the files they wrote, instead of sending the list through Spark:
    settling everything writes a file per key, and a million keys' list outgrew a 1 GB driver
    heap on its way through the JVM. One manifest per task, named by its partition, so a
    retried task rewrites its own. Each row carries the slice bucket of its file's tenant (its
    first partition value), so the driver can read the files of one slice only."""

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
            make_folder(filesystem, path.rsplit("/", 1)[0])
            buckets = [
                tenant_bucket(next(iter(json.loads(values).values()), None) or "")
                for values in listed.column("partition_values_json").to_pylist()
            ]
            listed = listed.append_column("bucket", pa.array(buckets, pa.int32()))
            listed = listed.take(pc.sort_indices(listed, [("bucket", "ascending")]))
            pq.write_table(
                listed, path, filesystem=filesystem, row_group_size=MANIFEST_ROW_GROUP_ROWS
            )
            yield pa.record_batch(
                {"manifest": [path], "files": [listed.num_rows]},
                schema=pa.schema([("manifest", pa.string()), ("files", pa.int64())]),
            )

        return write

    def read(self, paths: list[str], buckets: range | None = None) -> pa.Table:
        """The files the manifests at `paths` list, as rows (`WRITTEN_FILE_SCHEMA`: a commit
        encodes them column-wise, `log_commits.add_lines`); with `buckets`, only those whose
        tenant is in one of them."""
        filesystem, _ = filesystem_of(self.root, self.storage_options)
        filters = (
            None
            if buckets is None
            else [("bucket", ">=", buckets.start), ("bucket", "<", buckets.stop)]
        )
        return pa.concat_tables(
            [
                pq.read_table(
                    path, filesystem=filesystem, filters=filters, columns=WRITTEN_FILE_SCHEMA.names
                )
                for path in paths
            ]
            or [WRITTEN_FILE_SCHEMA.empty_table()]
        )

    def files_per_bucket(self, paths: list[str]) -> np.ndarray:
        """How many files the manifests at `paths` list in each slice bucket."""
        filesystem, _ = filesystem_of(self.root, self.storage_options)
        counts = np.zeros(SLICE_BUCKETS, dtype=np.int64)
        for path in paths:
            buckets = pq.read_table(path, filesystem=filesystem, columns=["bucket"])["bucket"]
            counts += np.bincount(buckets.to_numpy(), minlength=SLICE_BUCKETS)
        return counts

    def remove(self) -> None:
        """Best effort: a manifest left behind is read by nothing."""
        filesystem, base = filesystem_of(self.root, self.storage_options)
        try:
            remove_folder(filesystem, f"{base}/{self.folder}")
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
