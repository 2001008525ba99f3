"""Offboarding a tenant from a running stream, and status rows for configured, silent keys.

A real broker, a continuous query and Delta tables: `tenants offboard` (through the CLI) closes
every open window of the tenant with a final pane, marks its keys in `tenant_status`, and its
later records land in quarantine as `unknown_tenant`, while another tenant goes on as before.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from infra.cli.main import main
from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import TENANT_STATUS, rows_for_table
from streaming.app import StreamApp
from streaming.state.configured_status import newly_configured_keys, status_rows
from tenants.config_store import registry_from_snapshot, snapshot_bytes
from tenants.registry import load_registry
from tests.harness import Pipeline, record

T0_MS = 1_767_225_600_000
T = TypeVar("T")


def _wait_for(what: str, check: Callable[[], T | None], stream: StreamApp, timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    problem = "never checked"
    while time.monotonic() < deadline:
        assert stream.query.exception() is None, stream.query.exception()
        try:
            result = check()
        except AssertionError as failed:
            result, problem = None, str(failed)
        if result is not None:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}: {problem}")


def _ms(value: Any) -> int:
    return int(pd.Timestamp(value).value // 1_000_000)


def test_offboarding_a_tenant_from_a_running_stream(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir, conf)
    (conf / "tenants" / "silent.yaml").write_text("id: silent\nsources: [web]\n")
    pipeline = Pipeline.create(
        kafka,
        tmp_path,
        conf,
        trigger_interval="500ms",
        environ={"TW_STREAM__CONFIG_RECHECK_INTERVAL": "1s"},
    )
    # acme: web [0:00,1:00) gets ON_TIME and LATE panes and stays open (lateness 1m), [1:00,
    # 2:00) stays open; billing [0:00,5:00) stays open. globex: one open web window.
    pipeline.produce(
        [
            record("acme", "web", T0_MS + 5_000),
            record("acme", "web", T0_MS + 75_000),
            record("acme", "web", T0_MS + 20_000),
            record("acme", "billing", T0_MS + 10_000, amount=3),
            record("globex", "web", T0_MS + 7_000),
        ]
    )
    stream = StreamApp(pipeline.settings, pipeline.lake).start(spark, False)
    try:

        def acme_open() -> pd.DataFrame | None:
            status = pipeline.table("tenant_status")
            acme = status[(status["tenant"] == "acme") & (status["lifecycle"] == "active")]
            assert set(acme["source"]) == {"web", "billing"}, acme
            return acme

        _wait_for("acme's keys with open windows", acme_open, stream, 90)
        exit_code = main(
            [
                "tenants", "offboard", "acme",
                "--conf", str(conf),
                "--lake-root", pipeline.settings.lake.root,
                "--wait", "--timeout", "90s",
            ]
        )  # fmt: skip
        said = capsys.readouterr().out
        assert exit_code == 0, said
        assert "every key of 'acme' is closed" in said
        assert not (conf / "tenants" / "acme.yaml").exists()
        assert [path.name.split(".")[0] for path in (conf / "offboarded").iterdir()] == ["acme"]

        pipeline.produce(
            [record("acme", "web", T0_MS + 80_000), record("globex", "web", T0_MS + 9_000)]
        )

        def acme_quarantined() -> pd.DataFrame | None:
            quarantine = pipeline.table("quarantine")
            assert (quarantine["tenant"] == "acme").any(), "acme's later record not there yet"
            events = pipeline.table("events")
            assert (events["tenant"] == "globex").sum() == 2, "globex's second record not yet"
            return quarantine

        quarantine = _wait_for("acme's later record in quarantine", acme_quarantined, stream, 60)
    finally:
        stream.stop()

    windows, events, status = (pipeline.table(n) for n in ("windows", "events", "tenant_status"))
    acme_windows = windows[windows["tenant"] == "acme"]
    finals = acme_windows[acme_windows["is_final"]].sort_values(["source", "window_start"])
    # Every window acme had records in got exactly one final pane.
    acme_events = events[events["tenant"] == "acme"]
    opened = set(zip(acme_events["source"], acme_events["window_id"], strict=True))
    assert sorted(zip(finals["source"], finals["window_id"], strict=True)) == sorted(opened)
    assert [
        (source, _ms(start) - T0_MS, pane_index, timing, count)
        for source, start, pane_index, timing, count in zip(
            finals["source"],
            finals["window_start"],
            finals["pane_index"],
            finals["timing"],
            finals["count"],
            strict=True,
        )
    ] == [
        ("billing", 0, 0, "ON_TIME", 1),
        ("web", 0, 2, "LATE", 2),  # after its ON_TIME pane 0 and LATE pane 1
        ("web", 60_000, 0, "ON_TIME", 1),
    ]
    # Closed by offboarding, not by event time: W stayed where acme's records left it.
    web_finals = finals[finals["source"] == "web"]
    assert {_ms(w) for w in web_finals["watermark"]} == {T0_MS + 65_000}

    acme_status = status[status["tenant"] == "acme"].sort_values("batch_id")
    offboarded = acme_status[acme_status["lifecycle"] == "offboarded"]
    assert sorted(offboarded["source"]) == ["billing", "web"]
    assert (offboarded["open_windows"] == 0).all()
    for source, rows in acme_status.groupby("source"):
        assert rows.iloc[-1]["lifecycle"] == "offboarded", f"{source}: the key's last row"

    acme_later = quarantine[quarantine["tenant"] == "acme"]
    assert list(acme_later["reason"]) == ["unknown_tenant"]
    assert json.loads(acme_later["value"].iloc[0])["ts"].startswith("2026-01-01T00:01:20")

    # globex went on as before: both records on time in its one open window, no final pane.
    globex_events = events[events["tenant"] == "globex"]
    assert list(globex_events["timing"]) == ["ON_TIME", "ON_TIME"]
    assert not windows[windows["tenant"] == "globex"]["is_final"].any()
    assert set(status[status["tenant"] == "globex"]["lifecycle"].dropna()) <= {
        "configured",
        "active",
    }

    # A configured tenant that never sent anything has its row: no watermark, zero counters.
    silent = status[status["tenant"] == "silent"]
    assert list(zip(silent["source"], silent["lifecycle"], strict=True)) == [("web", "configured")]
    assert silent["watermark"].isna().all()
    assert (silent[["on_time_records", "late_records", "too_late_records"]] == 0).all().all()


# --- the CLI action and the driver's status rows, without a stream ---------------------------


def test_offboard_refuses_an_unknown_tenant_and_moves_nothing(
    conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir, conf)
    before = sorted(path.name for path in (conf / "tenants").iterdir())

    assert main(["tenants", "offboard", "nobody", "--conf", str(conf)]) == 2

    assert "no tenant 'nobody' is configured" in capsys.readouterr().err
    assert sorted(path.name for path in (conf / "tenants").iterdir()) == before
    assert not (conf / "offboarded").exists()


def test_offboard_refuses_while_the_config_is_invalid(
    conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir, conf)
    (conf / "tenants" / "broken.yaml").write_text("id: broken\nsources: [nowhere]\n")

    assert main(["tenants", "offboard", "acme", "--conf", str(conf)]) == 2

    assert "broken.yaml: sources.nowhere: unknown source" in capsys.readouterr().err
    assert (conf / "tenants" / "acme.yaml").exists()


def test_offboard_keeps_a_copy_the_registry_ignores_and_a_tenant_can_come_back(
    conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir, conf)

    assert main(["tenants", "offboard", "globex", "--conf", str(conf)]) == 0

    assert "move the file back" in capsys.readouterr().out
    assert set(load_registry(conf).tenants) == {"acme", "initech"}
    (copy,) = (conf / "offboarded").iterdir()
    copy.rename(conf / "tenants" / "globex.yaml")
    assert set(load_registry(conf).tenants) == {"acme", "globex", "initech"}


def test_keys_new_in_a_config_get_one_configured_row_each(conf_dir: Path, tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir, conf)
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
    assert {_ms(row["processing_time"]) for row in rows} == {T0_MS}
    assert {row["batch_id"] for row in rows} == {7}


def test_a_snapshot_answers_which_keys_are_configured_as_resolve_does(conf_dir: Path) -> None:
    registry = load_registry(conf_dir)
    snapshot = registry_from_snapshot(snapshot_bytes(registry), "test")
    candidates = [
        (tenant, source)
        for tenant in ("acme", "globex", "nobody")
        for source in ("web", "billing", "mobile")
    ]
    for loaded in (registry, snapshot):
        assert [loaded.configures(*key) for key in candidates] == [
            registry.resolve(*key) is not None for key in candidates
        ]
    assert sorted(snapshot.configured_keys()) == sorted(registry.configured_keys())
    assert len(list(snapshot.configured_keys())) == 6


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
