"""The driver's status rows for keys a config names before they send anything."""

from __future__ import annotations

from pathlib import Path

from storage.lake.tables import TENANT_STATUS, rows_for_table
from streaming.state.configured_status import newly_configured_keys, status_rows
from tenants.conf_reader import load_registry
from tests.support.sample_conf import copy_conf
from tests.support.timestamps import T0_MS, epoch_ms


def test_keys_new_in_a_config_get_one_configured_row_each(conf_dir: Path, tmp_path: Path) -> None:
    conf = copy_conf(conf_dir, tmp_path)
    before = load_registry(conf)
    (conf / "tenants" / "newco.yaml").write_text("id: newco\nsources: [web, billing]\n")
    after = load_registry(conf)

    assert newly_configured_keys(before, before) == []
    assert newly_configured_keys(before, after) == [("newco", "billing"), ("newco", "web")]
    assert len(newly_configured_keys(None, after)) == 8  # batch 0: every configured key

    union = status_rows(newly_configured_keys(before, after), T0_MS)
    rows = rows_for_table(union, TENANT_STATUS, batch_id=7).to_pylist()
    assert [(row["tenant"], row["source"], row["lifecycle"]) for row in rows] == [
        ("newco", "billing", "configured"),
        ("newco", "web", "configured"),
    ]
    assert {row["watermark"] for row in rows} == {None}
    assert {row["on_time_records"] for row in rows} == {0}
    assert {epoch_ms(row["processing_time"]) for row in rows} == {T0_MS}
    assert {row["batch_id"] for row in rows} == {7}
