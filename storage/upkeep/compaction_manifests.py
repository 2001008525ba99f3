"""Where a compaction's tasks list the files they wrote, for the driver to read back."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs

from storage.lake.file_writer import MapInArrow, spark_task_partition
from storage.lake.lake_filesystem import filesystem_of
from storage.lake.written_files import WRITTEN_FILE_SCHEMA, WrittenFile

log = logging.getLogger(__name__)

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
