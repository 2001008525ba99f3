"""Erasing one tenant from the lake: `tenant-windows tenants purge T`.

Per table, in this order:

1. T's rows leave the current version in one commit (delta-rs `delete`, which rewrites only the
   files that hold a row of T; the rest of each file is kept).
2. Every data file under the table that the current version no longer references and that holds
   a row of T is deleted from storage: the files the delete just replaced, and older ones that
   time travel still could read (staged files compaction moved, files `optimize` rewrote).
   Other tenants' old files stay, so their time travel is untouched; a version from before the
   purge that referenced one of the deleted files fails to read (a missing file) instead of
   showing T.

What is not rewritten: the Delta logs' JSON (an `add` action names T's partition folder and
its files' min/max statistics can hold T's id) until log retention drops those commits, and
the checkpoint's copies of T's config (docs/operations.md, "Purging a tenant").
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyarrow import fs

from storage.lake.delta_lake import DeltaLake
from storage.lake.lake_filesystem import filesystem_of
from storage.lake.snapshot_reader import current_paths
from storage.lake.tables import (
    LAKE_TABLES,
    LAYOUT_PREFIX,
    REHEARSALS_DIR,
    REPROCESS_PLANS_DIR,
    STAGED,
    TableSpec,
)
from tenants.models import ID_PATTERN

log = logging.getLogger(__name__)

_TENANT_PARTITIONS = ("tenant", f"{LAYOUT_PREFIX}tenant")


@dataclass(frozen=True)
class TablePurge:
    table: str
    rows: int
    """T's rows in the current version: deleted, or that a dry run would delete."""
    files: tuple[str, ...]
    """Data files (relative to the table) removed from storage, or that would be."""


def purge_tenant(lake: DeltaLake, tenant: str, dry_run: bool) -> list[TablePurge]:
    """Erase `tenant`'s rows and the files that held them from every table of `lake`."""
    if not re.fullmatch(ID_PATTERN, tenant):
        raise ValueError(f"not a tenant id: {tenant!r}")
    purged = [_purge_table(lake, spec, tenant, dry_run) for spec in LAKE_TABLES]
    return [
        *purged,
        _purge_reprocess_plans(lake, tenant, dry_run),
        _remove_rehearsals(lake, dry_run),
    ]


def _remove_rehearsals(lake: DeltaLake, dry_run: bool) -> TablePurge:
    """Every standby's scratch lake (`REHEARSALS_DIR`), whole: a rehearsal removes its own when
    it ends, but one killed mid-way leaves rows of any tenant there until the next. Scratch holds
    nothing anyone reads; a rehearsal running now fails, and its standby stands by without."""
    filesystem, root = filesystem_of(lake.root, lake.storage_options)
    folder = f"{root}/{REHEARSALS_DIR}"
    files = [
        info.path.removeprefix(f"{folder}/")
        for info in filesystem.get_file_info(
            fs.FileSelector(folder, recursive=True, allow_not_found=True)
        )
        if info.type == fs.FileType.File
    ]
    if files and not dry_run:
        filesystem.delete_dir(folder)
    return TablePurge(REHEARSALS_DIR, 0, tuple(sorted(files)))


def _purge_reprocess_plans(lake: DeltaLake, tenant: str, dry_run: bool) -> TablePurge:
    """The tenant's `tenants reprocess` plans, of every stream: they name its files."""
    filesystem, root = filesystem_of(lake.root, lake.storage_options)
    plans_root = f"{root}/{REPROCESS_PLANS_DIR}"
    streams = filesystem.get_file_info(fs.FileSelector(plans_root, allow_not_found=True))
    folders = [
        f"{stream.path}/{tenant}" for stream in streams if stream.type == fs.FileType.Directory
    ]
    plans = [
        info.path.removeprefix(f"{plans_root}/")
        for folder in folders
        for info in filesystem.get_file_info(fs.FileSelector(folder, allow_not_found=True))
        if info.type == fs.FileType.File
    ]
    if not dry_run:
        for folder in folders:
            if filesystem.get_file_info(folder).type == fs.FileType.Directory:
                filesystem.delete_dir(folder)
    return TablePurge(REPROCESS_PLANS_DIR, 0, tuple(sorted(plans)))


def _purge_table(lake: DeltaLake, spec: TableSpec, tenant: str, dry_run: bool) -> TablePurge:
    filesystem, root = filesystem_of(lake.table_uri(spec), lake.storage_options)
    # Files written from now on (a running stream's next batches) are never candidates: only
    # what existed before the delete can be one it replaced or an old version's.
    started = time.time()
    rows = lake.read_arrow(spec, ["tenant"], ds.field("tenant") == tenant, tenant=tenant).num_rows
    holding = {
        relative
        for relative in _data_files(filesystem, root, written_before=started)
        if _holds(filesystem, f"{root}/{relative}", relative, tenant)
    }
    if dry_run:
        return TablePurge(spec.name, rows, tuple(sorted(holding)))
    if rows:
        # `tenant` matches ID_PATTERN: nothing in it can end the literal.
        lake.delete_rows(spec, f"tenant = '{tenant}'")
    still_current = holding & current_paths(lake.open(spec))
    if still_current:
        raise RuntimeError(
            f"purging {tenant} from {spec.name}: rows remain in {sorted(still_current)[:3]}"
        )
    for relative in sorted(holding):
        filesystem.delete_file(f"{root}/{relative}")
    log.info("purged %s from %s: %d rows, %d files", tenant, spec.name, rows, len(holding))
    return TablePurge(spec.name, rows, tuple(sorted(holding)))


def _data_files(filesystem: fs.FileSystem, root: str, written_before: float) -> list[str]:
    """The Parquet files under a table's folder, outside its log, relative to it."""
    selector = fs.FileSelector(root, recursive=True, allow_not_found=True)
    found = []
    for info in filesystem.get_file_info(selector):
        relative = info.path.removeprefix(f"{root}/")
        if (
            info.type == fs.FileType.File
            and relative.endswith(".parquet")
            and not relative.startswith("_delta_log/")
            and info.mtime is not None
            and info.mtime.timestamp() < written_before
        ):
            found.append(relative)
    return found


def _holds(filesystem: fs.FileSystem, path: str, relative: str, tenant: str) -> bool:
    """Whether the file has a row of `tenant`: its folder says so for a settled file, else its
    `tenant` column does."""
    for folder in relative.split("/")[:-1]:
        column, _, value = folder.partition("=")
        # `tenant=` in a lake from before the staged layout, which the file does not repeat.
        if column in _TENANT_PARTITIONS and value != STAGED:
            return value == tenant
    with filesystem.open_input_file(path) as file:
        # delta-rs rewrites strings as string_view, which `equal` does not compare with str.
        column = pq.read_table(file, columns=["tenant"])["tenant"].cast(pa.string())
    return bool(pc.any(pc.equal(column, tenant)).as_py())
