"""The lake's pyarrow filesystem: local, or S3 with the endpoint, keys and timeouts delta-rs gets.

Executors write and read data files through it, and the driver lists, reads and deletes files
outside Delta's log (quarantine, deferral, purge, snapshot reads). A module of its own, so those
readers load no writer.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Mapping

import pyarrow as pa
from pyarrow import fs

# pyarrow's default retries each request 3 times; with a timeout per attempt, a stalled store
# would hold a task for 3 timeouts. Two attempts ride out a dropped connection and keep a task
# within about twice `lake.s3.timeout`, like delta-rs on the driver.
S3_ATTEMPTS = 2


def filesystem_of(
    root: str, storage_options: Mapping[str, str] | None
) -> tuple[fs.FileSystem, str]:
    """A pyarrow filesystem and base path for the lake root (local, or `s3://` with the same
    endpoint, keys and timeouts delta-rs gets)."""
    if not root.startswith("s3://"):
        local = root.removeprefix("file://")
        return fs.LocalFileSystem(), local.rstrip("/")
    options = storage_options or {}
    endpoint = options.get("AWS_ENDPOINT_URL")
    scheme = "https"
    if endpoint is not None and "://" in endpoint:
        scheme, endpoint = endpoint.split("://", 1)
    s3 = fs.S3FileSystem(
        access_key=options.get("AWS_ACCESS_KEY_ID"),
        secret_key=options.get("AWS_SECRET_ACCESS_KEY"),
        region=options.get("AWS_REGION"),
        endpoint_override=endpoint,
        scheme=scheme,
        connect_timeout=duration_s(options.get("connect_timeout", "5s")),
        request_timeout=duration_s(options.get("timeout", "20s")),
        retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=S3_ATTEMPTS),
        # A settle writes a file of a few hundred bytes per key. Opened at once, each is a
        # multipart upload (start, part, complete: three requests); opened on its first write,
        # a file smaller than a part is one PutObject. A failed open then shows at the write or
        # the close, where the writers catch it anyway.
        allow_delayed_open=True,
        background_writes=_may_start_upload_threads(),
    )
    return s3, root.removeprefix("s3://").rstrip("/")


def _may_start_upload_threads() -> bool:
    """Whether uploads may run on Arrow's IO threads, which Arrow starts on demand from the
    thread that needs one and keeps for the life of the process: not from a thread running at a
    lower CPU priority than its process (a compaction task's, `storage.upkeep.worker_priority`).
    Threads inherit their creator's priority, so the batches Spark later runs in that worker
    would upload through threads that get the CPU last. Such a thread uploads on its own
    instead; a file smaller than a part (all but the largest) is one request either way."""
    if not sys.platform.startswith("linux"):  # a priority per thread is Linux's
        return True
    this_thread = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    return this_thread <= os.getpriority(os.PRIO_PROCESS, os.getpid())


def make_folder(filesystem: fs.FileSystem, folder: str) -> None:
    """Make `folder` (and its parents) for a file about to be written there.

    Only a local disk needs it. An object store has no folders: pyarrow would HEAD the bucket
    and PUT an empty marker object for each level, four requests more than the file's own for
    a settled file, and a settle writes one per key."""
    if not isinstance(filesystem, fs.S3FileSystem):
        filesystem.create_dir(folder, recursive=True)


def remove_folder(filesystem: fs.FileSystem, folder: str) -> None:
    """Remove `folder` and everything in it; one already gone is no error."""
    with contextlib.suppress(FileNotFoundError):
        filesystem.delete_dir(folder)


def write_file(filesystem: fs.FileSystem, path: str, content: bytes | pa.Buffer) -> None:
    """Write `content` as the file at `path` (replacing one there), in a folder that exists.

    A local file is written by the system calls themselves: a settle writes a file per key, and
    for a file of a few KB pyarrow's stream object cost 10-12 µs against the calls' 8."""
    if not isinstance(filesystem, fs.LocalFileSystem):
        with filesystem.open_output_stream(path) as out:
            out.write(content)
        return
    data = memoryview(content)
    descriptor = os.open(path, _NEW_FILE, 0o666)
    try:
        while data:
            data = data[os.write(descriptor, data) :]
    finally:
        os.close(descriptor)


_NEW_FILE = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_TRUNC
    | getattr(os, "O_CLOEXEC", 0)  # POSIX
    | getattr(os, "O_BINARY", 0)  # Windows
)


def lake_endpoint(storage_options: Mapping[str, str]) -> str:
    """The S3 endpoint the options point at, for error messages (never the keys)."""
    return storage_options.get("AWS_ENDPOINT_URL", f"AWS S3 ({storage_options.get('AWS_REGION')})")


def duration_s(text: str) -> float:
    """Seconds of an object_store duration as `s3_options` writes them: `250ms` or `5s`."""
    if text.endswith("ms"):
        return int(text[:-2]) / 1000
    if text.endswith("s"):
        return float(text[:-1])
    raise ValueError(f"expected a duration like 250ms or 5s; got {text!r}")
