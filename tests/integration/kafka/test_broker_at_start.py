"""`tenant-windows run` against a broker it cannot use, as a process: a refused connection
stops it within seconds, a silent broker after `kafka.broker_timeout`, each with exit 2 and one
line on stderr, before the lake or the checkpoint exists; `--verbose` adds the traceback. A
broker that goes away mid-run ends the stream with one line too, not Python and Java frames.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.dev.local_stack import LocalKafka, find_free_loopback_port
from streaming.kafka.client import KafkaSecurity, require_an_answering_broker
from tenants.settings import load_settings
from tests.support.fault_hooks import cli_command
from tests.support.paths import ROOT
from tests.support.pipeline_harness import Pipeline
from tests.support.secured_kafka import (
    namespace_unavailable_reason,
    secured_kafka,
    security_environ,
)
from tests.support.stalling_proxy import StallProxy
from tests.support.stream_process import start_process, wait_for_commit_log, wait_or_kill

pytestmark = pytest.mark.integration

# Far below what a run that starts Spark first takes: that one would be killed at this bound.
PROCESS_BOUND_S = 60.0
REFUSED_WITHIN_S = 5.0
SILENT_TIMEOUT_S = 3


@dataclass(frozen=True)
class Finished:
    exit_code: int
    stderr: str
    seconds: float


def _run(tmp_path: Path, bootstrap_servers: str, *flags: str) -> Finished:
    """`tenant-windows [flags] run` at `bootstrap_servers`, lake and checkpoint in `tmp_path`,
    settings from `tmp_path / app.yaml` (defaults if absent)."""
    global_flags = [flag for flag in flags if flag == "--verbose"]
    command = cli_command(
        [
            *global_flags,
            "run",
            "--app-config", str(tmp_path / "app.yaml"),
            "--bootstrap-servers", bootstrap_servers,
            "--lake-root", str(tmp_path / "lake"),
            "--checkpoint-dir", str(tmp_path / "checkpoint"),
        ]
    )  # fmt: skip
    # The test's own settings only: no TW_* variable of the caller's shell.
    environ = {name: value for name, value in os.environ.items() if not name.startswith("TW_")}
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group: a bound kills Spark's JVM with it
    )
    try:
        _, stderr = process.communicate(timeout=PROCESS_BOUND_S)
    except subprocess.TimeoutExpired:
        wait_or_kill(process, 0)
        raise
    return Finished(process.returncode, stderr.decode(), time.monotonic() - started)


def _assert_nothing_created(tmp_path: Path) -> None:
    assert not (tmp_path / "lake").exists(), "the lake was created"
    assert not (tmp_path / "checkpoint").exists(), "the checkpoint was created"


def test_a_refused_connection_stops_run_at_once_in_one_line(tmp_path: Path) -> None:
    server = f"127.0.0.1:{find_free_loopback_port()}"
    finished = _run(tmp_path, server)

    assert finished.exit_code == 2, finished.stderr
    assert finished.seconds < REFUSED_WITHIN_S, finished
    [line] = finished.stderr.splitlines()
    assert server in line and "refused" in line, line
    _assert_nothing_created(tmp_path)


def test_a_silent_broker_stops_run_after_the_broker_timeout_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text(f"kafka:\n  broker_timeout: {SILENT_TIMEOUT_S}s\n")
    with StallProxy(None, lifetime_s=PROCESS_BOUND_S) as silent:
        finished = _run(tmp_path, silent.address)
        assert silent.accepted >= 1, "the check never dialled the broker"

    assert finished.exit_code == 2, finished.stderr
    # Not before the timeout (it waits for the broker), and not much after it.
    assert SILENT_TIMEOUT_S <= finished.seconds < SILENT_TIMEOUT_S + 10, finished
    [line] = finished.stderr.splitlines()
    assert silent.address in line and "did not answer" in line, line
    assert "kafka.broker_timeout" in line, line
    _assert_nothing_created(tmp_path)


def test_verbose_prints_the_traceback_above_the_line(tmp_path: Path) -> None:
    server = f"127.0.0.1:{find_free_loopback_port()}"
    finished = _run(tmp_path, server, "--verbose")

    assert finished.exit_code == 2, finished.stderr
    lines = finished.stderr.splitlines()
    assert "Traceback (most recent call last):" in lines, finished.stderr
    assert any(line.startswith("streaming.kafka.client.KafkaUnreachableError") for line in lines)
    assert server in lines[-1] and "refused" in lines[-1], lines[-1]
    _assert_nothing_created(tmp_path)


def test_the_start_check_lets_a_broker_over_tls_and_sasl_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the settings' own security, as `run` resolves it: the check asks what the stream
    will ask, so it passes what the stream can use."""
    if (reason := namespace_unavailable_reason()) is not None:
        pytest.skip(reason)
    with secured_kafka(tmp_path / "broker", "sasl_ssl", "SCRAM-SHA-256") as broker:
        for name, value in security_environ(broker).items():
            monkeypatch.setenv(name, value)
        kafka = load_settings(None).kafka
        started = time.monotonic()
        require_an_answering_broker(broker.bootstrap_servers, KafkaSecurity.of(kafka), 30)
        assert time.monotonic() - started < 10


def test_a_broker_lost_mid_run_ends_the_stream_in_one_line(conf_dir: Path, tmp_path: Path) -> None:
    """A broker of its own: stopping the shared one would fail every other test's stream."""
    with LocalKafka(tmp_path / "kafka") as broker:
        pipeline = Pipeline.create(
            broker,
            tmp_path,
            conf_dir,
            trigger_interval="1s",
            environ={"TW_KAFKA__BROKER_TIMEOUT": "4s"},
        )
        pipeline.produce([{"tenant": "acme", "source": "web", "ts": "2026-01-01T00:00:00Z"}])
        log_path = tmp_path / "run.log"
        with log_path.open("wb") as log:
            process = start_process(pipeline, log, available_now=False)
            try:
                wait_for_commit_log(pipeline, 0, process, deadline_s=180)
                broker.stop()
                exit_code = wait_or_kill(process, 90)
            finally:
                wait_or_kill(process, 30)
    output = log_path.read_text()

    assert exit_code == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "\tat org.apache" not in output, output[-3000:]
    assert "Logical Plan" not in output, output[-3000:]
    [failed] = [line for line in output.splitlines() if "the stream failed" in line]
    assert "KafkaUnavailableError: " in failed and broker.bootstrap_servers in failed, failed
