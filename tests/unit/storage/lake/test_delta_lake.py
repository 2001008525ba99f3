"""The lake's tables as a release finds them: created when missing, columns added to old ones."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, unquote

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from storage.lake.delta_lake import DeltaLake
from storage.lake.delta_log import log_path
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


@pytest.mark.parametrize(
    "path",
    [
        "layout_tenant=t000042/layout_source=web/layout_date=2026-11-30/settled-s-e1-c0-t00000-ab.parquet",
        "layout_tenant=a%20b/part.parquet",
        "layout_tenant=\u00e9t\u00e9/part.parquet",
        "layout_tenant=a b/part~1.parquet",
        "layout_tenant=100%/x#y?z.parquet",
    ],
)
def test_a_files_path_in_the_log_is_percent_encoded_as_delta_readers_decode_it(path: str) -> None:
    # Folders' `/` and Hive's `=` (and `:`) stay as they are; everything else is encoded, the
    # way delta-rs and Spark decode it (the common case skips the encoder and must agree).
    assert log_path(path) == quote(path, safe="/=:")
    assert unquote(log_path(path)) == path
