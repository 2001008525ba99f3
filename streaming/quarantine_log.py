"""Log a batch's quarantined records where an operator sees them: tenant, source, Kafka
coordinates and reason.

The driver must not collect the stream's rows, and running the batch's plan a second time would
double its cost. The quarantine files the executors just wrote are already in the lake, and the
sink has their list: the first few rows are read back from those files, only the columns the
log line needs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow.parquet as pq

from storage.data_files import WrittenFile, filesystem_of
from storage.delta_lake import DeltaLake
from storage.tables import QUARANTINE

log = logging.getLogger(__name__)

LOGGED_PER_BATCH = 20
_COLUMNS = ["tenant", "source", "topic", "partition", "offset", "error"]


def log_quarantined(lake: DeltaLake, files: Sequence[WrittenFile], batch_id: int) -> int:
    """Log the first `LOGGED_PER_BATCH` quarantined records of the batch and a count line;
    returns how many the batch quarantined."""
    quarantined = [file for file in files if file.table_name == QUARANTINE.name]
    total = sum(file.num_records for file in quarantined)
    if total == 0:
        return 0
    filesystem, base = filesystem_of(lake.root, lake.storage_options)
    logged = 0
    for file in quarantined:
        if logged >= LOGGED_PER_BATCH:
            break
        reason = file.partition_values.get("reason")
        path = f"{base}/{QUARANTINE.name}/{file.path}"
        with filesystem.open_input_file(path) as handle:
            batches = pq.ParquetFile(handle).iter_batches(
                batch_size=LOGGED_PER_BATCH - logged, columns=_COLUMNS
            )
            rows = next(batches).to_pylist()
        for row in rows:
            log.warning(
                "quarantined: tenant=%s source=%s at %s/%s@%s, reason %s: %s",
                row["tenant"],
                row["source"],
                row["topic"],
                row["partition"],
                row["offset"],
                reason,
                row["error"],
            )
        logged += len(rows)
    log.warning(
        "batch %d: %d records quarantined (%d logged above); all of them are in the %s table",
        batch_id,
        total,
        logged,
        QUARANTINE.name,
    )
    return total
