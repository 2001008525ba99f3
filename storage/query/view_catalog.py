"""What the SQL views read, without Spark: their names, and the lake's tables at the versions a
statement reads, or the one-line error that says why the lake cannot give them.

Spark's views (`spark_views`) and the in-process engine (`local_sql`) read the same tables; this
module is what they share that needs no JVM, so `tenant-windows sql` can check the lake, and
answer small statements, before (or without) starting Spark.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from storage.lake.tables import ALL_TABLES, DELIVERIES, LAKE_TABLES, TableSpec

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from storage.lake.delta_lake import DeltaLake

WINDOW_CONTENTS = "window_contents"
TENANT_VIEW_NAMES = (*(spec.name for spec in ALL_TABLES), WINDOW_CONTENTS)
OPERATOR_VIEW_NAMES = (*(spec.name for spec in LAKE_TABLES), WINDOW_CONTENTS)
"""Without `--tenant`, `deliveries` too."""
WINDOW_CONTENTS_COLUMNS = (
    *("tenant", "source", "window_id", "window_start", "window_end", "window_date"),
    *("pane_index", "pane_timing", "is_final", "pane_count", "record_window_id"),
    *("record_pane_index", "record_timing", "event_time", "event_id", "topic", "partition"),
    *("offset", "payload", "record_batch_id"),
)
"""`window_contents`' columns, in order (`spark_views.window_contents`)."""


def view_columns(specs: tuple[TableSpec, ...]) -> dict[str, tuple[str, ...]]:
    """Each view's columns, by name: the tables of `specs`, and `window_contents`."""
    return {
        **{spec.name: tuple(spec.schema.names) for spec in specs},
        WINDOW_CONTENTS: WINDOW_CONTENTS_COLUMNS,
    }


class TableVersionError(ValueError):
    """A requested table version that the table does not have."""


class LakeNotWrittenError(ValueError):
    """The lake has no output table: no stream has written there (or the root is wrong)."""


def lake_not_written(root: str, spec: TableSpec) -> LakeNotWrittenError:
    root = root.rstrip("/")  # as `DeltaLake` keeps it
    return LakeNotWrittenError(
        f"no table {spec.name} at {root}/{spec.name}: no stream has written to "
        f"the lake {root} yet (check lake.root, TW_LAKE__ROOT or --lake-root)"
    )


def unwritten_local_lake(root: str, specs: tuple[TableSpec, ...]) -> LakeNotWrittenError | None:
    """The error `open_view_tables` raises, found without loading delta-rs, where it is
    certain: a local lake whose first table has no Delta log folder at all. (`DeltaLake` has
    the same test of a local root, but importing it loads delta-rs.)"""
    if "://" in root and not root.startswith("file://"):
        return None
    first = specs[0]
    log = Path(root.removeprefix("file://")) / first.name / "_delta_log"
    return None if log.is_dir() else lake_not_written(root, first)


def check_version(spec: TableSpec, latest: int, version: int) -> None:
    if not 0 <= version <= latest:
        raise TableVersionError(
            f"{spec.name} has versions 0 to {latest}, not {version} "
            "(each table counts its own versions: see docs/querying.md)"
        )


def open_view_tables(
    lake: DeltaLake, specs: tuple[TableSpec, ...], versions: Mapping[str, int] | None = None
) -> dict[str, DeltaTable | None]:
    """Each table of `specs` loaded at the version the views read (`versions`, else its
    newest), checked in the views' order so the first error is the one Spark's views raise.
    None: `deliveries` of a lake last written before notifications (an empty view)."""
    from deltalake.exceptions import TableNotFoundError

    tables: dict[str, DeltaTable | None] = {}
    for spec in specs:
        try:
            table = lake.open(spec)
        except TableNotFoundError:
            if spec is not DELIVERIES:
                raise lake_not_written(lake.root, spec) from None
            tables[spec.name] = None
            continue
        version = (versions or {}).get(spec.name)
        if version is not None:
            check_version(spec, table.version(), version)
            table.load_as_version(version)
        tables[spec.name] = table
    return tables
