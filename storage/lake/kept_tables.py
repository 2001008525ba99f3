"""A writer's tables kept open between its batches, moved forward by their new commits only.

Opening a Delta table reads its newest log checkpoint and every commit after it. A micro-batch
asks each output table whether it holds the batch already, then commits to it: a dozen opens a
batch, each reading the checkpoint again. Once a compaction has settled many tenants, that
checkpoint lists a file per tenant (200,000 at 100,000 tenants), and every open materialised
all of them. A kept table reads only the commits since it last looked (`update_incremental`,
about a millisecond with nothing new).

For one caller at a time (a stream's batches run one after another): delta-rs table objects
are not meant to be moved forward from two threads at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deltalake import DeltaTable

from storage.lake.delta_lake import DeltaLake
from storage.lake.s3_options import reaching
from storage.lake.tables import TableSpec


@dataclass
class KeptTables:
    lake: DeltaLake
    _tables: dict[str, DeltaTable] = field(default_factory=dict)

    def current(self, spec: TableSpec) -> DeltaTable:
        """`spec`'s table at its newest version (delta-rs' `TableNotFoundError` if none)."""
        table = self._tables.get(spec.name)
        if table is None:
            table = self._tables[spec.name] = self.lake.open(spec)
            return table
        with reaching(self.lake.root, self.lake.storage_options, f"reading table {spec.name}"):
            table.update_incremental()
        return table
