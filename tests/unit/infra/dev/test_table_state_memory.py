"""The table-state benchmark builds the table it says: settled files, a tenant each, whose `add`
actions carry the product's statistics, every column's, or a row count only."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from infra.dev.benchmarks.table_state_memory import build
from storage.lake.tables import EVENTS


@pytest.mark.parametrize(
    ("kind", "columns"),
    [
        ("product", {"tenant", "source", "batch_id"}),
        ("every_column", {"tenant", "source", "batch_id", "event_time", "offset"}),
        ("none", set()),
    ],
)
def test_each_file_is_a_tenants_settled_partition_with_the_stats_asked_for(
    tmp_path: Path, kind: str, columns: set[str]
) -> None:
    build(tmp_path / kind, 120, kind)

    actions = pa.table(DeltaTable(str(tmp_path / kind)).get_add_actions(flatten=True))
    assert actions.num_rows == 120
    tenants = set(actions[f"partition.{EVENTS.partition_by[0]}"].to_pylist())
    assert len(tenants) == 120 and "_staged" not in tenants
    # A column without stats reads back as nulls, if at all.
    held = {
        name.removeprefix("min.")
        for name in actions.column_names
        if name.startswith("min.") and actions[name].null_count == 0
    }
    assert columns <= held if kind == "every_column" else held == columns, held
    assert actions["num_records"].to_pylist() == [1] * 120
