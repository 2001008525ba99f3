"""`tenant-windows dev broker`: the development broker a user starts with one command, at the
port `app.yaml` names, and stops with Ctrl-C or by its PID."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from infra.dev.local_stack import find_free_loopback_port
from tests.support.paths import ROOT

pytestmark = pytest.mark.integration

START_DEADLINE_S = 60.0
STOP_DEADLINE_S = 30.0


def _lines_of(stream: object) -> queue.Queue[str]:
    """The stream's lines as they come, from a thread: a read never blocks the test past its
    deadline."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _port_is_open(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_the_dev_broker_takes_a_record_and_stops_by_its_pid(
    stop: signal.Signals, tmp_path: Path
) -> None:
    port = find_free_loopback_port()
    app_yaml = tmp_path / "app.yaml"
    app_yaml.write_text(f"kafka:\n  bootstrap_servers: 127.0.0.1:{port}\n  topic: dev-events\n")
    broker = subprocess.Popen(
        [
            sys.executable, "-m", "infra.cli", "dev", "broker",
            "--app-config", str(app_yaml), "--data-dir", str(tmp_path / "broker"),
            "--partitions", "2",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        lines = _lines_of(broker.stdout)
        said: list[str] = []
        deadline = time.monotonic() + START_DEADLINE_S
        while not any("Stop it with" in line for line in said):
            left = deadline - time.monotonic()
            assert left > 0 and broker.poll() is None, f"not started: {''.join(said)}"
            try:
                said.append(lines.get(timeout=min(left, 1.0)))
            except queue.Empty:
                continue
        text = "".join(said)
        assert f"listening on 127.0.0.1:{port}, topic 'dev-events' (2 partitions)" in text
        # The PID it tells the user to kill is its own.
        told = re.search(r"`kill (\d+)`", text)
        assert told is not None and int(told.group(1)) == broker.pid

        producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}")
        sent = producer.send("dev-events", b'{"tenant": "acme"}', partition=1).get(timeout=30)
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}", consumer_timeout_ms=10_000)
        consumer.assign([TopicPartition("dev-events", 1)])
        consumer.seek(TopicPartition("dev-events", 1), sent.offset)
        values = [message.value for message in consumer]
        consumer.close()
        assert values == [b'{"tenant": "acme"}']

        os.kill(broker.pid, stop)
        assert broker.wait(timeout=STOP_DEADLINE_S) == 0
        assert not _port_is_open(port), "the broker still listens after its command stopped"
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait(timeout=STOP_DEADLINE_S)
