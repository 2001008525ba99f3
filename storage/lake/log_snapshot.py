"""One partition's files at a table's newest version, with its transaction ids and protocol, read
from the log: the checkpoint's few columns a batch at a time, then the commits after it.

A compaction needs the staged partition's files (a few per batch) of a table that, settled,
holds a file per tenant: delta-rs would load every one of them with its statistics to list the
few. Read here, the cost is the checkpoint's path and partition columns, streamed, and the
memory the partition's own files.

`None` where this reader cannot follow the log (a multi-part or V2 checkpoint, deletion vectors,
new metadata in a commit after the checkpoint): the caller asks delta-rs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from storage.lake.delta_log import Action, DeltaLog, checkpoint_batches

_CHECKPOINT_COLUMNS = [
    "add.path",
    "add.size",
    "add.modificationTime",
    "add.partitionValues",
    "add.deletionVector.storageType",
    "txn",
    "protocol",
]


@dataclass(frozen=True)
class PartitionFile:
    path: str
    """Relative to the table, as the file system names it."""
    size: int
    modification_time: int
    partition_values: dict[str, str | None]


@dataclass(frozen=True)
class PartitionSnapshot:
    version: int
    files: list[PartitionFile]
    """The partition's files at `version`, by path."""
    transactions: dict[str, int]
    """Every transaction id's version at `version`."""
    writer_version: int
    writer_features: frozenset[str]


def partition_snapshot(delta_log: DeltaLog, column: str, value: str) -> PartitionSnapshot | None:
    """The files whose partition `column` holds `value`, at the newest version (see the
    module's doc for None)."""
    reading = _Reading(column, value)
    version = delta_log.checkpointed_version()
    if version is None:
        return None
    if version >= 0:
        opened = delta_log.open_checkpoint(version)
        for batch in checkpoint_batches(opened, _CHECKPOINT_COLUMNS):
            if not reading.checkpoint_rows(batch):
                return None
    while (actions := delta_log.actions(version + 1)) is not None:
        if not reading.commit(actions, first=version < 0):
            return None
        version += 1
    if version < 0 or reading.protocol is None:
        return None
    return PartitionSnapshot(
        version=version,
        files=sorted(reading.files.values(), key=lambda file: file.path),
        transactions=reading.transactions,
        writer_version=int(reading.protocol.get("minWriterVersion", 0)),
        writer_features=frozenset(reading.protocol.get("writerFeatures") or ()),
    )


class _Reading:
    def __init__(self, column: str, value: str) -> None:
        self.column = column
        self.value = value
        self.files: dict[str, PartitionFile] = {}
        self.transactions: dict[str, int] = {}
        self.protocol: dict[str, Any] | None = None

    def checkpoint_rows(self, batch: pa.RecordBatch) -> bool:
        adds = batch.column("add")
        if pc.any(pc.is_valid(pc.struct_field(adds, ["deletionVector", "storageType"]))).as_py():
            return False
        values = pc.struct_field(adds, "partitionValues")
        in_partition = pc.equal(pc.map_lookup(values, pa.scalar(self.column), "first"), self.value)
        for add in pc.filter(adds, pc.fill_null(in_partition, False)).to_pylist():
            self._add(add)
        for txn in batch.column("txn").drop_null().to_pylist():
            self.transactions[txn["appId"]] = int(txn["version"])
        protocols = batch.column("protocol").drop_null()
        if len(protocols):
            self.protocol = protocols[0].as_py()
        return True

    def commit(self, actions: Iterable[Action], first: bool) -> bool:
        """Apply one commit; False: one this reader does not follow. The log's first commit
        (no checkpoint) is where metadata is set; a later one changing it may re-partition."""
        for action in actions:
            if "metaData" in action and not first:
                return False
            if (protocol := action.get("protocol")) is not None:
                self.protocol = protocol
            elif (txn := action.get("txn")) is not None:
                self.transactions[txn["appId"]] = int(txn["version"])
            elif (removed := action.get("remove")) is not None:
                if removed.get("deletionVector"):
                    return False
                self.files.pop(unquote(removed["path"]), None)
            elif (added := action.get("add")) is not None:
                if added.get("deletionVector"):
                    return False
                if (added.get("partitionValues") or {}).get(self.column) == self.value:
                    self._add(added)
        return True

    def _add(self, add: dict[str, Any]) -> None:
        values = add["partitionValues"]
        path = unquote(add["path"])
        self.files[path] = PartitionFile(
            path=path,
            size=int(add["size"]),
            modification_time=int(add["modificationTime"]),
            # A checkpoint's map reads as pairs; a commit's as an object.
            partition_values=dict(values) if isinstance(values, list) else values,
        )
