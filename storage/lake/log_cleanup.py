"""A table's log files past its log retention, deleted once a checkpoint stands in for them.

A stream adds a commit per table and batch: at a 1 s trigger, 86,400 files a day in each table's
`_delta_log`. Delta writers delete the old ones after they checkpoint, and so does this project
(`DeltaLake.checkpoint_log`), by Delta's rule: find the newest checkpoint older than the table's
`delta.logRetentionDuration` (30 days by default); every commit and checkpoint before it that is
older than the retention too goes. Every version from that checkpoint on can still be read (time
travel within the retention), and the log's file count stays bounded by the retention.
`delta.enableExpiredLogCleanup: false` turns it off.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass

import pyarrow.fs as pafs

from storage.lake.delta_log import DeltaLog, checkpoint_metadata, interval_ms, table_configuration

DEFAULT_LOG_RETENTION_MS = 30 * 86_400_000
"""Delta's default `delta.logRetentionDuration`."""
_LOG_FILE = re.compile(r"(\d{20})\.(json|crc|checkpoint(?:\.\d+\.\d+)?\.parquet)")
_CLASSIC_CHECKPOINT = "checkpoint.parquet"


@dataclass(frozen=True)
class _LogFile:
    path: str
    version: int
    kind: str
    modified_ms: int


def clean_up_expired_logs(delta_log: DeltaLog, now_ms: int | None = None) -> int:
    """Delete the log's expired commits and checkpoints (see the module's doc); how many."""
    version = delta_log.checkpointed_version()
    if version is None or version < 0:
        return 0
    configuration = table_configuration(checkpoint_metadata(delta_log.open_checkpoint(version)))
    if configuration.get("delta.enableExpiredLogCleanup", "true").strip().lower() == "false":
        return 0
    retention_ms = interval_ms(
        configuration.get("delta.logRetentionDuration"), DEFAULT_LOG_RETENTION_MS
    )
    cutoff_ms = (time.time_ns() // 1_000_000 if now_ms is None else now_ms) - retention_ms
    files = _log_files(delta_log)
    boundaries = [
        file.version
        for file in files
        if file.kind == _CLASSIC_CHECKPOINT and file.modified_ms < cutoff_ms
    ]
    if not boundaries:
        return 0
    boundary = max(boundaries)
    expired = [file for file in files if file.version < boundary and file.modified_ms < cutoff_ms]
    for file in expired:
        with contextlib.suppress(FileNotFoundError):  # another writer's cleanup took it
            delta_log.filesystem.delete_file(file.path)
    return len(expired)


def _log_files(delta_log: DeltaLog) -> list[_LogFile]:
    files = []
    for info in delta_log.filesystem.get_file_info(pafs.FileSelector(delta_log.folder)):
        match = _LOG_FILE.fullmatch(info.base_name)
        if match is None or info.mtime_ns is None:
            continue
        modified_ms = info.mtime_ns // 1_000_000
        files.append(_LogFile(info.path, int(match.group(1)), match.group(2), modified_ms))
    return files
