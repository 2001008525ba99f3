"""A table's files that may hold rows of batches above a floor, followed commit by commit.

The notifier reads the panes of the batches it has not announced yet. delta-rs answers "which
files may hold batch ids in (after, through]" only after loading every file of the version with
its statistics: at a million tenants `windows` holds a file per key, and the notifier held 2
GB for them and spent 4 s on each poll (`infra.dev.benchmarks.notify_files`).

`BatchFileIndex` keeps only the files whose `batch_id` statistics reach above a floor that each
ask raises (`files`): read once from the log's newest checkpoint (each row looked at, few kept),
then from each new commit's own actions. A settle's files hold batches the notifier has
already announced, so they are looked at once and dropped.

A file without `batch_id` statistics may hold any batch, and is kept until a commit removes it.
A log this reader cannot follow (no table yet, a multi-part or V2 checkpoint, a deletion vector)
makes `files` return None: the caller then asks delta-rs, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import unquote

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from storage.lake.delta_log import Action, DeltaLog, checkpoint_batches, checkpoint_metadata
from storage.lake.table_files import MAX_COMMITS_PER_ADVANCE

_HIGH_BATCH_ID = r'"maxValues":\{[^{}]*"batch_id":(?P<high>-?\d+)[,}]'
"""A file's highest `batch_id` in its statistics' JSON, where `maxValues` holds no nested
object before it (else no match: the row is parsed)."""
BatchRange = tuple[int | None, int | None]
"""A file's lowest and highest `batch_id` (None: unknown, so any)."""


class BatchFileIndex:
    def __init__(self, table_uri: str, storage_options: Mapping[str, str] | None) -> None:
        self._root = table_uri.rstrip("/")
        self._log = DeltaLog(table_uri, storage_options)
        self._version: int | None = None
        """The newest version read; None: not followed (not started, or a log this reader
        cannot follow: the next call starts over)."""
        self._floor = -1
        """No batch up to this one is asked about any more."""
        self._files: dict[str, BatchRange] = {}
        self._partition_columns: tuple[str, ...] = ()

    @property
    def partition_columns(self) -> tuple[str, ...]:
        """The table's partition columns, as its newest metadata read names them."""
        return self._partition_columns

    def files(self, after: int, through: int) -> list[str] | None:
        """URIs of the newest version's files that may hold rows of batches (after, through];
        None where this reader cannot follow the table's log.

        Asking moves the floor to `after`: the files holding only batches up to it are let go,
        and a later call must not ask about them again."""
        self._forget_through(after)
        if not self._advance():
            return None
        return [
            f"{self._root}/{path}"
            for path, (low, high) in self._files.items()
            if (high is None or high > after) and (low is None or low <= through)
        ]

    def _forget_through(self, batch_id: int) -> None:
        if batch_id < self._floor:
            raise ValueError(f"batches up to {self._floor} were let go; asked after {batch_id}")
        if batch_id == self._floor:
            return
        self._floor = batch_id
        self._files = {
            path: (low, high)
            for path, (low, high) in self._files.items()
            if high is None or high > batch_id
        }

    def _advance(self) -> bool:
        if self._version is None and not self._start():
            return False
        for _ in range(MAX_COMMITS_PER_ADVANCE):
            assert self._version is not None
            actions = self._log.actions(self._version + 1)
            if actions is None:
                break
            if not self._apply(actions):
                self._version = None
                return False
            self._version += 1
        return True

    def _start(self) -> bool:
        checkpoint = self._log.checkpointed_version()
        if checkpoint is None:
            return False
        self._files = {}
        self._partition_columns = ()
        if checkpoint >= 0:
            # Opened once: its footer lists every row group (tens of ms at a million files).
            opened = self._log.open_checkpoint(checkpoint)
            metadata = checkpoint_metadata(opened)
            if metadata is None:
                return False
            self._partition_columns = tuple(metadata.get("partitionColumns") or ())
            columns = ["add.path", "add.stats", "add.deletionVector.storageType"]
            for batch in checkpoint_batches(opened, columns):
                adds = pc.drop_null(batch.column("add"))
                if not len(adds):
                    continue
                if pc.any(pc.is_valid(pc.struct_field(adds, "deletionVector"))).as_py():
                    return False
                paths, stats = pc.struct_field(adds, "path"), pc.struct_field(adds, "stats")
                # Most rows are settled files of batches announced long ago: told apart by a
                # regular expression over the column, only the rest is parsed.
                high = pc.struct_field(pc.extract_regex(stats, _HIGH_BATCH_ID), "high")
                old = pc.less_equal(pc.cast(high, pa.int64()), self._floor)
                kept = pc.invert(pc.fill_null(old, False))
                for path, text in zip(
                    pc.filter(paths, kept).to_pylist(),
                    pc.filter(stats, kept).to_pylist(),
                    strict=True,
                ):
                    self._keep(path, text)
        self._version = checkpoint
        return True

    def _apply(self, actions: Iterable[Action]) -> bool:
        """One commit's files; False for one this reader cannot follow."""
        for action in actions:
            if (metadata := action.get("metaData")) is not None:
                self._partition_columns = tuple(metadata.get("partitionColumns") or ())
            elif (removed := action.get("remove")) is not None:
                if removed.get("deletionVector"):
                    return False
                self._files.pop(unquote(removed["path"]), None)
            elif (added := action.get("add")) is not None:
                if added.get("deletionVector"):
                    return False
                self._keep(added["path"], added.get("stats"))
        return True

    def _keep(self, path: str, stats: str | None) -> None:
        low, high = _batch_range(stats)
        relative = unquote(path)
        if high is None or high > self._floor:
            self._files[relative] = (low, high)
        else:
            # A file re-added with older batches only (a compaction's rewrite) replaces none.
            self._files.pop(relative, None)


def _batch_range(stats: str | None) -> BatchRange:
    if not stats:
        return None, None
    parsed = orjson.loads(stats)
    low = (parsed.get("minValues") or {}).get("batch_id")
    high = (parsed.get("maxValues") or {}).get("batch_id")
    return (
        None if low is None else int(low),
        None if high is None else int(high),
    )
