"""The views' tables opened without Spark, with the errors Spark's views give."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import ALL_TABLES, LAKE_TABLES
from storage.query.view_catalog import (
    LakeNotWrittenError,
    TableVersionError,
    open_view_tables,
    unwritten_local_lake,
)


@pytest.fixture
def lake(tmp_path: Path) -> DeltaLake:
    lake = DeltaLake(str(tmp_path / "lake"))
    lake.ensure_tables()
    return lake


def test_a_local_root_without_tables_is_found_without_delta_rs(tmp_path: Path) -> None:
    for root in (str(tmp_path / "nowhere"), f"file://{tmp_path}/"):
        error = unwritten_local_lake(root, ALL_TABLES)
        assert error is not None
        bare = root.rstrip("/")
        assert str(error) == (
            f"no table events at {bare}/events: no stream has written to the lake {bare} yet "
            "(check lake.root, TW_LAKE__ROOT or --lake-root)"
        )
    assert unwritten_local_lake("s3://bucket/lake", ALL_TABLES) is None  # delta-rs says


def test_every_table_opens_at_the_version_asked_for(lake: DeltaLake) -> None:
    assert unwritten_local_lake(lake.root, LAKE_TABLES) is None
    tables = open_view_tables(lake, LAKE_TABLES, {"events": 0})
    assert list(tables) == [spec.name for spec in LAKE_TABLES]
    assert all(table is not None and table.version() == 0 for table in tables.values())
    with pytest.raises(TableVersionError, match=r"^events has versions 0 to 0, not 3 "):
        open_view_tables(lake, ALL_TABLES, {"events": 3})


def test_a_missing_table_is_the_first_error_and_deliveries_may_be_missing(
    lake: DeltaLake,
) -> None:
    shutil.rmtree(Path(lake.root) / "deliveries")
    assert open_view_tables(lake, LAKE_TABLES)["deliveries"] is None
    shutil.rmtree(Path(lake.root) / "windows")
    with pytest.raises(LakeNotWrittenError, match=r"^no table windows at "):
        open_view_tables(lake, ALL_TABLES, {"windows": 9})
    # In the views' order, as Spark meets them: events' version before the missing windows.
    with pytest.raises(TableVersionError, match=r"^events has versions"):
        open_view_tables(lake, ALL_TABLES, {"events": 9})
