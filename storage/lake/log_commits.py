"""A fenced commit written on the log's tail: checked against the commits after a version the
writer already checked, never against a loaded snapshot.

Through delta-rs, every commit loaded the table's whole file list, and once a compaction had
settled a file per tenant, the driver held gigabytes at a million tenants. A commit only needs
to know what happened since the version its writer checked (a batch's `log_head`, a
compaction's listing `log_snapshot`, or its last slice's commit): whether a newer writer fenced
the table (`commits.check_fence`), whether one of the files it removes is gone, and whether the
table's metadata or protocol changed (then it stops and the writer looks again). Those are in
the commits after that version, a few each, read here; the commit itself is written with the
version's put-if-absent (`delta_log.DeltaLog.try_commit`). Three kinds go this way: a batch's
files (`data_change`), a compaction's swap of staged files for settled ones (the same rows), and
a writer's fence (no files).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from storage.lake.commits import COMMIT_ATTEMPTS, FencedError, fence_app_id
from storage.lake.delta_log import Action, DeltaLog, log_path, log_paths
from storage.lake.written_files import WrittenFile

log = logging.getLogger(__name__)

ENGINE = "tenant-windows"
COMMIT_ID = "tenantWindowsCommitId"
"""A `commitInfo` field naming one commit attempt: a PUT whose reply was lost and whose retry
found the version taken can tell its own commit from another writer's."""


class RemovedFile(Protocol):
    """A file of the table a swap removes (`delta_lake.LakeFile`)."""

    @property
    def path(self) -> str:
        """Relative to the table, as the file system names it."""

    @property
    def size(self) -> int: ...

    @property
    def partition_values(self) -> dict[str, str | None]: ...


@dataclass(frozen=True)
class FencedCommit:
    """Remove `removed` and add `added` in one commit; `data_change` false for a swap of files
    holding the same rows."""

    removed: Sequence[RemovedFile]
    added: Sequence[WrittenFile] | pa.Table
    """The files, or their rows (`WRITTEN_FILE_SCHEMA`): a settle's slice of tens of thousands,
    whose `add` actions are then encoded column-wise."""
    app_id: str
    """The stream: its fence (`<app_id>/writer_epoch`) must hold `writer_epoch`."""
    writer_epoch: int
    transaction: tuple[str, int]
    """The Delta transaction id (app id, version) the commit carries."""
    data_change: bool = False


def commit_fenced(
    delta_log: DeltaLog,
    checked_version: int,
    commit: FencedCommit,
    before_commit: Callable[[], None] = lambda: None,
) -> int | None:
    """Write `commit` after `checked_version`, a version at which every file it removes was in
    the table and the fence held no newer epoch than `commit.writer_epoch`. Returns the version
    committed, or None if a commit since removed one of those files or changed the table's
    metadata or protocol (nothing committed: the caller looks at the table again). Raises
    `FencedError` if a newer writer fenced the table. `before_commit` runs before each
    attempt's write."""
    removed_paths = {unquote(file.path) for file in commit.removed}
    fence = fence_app_id(commit.app_id)
    commit_id = uuid.uuid4().hex
    added_lines = (
        add_lines(commit.added, commit.data_change) if isinstance(commit.added, pa.Table) else b""
    )
    version = checked_version
    for _ in range(COMMIT_ATTEMPTS):
        while (actions := delta_log.actions(version + 1)) is not None:
            if not _still_valid(actions, removed_paths, fence, commit.writer_epoch):
                return None
            version += 1
        before_commit()
        if delta_log.try_commit(version + 1, _commit_actions(commit, commit_id), added_lines):
            return version + 1
        log.info("%s: version %d was taken; checking its commit", delta_log.table_uri, version + 1)
        mine = delta_log.actions(version + 1)
        if mine is not None and _is_commit(mine, commit_id):
            # The write landed and only its reply was lost: a retry found the name taken.
            return version + 1
    raise RuntimeError(
        f"{delta_log.table_uri}: other commits took every version for {COMMIT_ATTEMPTS} attempts"
    )


def _still_valid(
    actions: Iterable[Action], removed_paths: set[str], fence: str, epoch: int
) -> bool:
    """Whether a commit after the checked version leaves the commit valid; raises FencedError
    if it fenced the table for a newer writer. (An older writer's fence cannot follow this
    writer's: each fence commit refuses to follow a newer one.)"""
    for action in actions:
        if (txn := action.get("txn")) is not None and txn.get("appId") == fence:
            if int(txn["version"]) > epoch:
                raise FencedError(
                    f"table fenced by writer epoch {txn['version']} while this instance, epoch "
                    f"{epoch}, was committing: a newer instance took the stream over"
                )
        elif "metaData" in action or "protocol" in action or _removes(action, removed_paths):
            return False
    return True


def _removes(action: Action, paths: set[str]) -> bool:
    removed = action.get("remove")
    return removed is not None and unquote(removed["path"]) in paths


def _is_commit(actions: Iterable[Action], commit_id: str) -> bool:
    for action in actions:
        info = action.get("commitInfo")
        return info is not None and info.get(COMMIT_ID) == commit_id
    return False


def _commit_actions(commit: FencedCommit, commit_id: str) -> list[Action]:
    now_ms = int(time.time() * 1000)
    app_id, version = commit.transaction
    return [
        {
            "commitInfo": {
                "timestamp": now_ms,
                "operation": "WRITE",
                "operationParameters": {"mode": "Append"},
                "engineInfo": ENGINE,
                COMMIT_ID: commit_id,
            }
        },
        {"txn": {"appId": app_id, "version": version, "lastUpdated": now_ms}},
        *(
            {
                "remove": {
                    "path": log_path(file.path),
                    "deletionTimestamp": now_ms,
                    "dataChange": commit.data_change,
                    "extendedFileMetadata": True,
                    "partitionValues": file.partition_values,
                    "size": file.size,
                }
            }
            for file in commit.removed
        ),
        *(
            {
                "add": {
                    "path": log_path(file.path),
                    "partitionValues": file.partition_values,
                    "size": file.size,
                    "modificationTime": file.modification_time,
                    "dataChange": commit.data_change,
                    "stats": file.stats,
                }
            }
            for file in ([] if isinstance(commit.added, pa.Table) else commit.added)
        ),
    ]


def add_lines(files: pa.Table, data_change: bool) -> bytes:
    """The `add` action of each file of `files` (`WRITTEN_FILE_SCHEMA`), a line each, as
    `_commit_actions` writes them, joined column by column: a settle commits tens of thousands
    a slice, and a dictionary and its encoding per file took 4 us of the driver's, with 4 more
    to read each file's row as an object."""
    if not files.num_rows:
        return b""
    stats = files.column("stats").combine_chunks()
    if pc.any(pc.match_substring_regex(stats, "[\\x00-\\x1f]")).as_py():
        # Statistics are JSON text, which holds no control character outside a string's
        # escapes; should one ever, orjson escapes it as `_commit_actions` would.
        stats = pa.array([orjson.dumps(text)[1:-1].decode() for text in stats.to_pylist()])
    else:
        stats = pc.replace_substring(pc.replace_substring(stats, "\\", "\\\\"), '"', '\\"')
    lines = pc.binary_join_element_wise(
        '{"add":{"path":"',
        log_paths(files.column("path").combine_chunks()),
        '","partitionValues":',
        files.column("partition_values_json"),
        ',"size":',
        pc.cast(files.column("size"), pa.string()),
        ',"modificationTime":',
        pc.cast(files.column("modification_time"), pa.string()),
        f',"dataChange":{"true" if data_change else "false"},"stats":"',
        stats,
        '"}}\n',
        "",
    )
    joined = lines.combine_chunks() if isinstance(lines, pa.ChunkedArray) else lines
    _, offsets, text = joined.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int32)[joined.offset : joined.offset + len(joined) + 1]
    data: bytes = text[int(bounds[0]) : int(bounds[-1])].to_pybytes()
    return data
