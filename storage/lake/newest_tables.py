"""The lake's tables' files kept at their newest versions, moved forward by their new commits only,
for a long-running reader (the query service).

Opening a Delta table reads its newest log checkpoint and every commit after it. Once a
compaction has settled many tenants, that checkpoint lists a file per tenant (200,000 at 100,000
tenants), and every open materialises all of them. Kept here, files move forward by the log's new
commits. Each version's files are an object of their own, never changed, so a statement keeps
reading the version it started with while the tables move on. Thread-safe.

A tenant's statement needs that tenant's files only, and at a million tenants an index of every
file held gigabytes and took a fresh service minutes to build. So a tenant's files are indexed on
their own when first asked for (`TableFiles.of_checkpoint`: the checkpoint's row groups that may
hold the tenant), for the tenants asked about recently (`MAX_TENANTS` a table), and moved forward
by the table's commits since that checkpoint, which are read once for all of them and kept
grouped by tenant: a tenant's move costs its own changes and the staged files'. Once a newer
checkpoint stands in for them, they are let go. Nothing builds the whole table's index: a
statement over every tenant (the operator's) is Spark's to read, and needs only the versions
(`version`).

Two ways to move forward:

- on demand (the default): each `files` call reads the commits since the last one, so a
  statement reads the newest version;
- followed (`follow`): a thread reads new commits every interval, and `files` answers from what
  it has read, at once. A statement then never waits for a commit to be read: a settle's commits
  add a file per tenant (a million at a million tenants). The price is up to one interval (plus
  that reading) before a new commit is seen.

(A writer keeps only its tables' heads: `log_head.LogHeads`.)
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from storage.lake.delta_lake import DeltaLake
from storage.lake.delta_log import DeltaLog
from storage.lake.s3_options import reaching
from storage.lake.table_files import (
    MAX_COMMITS_PER_ADVANCE,
    FileChange,
    OpenedCheckpoint,
    TableFiles,
    file_changes,
)
from storage.lake.tables import TableSpec, tenant_partition_column

log = logging.getLogger(__name__)

MAX_TENANTS = 1_024
"""Tenants whose files a table keeps indexed; the one asked about longest ago goes first (and is
indexed again from the checkpoint, in tens of milliseconds, when asked about again)."""


@dataclass
class NewestTables:
    lake: DeltaLake
    _tables: dict[str, _FollowedTable] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _follower: threading.Thread | None = None

    def files(self, spec: TableSpec, tenant: str) -> TableFiles:
        """`spec`'s files of `tenant` and the staged ones, at its newest version (delta-rs'
        `TableNotFoundError` if there is none yet). Callers only read them: they are shared by
        every statement of that version."""
        return self._advanced(spec).of_tenant(tenant)

    def version(self, spec: TableSpec) -> int:
        """`spec`'s newest version, as `files` would read it, without indexing any file: what
        a statement over every tenant (the operator's, which Spark reads) needs to know."""
        return self._advanced(spec).newest_version()

    def _advanced(self, spec: TableSpec) -> _FollowedTable:
        with self._lock:
            table = self._tables.get(spec.name)
            if table is None:
                table = self._tables[spec.name] = _FollowedTable(self.lake, spec)
        if self._follower is None or not table.followed:
            table.advance()
        return table

    def follow(self, interval_s: float) -> None:
        """Read new commits of the tables `files` was asked for every `interval_s`, in a
        thread, until `close`."""
        if self._follower is not None:
            return
        self._follower = threading.Thread(
            target=self._follow, args=(interval_s,), name="newest-tables", daemon=True
        )
        self._follower.start()

    def close(self) -> None:
        self._stop.set()
        if self._follower is not None:
            self._follower.join()

    def _follow(self, interval_s: float) -> None:
        failing = False
        while not self._stop.wait(interval_s):
            with self._lock:
                tables = list(self._tables.values())
            try:
                for table in tables:
                    table.advance()
            except Exception as error:
                # Statements keep reading the newest version read; the next round retries.
                if not failing:
                    log.warning("reading the tables' new commits failed: %s", error)
                failing = True
            else:
                if failing:
                    log.info("reading the tables' new commits works again")
                failing = False


@dataclass(frozen=True)
class _Commit:
    """One commit's file changes, grouped by the tenant whose partition holds each file."""

    by_tenant: Mapping[str, list[FileChange]]
    shared: list[FileChange]
    """Changes of files no tenant's partition holds (staged ones): every tenant's."""

    @classmethod
    def of(cls, changes: list[FileChange]) -> _Commit:
        by_tenant: dict[str, list[FileChange]] = {}
        shared = []
        for change in changes:
            if change.tenant is None:
                shared.append(change)
            else:
                by_tenant.setdefault(change.tenant, []).append(change)
        return cls(by_tenant, shared)


class _FollowedTable:
    """One table: the commits since its newest checkpoint, grouped (`_Commit`), and the
    indexes built from them (the recent tenants')."""

    def __init__(self, lake: DeltaLake, spec: TableSpec) -> None:
        self._lake = lake
        self._spec = spec
        self._log = DeltaLog(lake.table_uri(spec), lake.storage_options)
        self._advancing = threading.Lock()
        """One reader of new commits at a time; `_lock` is held only to change what it read."""
        self._lock = threading.Lock()
        self._checkpoint: int | None = None
        """The checkpoint the held commits follow (-1: none, they start at the table's first
        commit); None: not followed (not read yet, a log this module cannot read, or one that
        took a turn the grouping cannot follow: new metadata, ...). Unfollowed, each index is
        delta-rs's, and the next `advance` starts over."""
        self._version = -1
        """The newest version read: `_commits` hold every commit after `_checkpoint` up to it."""
        self._commits: dict[int, _Commit] = {}
        self._tenant_column: str | None = None
        self._tenants: collections.OrderedDict[str, TableFiles] = collections.OrderedDict()
        self._opened: OpenedCheckpoint | None = None
        """`_checkpoint`, opened (None: not yet)."""

    @property
    def followed(self) -> bool:
        return self._checkpoint is not None

    def advance(self) -> None:
        """Read the commits the table gained since the last call; on a newer checkpoint, let
        the commits it stands in for go."""
        doing = f"reading {self._spec.name}"
        with self._advancing, reaching(self._lake.root, self._lake.storage_options, doing):
            if self._checkpoint is None and not self._start():
                return
            checkpoint = self._log.checkpointed_version()
            followed_from = self._checkpoint
            opened = None
            if checkpoint is not None and followed_from is not None and checkpoint > followed_from:
                # Opened here, in the follower's thread, not by the next statement: reading
                # the footer and `metaData` of a million rows' checkpoint took tens of ms.
                opened = OpenedCheckpoint.open(self._log, checkpoint)
            with self._lock:
                if checkpoint is None:
                    self._checkpoint = None
                    return
                if self._checkpoint is not None and checkpoint > self._checkpoint:
                    self._checkpoint = checkpoint
                    self._opened = opened
                    self._version = max(self._version, checkpoint)
                    self._commits = {v: c for v, c in self._commits.items() if v > checkpoint}
            for _ in range(MAX_COMMITS_PER_ADVANCE):
                actions = self._log.actions(self._version + 1)
                if actions is None:
                    return
                changes = file_changes(actions, self._tenant_column)
                with self._lock:
                    if changes is None:
                        self._checkpoint = None
                        return
                    self._version += 1
                    self._commits[self._version] = _Commit.of(changes)

    def _start(self) -> bool:
        """Follow the table from its newest checkpoint (every index is built anew); False
        where this module cannot read its log, or there is no table (yet)."""
        checkpoint = self._log.checkpointed_version()
        if checkpoint is None:
            return False
        opened = None
        if checkpoint >= 0:
            # Its partitioning is the table's: new metadata in a later commit stops the
            # following (`file_changes`).
            opened = OpenedCheckpoint.open(self._log, checkpoint)
            if opened is None:
                return False
            partition_columns, version = opened.partition_columns, checkpoint
        else:
            head = self._lake.head(self._spec)
            if head is None:
                return False
            # Indexes start from delta-rs's load, which is at least this version; the commits
            # held start after it.
            partition_columns, version = head.partition_columns, head.version
        with self._lock:
            self._tenant_column = tenant_partition_column(partition_columns)
            self._checkpoint = checkpoint
            self._opened = opened
            self._version = version
            self._commits = {}
            self._tenants.clear()
        return True

    def of_tenant(self, tenant: str) -> TableFiles:
        with self._lock:
            files = self._moved_on(self._tenants.pop(tenant, None), tenant)
            self._tenants[tenant] = files
            while len(self._tenants) > MAX_TENANTS:
                self._tenants.popitem(last=False)
            return files

    def newest_version(self) -> int:
        """The newest version read; unfollowed, the table's newest, from its log's head (delta-rs'
        `TableNotFoundError` where there is no table)."""
        with self._lock:
            if self._checkpoint is not None:
                return self._version
        head = self._lake.head(self._spec)
        if head is not None:
            return head.version
        return self._lake.open(self._spec).version()

    def _moved_on(self, files: TableFiles | None, tenant: str) -> TableFiles:
        """`files` (the tenant's) at the newest version read: indexed anew from the checkpoint
        where they are older than it, then moved on by the commits held. Unfollowed,
        delta-rs's at the table's newest version."""
        checkpoint = self._checkpoint
        if checkpoint is None or (files is not None and files.version < checkpoint):
            files = None
        if files is None and checkpoint is not None and checkpoint >= 0:
            if self._opened is None or self._opened.version != checkpoint:
                self._opened = OpenedCheckpoint.open(self._log, checkpoint)
            if self._opened is not None:
                files = TableFiles.of_checkpoint(self._opened, self._spec.storage_schema, tenant)
            if files is None:
                self._checkpoint = checkpoint = None
        if files is None:
            # Unfollowed, or a table without a checkpoint yet (its first 100 commits).
            files = TableFiles.of_table(self._lake.open(self._spec), only_tenant=tenant)
            if checkpoint is None:
                return files
        if files.version >= self._version:
            return files
        changes: list[FileChange] = []
        for version in range(files.version + 1, self._version + 1):
            commit = self._commits[version]
            changes += commit.shared
            changes += commit.by_tenant.get(tenant, ())
        return files.changed(self._version, changes)
