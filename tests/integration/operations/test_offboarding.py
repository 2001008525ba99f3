"""Offboarding a tenant from a running stream, and status rows for configured, silent keys.

A real broker, a continuous query and Delta tables: `tenants offboard` (through the CLI) closes
every open window of the tenant with a final pane, marks its keys in `tenant_status`, and its
later records land in quarantine as `unknown_tenant`, while another tenant goes on as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from infra.cli.main import main
from streaming.app import StreamApp
from tests.support.pipeline_harness import Pipeline, assert_no_query_error, record
from tests.support.sample_conf import copy_conf
from tests.support.timestamps import T0_MS, epoch_ms
from tests.support.waiting import wait_until


def test_offboarding_a_tenant_from_a_running_stream(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = copy_conf(conf_dir, tmp_path)
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

        def running() -> None:
            assert_no_query_error(stream)

        wait_until(
            acme_open, 90, "acme's keys with open windows", alive=running, retry_on_assertion=True
        )
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

        quarantine = wait_until(
            acme_quarantined,
            60,
            "acme's later record in quarantine",
            alive=running,
            retry_on_assertion=True,
        )
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
        (source, epoch_ms(start) - T0_MS, pane_index, timing, count)
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
    assert {epoch_ms(w) for w in web_finals["watermark"]} == {T0_MS + 65_000}

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
