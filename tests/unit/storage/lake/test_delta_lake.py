"""The lake's tables as a release finds them: created when missing, columns added to old ones."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import TENANT_STATUS


def test_a_tenant_status_table_from_before_lifecycle_gets_the_column(tmp_path: Path) -> None:
    lake = DeltaLake(str(tmp_path / "lake"))
    old_schema = pa.schema([f for f in TENANT_STATUS.schema if f.name != "lifecycle"])
    old_row = {name: None for name in old_schema.names} | {"tenant": "acme", "source": "web"}
    write_deltalake(lake.table_uri(TENANT_STATUS), pa.Table.from_pylist([old_row], old_schema))

    lake.ensure_tables()
    lake.ensure_tables()  # a second start changes nothing more

    table = lake.open(TENANT_STATUS)
    assert table.schema().to_arrow().names == TENANT_STATUS.schema.names
    assert table.version() == 1
    assert table.to_pyarrow_table().to_pylist()[0]["lifecycle"] is None
