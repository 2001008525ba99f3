"""A Delta table's `_delta_log`, read and appended to directly: one commit's actions, the newest
checkpoint, and a new commit written only if its version is still free.

delta-rs commits against a loaded snapshot, and a snapshot holds every file's `add` action: at a
million tenants a table of a file per tenant costs the driver over a gigabyte to commit to. A
commit needs far less: the commits since a version its writer already checked
(`storage.lake.log_commits`). This module is the log's files and nothing more; Delta's rules on
what may be committed live with the callers.

A version is written at most once, by whoever creates its file first (Delta's put-if-absent): on
a local disk a hard link, which fails if the name exists; on S3 a PUT with `If-None-Match: *`.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import boto3
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from storage.lake.file_names import percent_encoded, unencoded_pattern
from storage.lake.lake_filesystem import duration_s, filesystem_of
from storage.lake.s3_options import MAX_RETRIES

Action = dict[str, Any]
CHECKPOINT_BATCH_ROWS = 65_536

# Delta's protocol levels and writer features that a writer of plain files (no deletion
# vectors, row tracking, column mapping or domain metadata) may commit to without knowing them.
PLAIN_WRITER_VERSION = 2
PLAIN_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "checkConstraints"})


def plain_writer(min_writer_version: int, writer_features: Iterable[str] | None) -> bool:
    """Whether a table's protocol lets a writer that knows only files commit to it."""
    if min_writer_version <= PLAIN_WRITER_VERSION:
        return True
    return set(writer_features or ()) <= PLAIN_WRITER_FEATURES


_UNIT_MS = {
    "millisecond": 1,
    "second": 1_000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 7 * 86_400_000,
}


def table_configuration(metadata: Action | None) -> dict[str, str]:
    """A `metaData` action's `configuration`, from a commit (an object) or a checkpoint (pairs,
    as Arrow reads a map)."""
    configuration = (metadata or {}).get("configuration") or {}
    return dict(configuration) if isinstance(configuration, list) else configuration


def interval_ms(text: str | None, default_ms: int) -> int:
    """A table property's interval (`interval 7 days`) in milliseconds; `default_ms` where it
    is unset or unreadable."""
    match = re.fullmatch(r"\s*interval\s+(\d+)\s+(\w+?)s?\s*", text or "", re.IGNORECASE)
    if match is None or match.group(2).lower() not in _UNIT_MS:
        return default_ms
    return int(match.group(1)) * _UNIT_MS[match.group(2).lower()]


def checkpoint_metadata(checkpoint: pq.ParquetFile) -> Action | None:
    """A checkpoint's (first) `metaData` action; None if it holds none."""
    values = checkpoint.read(columns=["metaData"]).column("metaData").drop_null()
    return values[0].as_py() if len(values) else None


def checkpoint_batches(checkpoint: pq.ParquetFile, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """An opened checkpoint's `columns` (top-level names or dotted paths into them), those
    whose top-level column it has (a writer may leave out an action it has none of),
    `CHECKPOINT_BATCH_ROWS` rows at a time: only those columns' pages are read."""
    present = set(checkpoint.schema_arrow.names)
    held = [column for column in columns if column.split(".", 1)[0] in present]
    yield from checkpoint.iter_batches(batch_size=CHECKPOINT_BATCH_ROWS, columns=held)


_LOG_PATH_SAFE = "/=:"


def log_path(path: str) -> str:
    """A data file's path relative to its table as Delta's log spells it: percent-encoded,
    folders' `/` and Hive's `=` left as they are (what delta-rs and Spark decode)."""
    return percent_encoded(path, _LOG_PATH_SAFE)


def log_paths(paths: pa.Array) -> pa.Array:
    """`log_path` of each path, looked at column-wise: only a path that needs encoding is
    encoded on its own."""
    plain = pc.match_substring_regex(paths, f"^{unencoded_pattern(_LOG_PATH_SAFE)}$")
    if pc.all(plain).as_py():
        return paths
    return pa.array(
        [
            path if is_plain else log_path(path)
            for path, is_plain in zip(paths.to_pylist(), plain.to_pylist(), strict=True)
        ],
        pa.string(),
    )


@dataclass(frozen=True)
class DeltaLog:
    table_uri: str
    storage_options: Mapping[str, str] | None

    @cached_property
    def _filesystem(self) -> tuple[pafs.FileSystem, str]:
        filesystem, table_path = filesystem_of(self.table_uri, self.storage_options)
        return filesystem, f"{table_path.rstrip('/')}/_delta_log"

    @property
    def filesystem(self) -> pafs.FileSystem:
        return self._filesystem[0]

    @property
    def folder(self) -> str:
        """The log's folder as `filesystem` names it."""
        return self._filesystem[1]

    def commit_file(self, version: int) -> str:
        return f"{self.folder}/{version:020d}.json"

    def checkpoint_file(self, version: int) -> str:
        return f"{self.folder}/{version:020d}.checkpoint.parquet"

    def open_checkpoint(self, version: int) -> pq.ParquetFile:
        """Checkpoint `version`'s file, its footer read."""
        return pq.ParquetFile(self.checkpoint_file(version), filesystem=self.filesystem)

    def actions(self, version: int, with_files: bool = True) -> Iterator[Action] | None:
        """The actions of commit `version`, read a line at a time (a settle's commit at a
        million keys was 1.5 GB); None if there is no such commit yet. Without `with_files`,
        only the commit's transaction ids, metadata and protocol: its files' lines (`add`,
        `remove`, `cdc`) are skipped unparsed."""
        try:
            stream = self.filesystem.open_input_stream(self.commit_file(version))
        except FileNotFoundError:
            return None
        return _actions(stream, with_files)

    def has_commit(self, version: int) -> bool:
        found: pafs.FileType = self.filesystem.get_file_info(self.commit_file(version)).type
        return bool(found != pafs.FileType.NotFound)

    def newest_version_after(self, version: int) -> int:
        """The newest commit's version, looked for from `version` (one that exists) on."""
        while self.has_commit(version + 1):
            version += 1
        return version

    def last_checkpoint(self) -> dict[str, Any] | None:
        """`_last_checkpoint`'s fields, or None if the table has none (or it is unreadable:
        Delta makes it a hint, and readers then replay the log)."""
        try:
            with self.filesystem.open_input_stream(f"{self.folder}/_last_checkpoint") as stream:
                last = orjson.loads(stream.read())
        except (OSError, orjson.JSONDecodeError):
            return None
        return last if isinstance(last, dict) and "version" in last else None

    def checkpointed_version(self) -> int | None:
        """The version the newest checkpoint holds, when it is one classic file this module's
        readers take; -1 when there is none (a reader replays the log from its first commit);
        None for a multi-part or V2 checkpoint."""
        last = self.last_checkpoint()
        if last is None:
            return -1
        if last.get("parts") or last.get("v2Checkpoint"):
            return None
        return int(last["version"])

    def try_commit(self, version: int, actions: list[Action], lines: bytes = b"") -> bool:
        """Write commit `version` unless it exists; False if another writer's is there.
        `lines`: more actions after `actions`, encoded already (a line each)."""
        body = b"".join(orjson.dumps(action) + b"\n" for action in actions) + lines
        if self._s3_bucket_key is None:
            return self._link_new(self.commit_file(version), body)
        bucket, key = self._s3_bucket_key
        try:
            self._s3_client.put_object(
                Bucket=bucket, Key=f"{key}/{version:020d}.json", Body=body, IfNoneMatch="*"
            )
        except ClientError as error:
            # 412: the version exists. 409: a PUT of the same name was under way at once.
            if error.response.get("Error", {}).get("Code") in (
                "PreconditionFailed",
                "ConditionalRequestConflict",
            ):
                return False
            raise OSError(f"writing commit {version}: {error}") from error
        except BotoCoreError as error:
            # An OSError, as pyarrow's and delta-rs's failures are: `s3_options.reaching`
            # names the lake and its endpoint.
            raise OSError(f"writing commit {version}: {error}") from error
        return True

    def write_file(self, name: str, body: bytes) -> None:
        """Write (or replace) a file of the log's folder whole: readers never see it half
        written (a local file is renamed into place; an S3 object appears whole)."""
        path = f"{self.folder}/{name}"
        if self._s3_bucket_key is not None:
            with self.filesystem.open_output_stream(path) as stream:
                stream.write(body)
            return
        temporary = self.beside(name)
        with open(temporary, "wb") as file:
            file.write(body)
        os.replace(temporary, path)

    def beside(self, name: str) -> str:
        """A temporary path for a file about to become `name` in the log's folder: a name no
        reader takes for a commit or a checkpoint (it starts with a dot)."""
        return f"{self.folder}/.{name}.{uuid.uuid4().hex}.tmp"

    def _link_new(self, path: str, body: bytes) -> bool:
        # Written beside, then linked: a reader never sees a commit half written, and the link
        # fails if the version exists (a rename would replace it).
        temporary = self.beside(os.path.basename(path))
        with open(temporary, "wb") as file:
            file.write(body)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(temporary)
        return True

    @cached_property
    def _s3_bucket_key(self) -> tuple[str, str] | None:
        if not self.table_uri.startswith("s3://"):
            return None
        bucket, _, key = self.folder.partition("/")
        return bucket, key

    @cached_property
    def _s3_client(self) -> Any:
        options = self.storage_options or {}
        return boto3.client(
            "s3",
            endpoint_url=options.get("AWS_ENDPOINT_URL"),
            region_name=options.get("AWS_REGION"),
            aws_access_key_id=options.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=options.get("AWS_SECRET_ACCESS_KEY"),
            config=Config(
                connect_timeout=duration_s(options.get("connect_timeout", "5s")),
                read_timeout=duration_s(options.get("timeout", "20s")),
                retries={"max_attempts": MAX_RETRIES, "mode": "standard"},
            ),
        )


# How a file action's line starts as every writer we know spells it (one object, its action's
# name first, no spaces): skipped unparsed. A line spelled otherwise is parsed, then skipped.
_FILE_ACTION_STARTS = (b'{"add"', b'{"remove"', b'{"cdc"')
_FILE_ACTIONS = {"add", "remove", "cdc"}


def _actions(stream: pa.NativeFile, with_files: bool = True) -> Iterator[Action]:
    with stream:
        for line in lines(stream):
            if not with_files and line.startswith(_FILE_ACTION_STARTS):
                continue
            action: Action = orjson.loads(line)
            if with_files or not action.keys() & _FILE_ACTIONS:
                yield action


def lines(stream: pa.NativeFile, chunk_bytes: int = 1 << 22) -> Iterator[bytes]:
    """The stream's non-empty lines, read `chunk_bytes` at a time."""
    pending = b""
    while chunk := stream.read(chunk_bytes):
        *complete, pending = (pending + chunk).split(b"\n")
        yield from (line for line in complete if line.strip())
    if pending.strip():
        yield pending
