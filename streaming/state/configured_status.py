"""A `tenant_status` row for every configured key, not only for keys that had records.

The state function writes status rows only for the keys a bucket touches, and a bucket of
keys that never sent anything has no state and never runs. So the driver adds them: the batch
in which a key first appears in the tenant config (the snapshot in force at the batch's
timestamp, compared with the one the previous batch used; at batch 0 every configured key)
writes a `configured` row for it, with no watermark and zero counters. A key that also had
records in that batch already has its `active` row there and gets none.

Deterministic under replay: the config of a batch comes from its timestamp in Spark's offset
log, and the rows are committed with the rest of the batch's `tenant_status` files, under the
batch's transaction id.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.parquet as pq

from storage.lake.file_names import BatchFiles
from storage.lake.file_writer import write_batch_rows
from storage.lake.lake_filesystem import filesystem_of
from storage.lake.tables import TENANT_STATUS
from storage.lake.written_files import WrittenFile
from streaming.checkpoint.checkpoint_log import CheckpointLog
from streaming.state.bucket_state import Key
from streaming.state.union_rows import Lifecycle, union_table
from tenants.config_store import ConfigSnapshots
from tenants.registry import TenantRegistry

log = logging.getLogger(__name__)

# The task partition in the names of files the driver writes: executors' partitions are the
# shuffle partitions, far below it.
DRIVER_TASK_PARTITION = 99_999


def newly_configured_keys(previous: TenantRegistry | None, current: TenantRegistry) -> list[Key]:
    """Keys `current` configures and `previous` (None: no config before) does not."""
    if previous is not None and previous.fingerprint == current.fingerprint:
        return []
    return sorted(current.keys_added_since(previous))


def status_rows(keys: list[Key], processing_time_ms: int) -> pa.Table:
    """`configured` rows in the stateful stage's union schema, as the sink's writer takes them."""
    rows = len(keys)
    return union_table(
        {
            "kind": [TENANT_STATUS.name] * rows,
            "tenant": [tenant for tenant, _ in keys],
            "source": [source for _, source in keys],
            "open_windows": [0] * rows,
            "processing_time_ms": [processing_time_ms] * rows,
            "on_time_records": [0] * rows,
            "late_records": [0] * rows,
            "too_late_records": [0] * rows,
            "quarantined_records": [0] * rows,
            "lifecycle": [Lifecycle.CONFIGURED.value] * rows,
        },
        rows,
    )


@dataclass(frozen=True)
class ConfiguredKeyRows:
    """The sink's `driver_files`: this batch's `configured` rows, written as one more file."""

    snapshots: ConfigSnapshots
    checkpoint_log: CheckpointLog

    def __call__(self, target: BatchFiles, written: list[WrittenFile]) -> list[WrittenFile]:
        if TENANT_STATUS.name not in target.table_names:
            return []
        processing_time_ms = self.checkpoint_log.batch_timestamp_ms(target.batch_id)
        if processing_time_ms is None:
            log.warning("batch %d has no offset log entry; no configured-key rows", target.batch_id)
            return []
        keys = self._new_keys(target.batch_id, processing_time_ms)
        if not keys:
            return []
        touched = _keys_in(target, [f for f in written if f.table_name == TENANT_STATUS.name])
        keys = [key for key in keys if key not in touched]
        if not keys:
            return []
        return write_batch_rows(
            replace(target, table_names=(TENANT_STATUS.name,)),
            status_rows(keys, processing_time_ms),
            DRIVER_TASK_PARTITION,
        )

    def _new_keys(self, batch_id: int, now_ms: int) -> list[Key]:
        current = self.snapshots.registry_at(now_ms)
        if batch_id == 0:
            return newly_configured_keys(None, current)
        previous_ms = self.checkpoint_log.batch_timestamp_ms(batch_id - 1)
        if previous_ms is None:
            # Spark keeps the offset log of many recent batches; without the previous one,
            # announcing every key again would read as a reset, so announce none.
            log.warning("batch %d: no offset log of the batch before it", batch_id)
            return []
        return newly_configured_keys(self.snapshots.registry_at(previous_ms), current)


def _keys_in(target: BatchFiles, files: list[WrittenFile]) -> set[Key]:
    """The keys in this batch's `tenant_status` files that executors wrote."""
    filesystem, base = filesystem_of(target.root, target.storage_options)
    keys: set[Key] = set()
    for file in files:
        with filesystem.open_input_file(f"{base}/{TENANT_STATUS.name}/{file.path}") as handle:
            table = pq.read_table(handle, columns=["tenant", "source"])
        keys.update(zip(table["tenant"].to_pylist(), table["source"].to_pylist(), strict=True))
    return keys
