"""Each tenant's rows of each table, in memory for the in-process engine (`local_sql`).

A tenant's rows of a table are read with pyarrow from the files the table's index lists for
that tenant (`table_files.TableFiles.files_of`), once per data file: Delta never changes a file,
so a new table version costs only the files it added. Kept within a byte budget: the least
recently queried tenant's rows go first.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from storage.lake.delta_lake import DeltaLake
from storage.lake.snapshot_reader import read_files
from storage.lake.table_files import TableFiles
from storage.lake.tables import TableSpec


@dataclass(frozen=True)
class _Piece:
    files: frozenset[str]
    rows: pa.Table


@dataclass(frozen=True)
class _Kept:
    """A tenant's rows of one table at one version, by the groups of files they were read from
    (`rows` None: more than the engine takes)."""

    version: int
    pieces: tuple[_Piece, ...]
    rows: pa.Table | None
    nbytes: int


@dataclass
class TenantRows:
    """Each tenant's rows of each table (tenant None: every tenant's), read once per data file,
    within a byte budget: the least recently queried tenant's rows go first."""

    lake: DeltaLake
    max_bytes: int
    _kept: collections.OrderedDict[tuple[str | None, str], _Kept] = field(
        default_factory=collections.OrderedDict
    )
    _kept_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def of(
        self, tenant: str | None, spec: TableSpec, table: TableFiles | None, max_bytes: int
    ) -> pa.Table | None:
        """`tenant`'s rows of `table`'s version (None: every tenant's), or None if they pass
        `max_bytes`. A table that does not exist (None) has no rows."""
        if table is None:
            return spec.schema.empty_table()
        key, version = (tenant, spec.name), table.version
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                if kept.version == version:
                    return kept.rows
        sizes = table.files_of(tenant)
        if sum(sizes.values()) > max_bytes:  # stored sizes: compressed, so fewer than in memory
            self._keep(key, _Kept(version, (), None, 0))
            return None
        files = frozenset(sizes)
        pieces = [piece for piece in (kept.pieces if kept else ()) if piece.files <= files]
        missing = files.difference(*(piece.files for piece in pieces))
        if missing:
            rows = read_files(
                table.table_uri,
                table.partition_schema,
                sorted(missing),
                spec.schema,
                self.lake.storage_options,
                row_filter=None if tenant is None else pc.field("tenant") == tenant,
            )
            pieces.append(_Piece(frozenset(missing), rows))
        nbytes = sum(piece.rows.nbytes for piece in pieces)
        if nbytes > max_bytes:
            self._keep(key, _Kept(version, (), None, 0))
            return None
        joined = (
            pa.concat_tables(piece.rows for piece in pieces)
            if pieces
            else spec.schema.empty_table()
        )
        self._keep(key, _Kept(version, tuple(pieces), joined, nbytes))
        return joined

    def _keep(self, key: tuple[str | None, str], kept: _Kept) -> None:
        with self._lock:
            previous = self._kept.pop(key, None)
            self._kept_bytes += kept.nbytes - (previous.nbytes if previous else 0)
            self._kept[key] = kept
            while self._kept_bytes > self.max_bytes and len(self._kept) > 1:
                _, evicted = self._kept.popitem(last=False)
                self._kept_bytes -= evicted.nbytes
