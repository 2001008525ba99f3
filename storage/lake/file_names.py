"""The names of the lake's data files, and what a staged file's name says back.

File names are derived from the stream, its writer epoch, the batch, the table and the Spark
partition, so a retried task or batch of the same instance writes the same names, and an
instance that took over (a new epoch) never overwrites a file an older one may have committed.
Files of an attempt that was never committed are referenced by no version: `vacuum` removes
them. A settled file's name comes from a digest of the staged files its compaction consumed, and
a staged file's name says which stream and write task wrote it (`write_task_of_staged_file`),
which lets compaction settle each write task's keys without a shuffle.
"""

from __future__ import annotations

import functools
import hashlib
import re
import uuid
from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class BatchFiles:
    """Where and under which names one micro-batch's files go; pickled to the executors.

    `storage_options` may hold S3 keys: they travel to the executors (which must reach the
    lake) but are never printed.
    """

    root: str
    storage_options: dict[str, str] | None
    stream: str
    writer_epoch: int
    batch_id: int
    table_names: tuple[str, ...]

    def __repr__(self) -> str:
        return f"BatchFiles({self.root!r}, batch {self.batch_id}, {self.table_names})"

    def file_name(self, task_partition: int, table_name: str, partition_values: str) -> str:
        # The partition's folder already tells the partition apart; the task partition tells
        # apart the files two tasks write into one folder. A short digest keeps names bounded.
        return (
            f"part-{self.stream}-e{self.writer_epoch}-b{self.batch_id:010d}-"
            f"t{task_partition:05d}-{_digest(table_name, partition_values)}.parquet"
        )


# `BatchFiles.file_name` and `MergeFiles.run_name`, read back: the stream is whatever precedes the
# fixed-format tail, so a stream name that itself contains dashes parses the same.
_BATCH_FILE_NAME = re.compile(
    r"^part-(?P<stream>.+)-e\d+-b\d{10}-t(?P<task>\d{5})-[0-9a-f]{12}\.parquet$"
)
_RUN_FILE_NAME = re.compile(
    r"^run-(?P<stream>.+)-e\d+-c(?P<inputs>[0-9a-f]{16})-a(?P<oldest_ms>\d{13,})"
    r"-t(?P<task>\d{5})\.parquet$"
)


def _staged_file_name(path: str) -> re.Match[str] | None:
    """A staged file's name read back: a batch's, or a run's; None for another name."""
    name = path.rsplit("/", 1)[-1]
    return _BATCH_FILE_NAME.match(name) or _RUN_FILE_NAME.match(name)


def stream_of_staged_file(path: str) -> str | None:
    """The stream that wrote a staged file (a batch's, or a run compaction merged); None for
    another name."""
    match = _staged_file_name(path)
    return None if match is None else match["stream"]


def written_by_a_batch(path: str) -> bool:
    """Whether a micro-batch wrote the file (`BatchFiles.file_name`): its rows are new to the
    table, where a compaction's files hold rows that a batch's file held before."""
    return _BATCH_FILE_NAME.match(path.rsplit("/", 1)[-1]) is not None


def write_task_of_staged_file(path: str) -> int | None:
    """The write task whose keys a staged file holds: the batch's write task that wrote it, or
    the one whose files a compaction merged into it (a run); None for another name."""
    match = _staged_file_name(path)
    return None if match is None else int(match["task"])


def run_inputs_digest(path: str) -> str | None:
    """The inputs digest a run's name carries (`MergeFiles.inputs_digest`); None for a file
    that is no run."""
    match = _RUN_FILE_NAME.match(path.rsplit("/", 1)[-1])
    return None if match is None else match["inputs"]


def run_oldest_ms(path: str) -> int | None:
    """When the oldest row of a run (`MergeFiles`) was staged; None for a file that is no run."""
    match = _RUN_FILE_NAME.match(path.rsplit("/", 1)[-1])
    return None if match is None else int(match["oldest_ms"])


@dataclass(frozen=True)
class SettledFiles:
    """Where and under which names one compaction's settled files go; pickled to executors.

    A settled partition gets one file per compaction (its rows all reach one task), named by
    the stream, the writer epoch, a digest of the staged files consumed and the write task: the
    same inputs always give the same name and the same bytes, and other inputs never overwrite
    it. The write task keeps two tasks apart if a key's rows ever reached both.
    """

    root: str
    storage_options: dict[str, str] | None
    stream: str
    writer_epoch: int
    inputs_digest: str
    table_name: str
    write_task: int = 0
    """The compaction's write task: a batch's write task whose staged files it compacts
    (`storage.upkeep.compaction_tasks`), or its Spark partition after a shuffle."""

    def __repr__(self) -> str:
        return f"SettledFiles({self.root!r}, {self.table_name}, inputs {self.inputs_digest})"

    def file_name(self, partition_values: str) -> str:
        return (
            f"settled-{self.stream}-e{self.writer_epoch}-c{self.inputs_digest}-"
            f"t{self.write_task:05d}-{_digest(self.table_name, partition_values)}.parquet"
        )


@dataclass(frozen=True)
class MergeFiles(SettledFiles):
    """Where and under which names a merging compaction's files go: its settled files, named as
    any compaction's, and its runs.

    A run is a staged file that compaction merged from batches' staged files: the rows of keys
    not yet worth a settled file, sorted by key, one file per write task. Its name carries when
    its oldest row was staged, so the compaction that settles it by age needs no read of it.
    """

    oldest_ms: int = 0

    def __repr__(self) -> str:
        return f"MergeFiles({self.root!r}, {self.table_name}, inputs {self.inputs_digest})"

    def run_name(self) -> str:
        return (
            f"run-{self.stream}-e{self.writer_epoch}-c{self.inputs_digest}-"
            f"a{self.oldest_ms:013d}-t{self.write_task:05d}.parquet"
        )


def _digest(table_name: str, partition_values: str) -> str:
    # The first 12 hex digits of `uuid.uuid5(NAMESPACE_URL, ...)`, which only its later bytes'
    # version and variant bits set apart from the SHA-1: the names earlier releases wrote, at a
    # fifth of the cost (a settle names a file per key).
    name = f"{table_name}/{partition_values}".encode()
    return hashlib.sha1(_URL_NAMESPACE + name, usedforsecurity=False).hexdigest()[:12]


_URL_NAMESPACE = uuid.NAMESPACE_URL.bytes


def percent_encoded(text: str, safe: str) -> str:
    """`urllib.parse.quote(text, safe=safe)`, without calling it where nothing needs encoding:
    a settle names and commits a file per key, and quoting each part was half of a slice's
    commit on the driver."""
    return text if _unencoded(safe).fullmatch(text) else quote(text, safe=safe)


@functools.cache
def _unencoded(safe: str) -> re.Pattern[str]:
    return re.compile(unencoded_pattern(safe))


def unencoded_pattern(safe: str) -> str:
    """A regular expression (Python's and RE2's) of the text that `quote(text, safe=safe)`
    leaves as it is (`quote` also keeps `~`, left to it)."""
    return f"[A-Za-z0-9_.\\-{re.escape(safe)}]*"
