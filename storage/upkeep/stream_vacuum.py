"""The stream's own vacuum: files older table versions needed go once `lake.vacuum_retention`
has passed since a commit removed them.

Every compaction and packing removes files from a table's current version, and a long-running
stream removes thousands an hour: without a vacuum, the lake's files grow as long as the stream
runs. When it runs (after the first compaction of each `stream.vacuum_interval`) is the
compaction schedule's to say (`streaming.pipeline.compaction_schedule`).

It deletes only files a commit removed (delta-rs's "lite" vacuum, which reads the log): never a
file a batch in flight has written and not yet committed, whatever the retention, and it needs no
listing of the lake, which at a million tenants holds millions of objects. Files no commit ever
named (an attempt that crashed before its commit) are for `tenant-windows vacuum`, which lists
everything.

A vacuum that fails (a storage error, another writer's commit first) is logged and tried again
at the next interval: the stream's output does not depend on it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from storage.lake.delta_lake import DeltaLake

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamVacuum:
    lake: DeltaLake
    retention_ms: int
    interval_ms: int
    """How often the stream runs it; 0: never."""

    def run(self) -> None:
        """Delete, in every table, the files commits removed more than `retention_ms` ago."""
        try:
            deleted = self.lake.vacuum(self.retention_ms, dry_run=False, unreferenced=False)
        except Exception as error:  # the output does not depend on it: the next interval retries
            log.warning("the vacuum failed; the next interval tries again: %s", error)
            return
        log.info(
            "vacuumed the files older versions needed: %s",
            ", ".join(f"{table} {len(files)}" for table, files in deleted.items()),
        )
