"""The console commands a user runs: `produce` into a topic, `run` as a continuous stream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from infra.cli.main import main
from tests.support.paths import ROOT
from tests.support.pipeline_harness import Pipeline
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def test_produce_writes_the_requested_records(
    kafka: Any, conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = Pipeline.create(kafka, tmp_path, conf_dir, partitions=2)
    code = main(
        [
            "produce",
            "--bootstrap-servers", kafka.bootstrap_servers,
            "--topic", pipeline.topic,
            "--tenants", "acme,globex",
            "--count", "500",
            "--ahead", "acme=1h",
            "--malformed-share", "0.1",
        ]
    )  # fmt: skip
    assert code == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["produced"] == 500
    assert len(pipeline.produced_coordinates()) == 500


def test_run_is_a_continuous_stream_that_stops_cleanly_on_sigterm(
    kafka: Any, conf_dir: Path, tmp_path: Path
) -> None:
    pipeline = Pipeline.create(kafka, tmp_path, conf_dir)
    pipeline.produce([{"tenant": "acme", "source": "web", "ts": "2026-01-01T00:00:00Z"}])
    command = [
        sys.executable, "-m", "infra.cli", "run",
        "--bootstrap-servers", kafka.bootstrap_servers,
        "--topic", pipeline.topic,
        "--lake-root", str(tmp_path / "lake"),
        "--checkpoint-dir", str(tmp_path / "checkpoint"),
        "--trigger-interval", "1s",
    ]  # fmt: skip
    log_path = tmp_path / "run.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()
        )
    try:
        assert _wait_for_events(tmp_path / "lake" / "events", 1, process, log_path)
        # Records produced while it runs are picked up without a restart.
        pipeline.produce(
            [
                {"tenant": "acme", "source": "web", "ts": f"2026-01-01T00:0{i}:00Z"}
                for i in range(1, 4)
            ]
        )
        assert _wait_for_events(tmp_path / "lake" / "events", 4, process, log_path)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert code == 0, log_path.read_text()[-3000:]


def _wait_for_events(
    table: Path, count: int, process: subprocess.Popen[bytes], log_path: Path
) -> bool:
    def running() -> None:
        if process.poll() is not None:
            pytest.fail(f"the stream exited early:\n{log_path.read_text()[-3000:]}")

    return wait_until(
        lambda: (
            (table / "_delta_log").exists() and len(DeltaTable(str(table)).to_pandas()) >= count
        ),
        120,
        f"{count} events",
        alive=running,
    )
