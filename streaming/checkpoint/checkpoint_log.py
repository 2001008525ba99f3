"""Read Spark's checkpoint logs without Spark: which batch is planned, which is committed, and
the Kafka offsets a batch ends at.

Spark writes `offsets/<batch>` before a batch runs (line 1 the version `v1`, line 2 the batch
metadata, then one line per source with that source's offset JSON) and `commits/<batch>` after
its sink returned. A batch in `offsets/` without a `commits/` entry is in progress, or is
replayed on restart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyarrow import fs

from streaming.kafka.options import partition_offsets

OFFSETS_DIR = "offsets"
COMMITS_DIR = "commits"


def source_offset(text: str) -> dict[str, Any]:
    """The source's offset recorded in one `offsets/<batch>` file, as the source wrote it."""
    lines = text.splitlines()
    if len(lines) < 3 or lines[0].strip() != "v1":
        raise ValueError(f"not a Spark offset log entry: {lines[:1]!r}, {len(lines)} lines")
    offsets = json.loads(lines[2])
    if not isinstance(offsets, dict):
        raise ValueError(f"the source offsets are not a JSON object: {lines[2][:200]!r}")
    return offsets


def parse_offsets_file(text: str, topic: str) -> dict[int, int]:
    """The next offset per partition of `topic` recorded in one `offsets/<batch>` file.

    The source line is this project's reader's `{"<partition>": offset}` (with its planning
    time, `_at_ms`) or Spark's own Kafka source's `{"<topic>": {"<partition>": offset}}`.
    """
    offsets = source_offset(text)
    if offsets and all(isinstance(value, dict) for value in offsets.values()):
        offsets = offsets.get(topic, {})
    return partition_offsets(offsets)


def checkpoint_filesystem(checkpoint_dir: str) -> tuple[fs.FileSystem, str]:
    """A pyarrow filesystem and path for a checkpoint folder: a local path or a URI."""
    location = checkpoint_dir if "://" in checkpoint_dir else str(Path(checkpoint_dir).resolve())
    filesystem, path = fs.FileSystem.from_uri(location)
    return filesystem, str(path)


class CheckpointLog:
    """The offset and commit logs of one checkpoint folder (local or a pyarrow-supported URI)."""

    def __init__(self, checkpoint_dir: str) -> None:
        self._filesystem, self._path = checkpoint_filesystem(checkpoint_dir)

    def latest_batch(self, log: str) -> int | None:
        """The highest batch id in `log` (`offsets` or `commits`), None if it has none."""
        return max(self._batch_ids(log), default=None)

    def oldest_batch_timestamp_ms(self) -> int | None:
        """The timestamp of the oldest batch Spark still keeps in its offset log: no replay
        and no notification needs the config of an earlier moment. None without entries."""
        for batch_id in sorted(self._batch_ids(OFFSETS_DIR)):
            timestamp_ms = self.batch_timestamp_ms(batch_id)
            if timestamp_ms is not None:
                return timestamp_ms
        return None

    def _batch_ids(self, log: str) -> list[int]:
        selector = fs.FileSelector(f"{self._path}/{log}", allow_not_found=True)
        return [
            int(info.base_name)
            for info in self._filesystem.get_file_info(selector)
            # Spark writes to a hidden temp file and renames: only whole entries are numbers.
            if info.type == fs.FileType.File and info.base_name.isdigit()
        ]

    def batch_timestamp_ms(self, batch_id: int) -> int | None:
        """The batch's timestamp (what its config and timeouts go by), None once Spark purged
        the entry or if it is not a whole entry."""
        try:
            with self._filesystem.open_input_stream(
                f"{self._path}/{OFFSETS_DIR}/{batch_id}"
            ) as file:
                lines = file.read().decode("utf-8").splitlines()
            return int(json.loads(lines[1])["batchTimestampMs"])
        except (OSError, IndexError, KeyError, ValueError):
            return None

    def offsets(self, batch_id: int, topic: str) -> dict[int, int]:
        """The offsets batch `batch_id` ends at (exclusive), per partition."""
        return parse_offsets_file(self._offsets_text(batch_id), topic)

    def source_offset(self, batch_id: int) -> dict[str, Any]:
        """Batch `batch_id`'s end offset as its source wrote it."""
        return source_offset(self._offsets_text(batch_id))

    def _offsets_text(self, batch_id: int) -> str:
        with self._filesystem.open_input_stream(f"{self._path}/{OFFSETS_DIR}/{batch_id}") as file:
            text: str = file.read().decode("utf-8")
        return text
