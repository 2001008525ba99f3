"""The lake's tables at their newest versions, for a long-running reader (the query service).

Opening a table reads its whole log (2-3 ms each here, and five tables a statement); a table
kept open reads only the commits since it last looked (`update_incremental`, about 0.5 ms).
Each version gets a table object of its own, loaded at that version and never moved, so a
statement keeps reading the version it started with while another statement looks for newer
ones.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from deltalake import DeltaTable

from storage.lake.delta_lake import DeltaLake
from storage.lake.s3_options import reaching
from storage.lake.tables import TableSpec


@dataclass
class LatestTables:
    lake: DeltaLake
    _watched: dict[str, DeltaTable] = field(default_factory=dict)
    """One table object per table, moved forward to each newest version."""
    _newest: dict[str, DeltaTable] = field(default_factory=dict)
    """Per table, an object loaded at the newest version seen, never moved."""
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def latest(self, spec: TableSpec) -> DeltaTable:
        """`spec`'s table at its newest version (delta-rs' `TableNotFoundError` if there is
        none yet). Callers only read it: it is shared by every statement of that version."""
        with self._lock:
            lock = self._locks.setdefault(spec.name, threading.Lock())
        with lock, reaching(self.lake.root, self.lake.storage_options, f"reading {spec.name}"):
            watched = self._watched.get(spec.name)
            if watched is None:
                watched = self._watched[spec.name] = self.lake.open(spec)
            else:
                watched.update_incremental()
            version = watched.version()
            newest = self._newest.get(spec.name)
            if newest is None or newest.version() != version:
                newest = DeltaTable(
                    self.lake.table_uri(spec),
                    version=version,
                    storage_options=self.lake.storage_options,
                )
                self._newest[spec.name] = newest
            return newest
