"""The lake's tables' files kept at their newest versions, moved forward by their new commits only,
for a long-running reader (the query service).

Opening a Delta table reads its newest log checkpoint and every commit after it. Once a
compaction has settled many tenants, that checkpoint lists a file per tenant (200,000 at 100,000
tenants), and every open materialises all of them. Kept here, each table's data files by tenant
(`TableFiles`) move forward by the log's new commits (`TableFiles.advanced`). Each version's
files are an object of their own, never changed, so a statement keeps reading the version it
started with while the tables move on. Thread-safe. Two ways to move forward:

- on demand (the default): each `files` call reads the commits since the last one, so a
  statement reads the newest version;
- followed (`follow`): a thread reads new commits every interval, and `files` returns the
  newest version it has, at once. A statement then never waits for a commit to be read: a
  compaction's commit swaps a file per tenant (200,000 at 100,000 tenants), and reading it took
  a second, paid by the first statement after it. The price is up to one interval (plus that
  reading) before a new commit is seen.

(A writer keeps only its tables' heads: `log_head.LogHeads`.)
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from storage.lake.delta_lake import DeltaLake
from storage.lake.s3_options import reaching
from storage.lake.table_files import TableFiles
from storage.lake.tables import TableSpec

log = logging.getLogger(__name__)


@dataclass
class NewestTables:
    lake: DeltaLake
    _files: dict[str, TableFiles] = field(default_factory=dict)
    """Per table, its files at the newest version read."""
    _specs: dict[str, TableSpec] = field(default_factory=dict)
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _follower: threading.Thread | None = None

    def files(self, spec: TableSpec) -> TableFiles:
        """`spec`'s files at its newest version (delta-rs' `TableNotFoundError` if there is
        none yet). Callers only read them: they are shared by every statement of that
        version."""
        if self._follower is not None:
            followed = self._files.get(spec.name)
            if followed is not None:
                return followed
        return self._advance(spec)

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
                specs = list(self._specs.values())
            try:
                for spec in specs:
                    self._advance(spec)
            except Exception as error:
                # Statements keep reading the newest version read; the next round retries.
                if not failing:
                    log.warning("reading the tables' new commits failed: %s", error)
                failing = True
            else:
                if failing:
                    log.info("reading the tables' new commits works again")
                failing = False

    def _advance(self, spec: TableSpec) -> TableFiles:
        with self._lock:
            lock = self._locks.setdefault(spec.name, threading.Lock())
        with lock, reaching(self.lake.root, self.lake.storage_options, f"reading {spec.name}"):
            current = self._files.get(spec.name)
            newest = None if current is None else current.advanced(self.lake.storage_options)
            if newest is None:
                uri, options = self.lake.table_uri(spec), self.lake.storage_options
                newest = TableFiles.of_log(uri, spec.storage_schema, options)
            if newest is None:
                newest = TableFiles.of_table(self.lake.open(spec))
            self._files[spec.name] = newest
            with self._lock:
                self._specs[spec.name] = spec
            return newest
