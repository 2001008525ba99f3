"""What `status` reads from the lake: the latest row of each key; where it looked."""

from __future__ import annotations

import socket
from pathlib import Path

import pyarrow as pa
import pytest

from storage.lake.delta_lake import DeltaLake
from streaming.observe.stream_status import (
    KEYS,
    LOCATIONS,
    NO_DATA_YET,
    NOT_THERE_YET,
    gather_status,
    latest_per_key,
    locations_section,
)
from tenants.settings import load_settings
from tests.support.sample_conf import SAMPLE_CONF, copy_conf


def test_latest_per_key_takes_each_keys_row_of_its_highest_batch() -> None:
    rows = pa.table(
        {
            "tenant": ["a", "a", "b", "a", "b"],
            "source": ["web", "web", "web", "billing", "web"],
            "watermark": [3, 1, 20, 100, 10],
            "max_event_time": [4, 2, 21, 101, 11],
            "open_windows": [1, 2, 3, 4, 5],
            "on_time_records": [30, 10, 200, 1, 100],
            "late_records": [0, 0, 0, 0, 0],
            "too_late_records": [0, 0, 0, 0, 0],
            "quarantined_records": [0, 0, 0, 0, 0],
            "lifecycle": ["active", "configured", "offboarded", None, "active"],
            "batch_id": [3, 1, 7, 0, 5],
        }
    )
    latest = latest_per_key(rows).to_pylist()
    assert [
        (r["tenant"], r["source"], r["batch_id"], r["watermark"], r["lifecycle"]) for r in latest
    ] == [
        ("a", "billing", 0, 100, None),
        ("a", "web", 3, 3, "active"),
        ("b", "web", 7, 20, "offboarded"),
    ]


def test_status_with_no_lake_or_checkpoint_names_where_it_looked_and_what_to_give(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status` with no flags, before any run: not delta-rs's "Local path ... does not exist",
    but the lake root and checkpoint it read, and the flags and config keys that name them."""
    copy_conf(SAMPLE_CONF, tmp_path)
    monkeypatch.chdir(tmp_path)
    settings = load_settings(
        Path("conf/app.yaml"), overrides={"kafka.bootstrap_servers": _port_nobody_listens_on()}
    )
    sections = {section.title: section for section in gather_status(settings)}

    where = sections[LOCATIONS]
    assert [(row["part"], row["path"], row["state"]) for row in where.rows] == [
        ("lake", "data/lake", NOT_THERE_YET),
        ("checkpoint", "data/checkpoints/tenant-windows", NOT_THERE_YET),
    ]
    for named in (
        "data/lake (lake.root)",
        "data/checkpoints/tenant-windows (stream.checkpoint_dir)",
        "--app-config",
        "--lake-root",
        "--checkpoint-dir",
        "TW_LAKE__ROOT",
        "TW_STREAM__CHECKPOINT_DIR",
    ):
        assert named in (where.note or ""), where.note
    keys = sections[KEYS]
    assert "could not be read" not in (keys.note or "") and "Os {" not in (keys.note or "")
    assert {row["watermark"] for row in keys.rows} == {NO_DATA_YET}
    assert len(keys.rows) == 6, "the sample config's three tenants times two sources"


def test_status_says_only_what_is_missing(tmp_path: Path) -> None:
    lake_root = tmp_path / "lake"
    lake_root.mkdir()
    settings = load_settings(
        SAMPLE_CONF / "app.yaml",
        overrides={
            "conf_dir": str(SAMPLE_CONF),
            "lake.root": str(lake_root),
            "stream.checkpoint_dir": str(tmp_path / "checkpoint"),
        },
    )
    where = locations_section(settings, DeltaLake.from_settings(settings.lake))
    states = {row["part"]: row["state"] for row in where.rows}
    assert states == {"lake": "no tenant_status table (yet)", "checkpoint": NOT_THERE_YET}
    assert "--checkpoint-dir" in (where.note or "") and "--lake-root" not in (where.note or "")


def _port_nobody_listens_on() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"
