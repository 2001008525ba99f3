"""The Kafka client settings and checks shared by the driver, executors and `status`."""

from __future__ import annotations

import socket
import time

import pytest

from streaming.kafka.client import KafkaUnavailableError, require_a_reachable_broker


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_broker_that_refuses_connections_is_named_at_once() -> None:
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError) as refused:
        require_a_reachable_broker(f"127.0.0.1:{port}", timeout_s=5)
    assert str(refused.value) == f"broker 127.0.0.1:{port} unreachable (connection refused)"
    assert time.monotonic() - started < 1


def test_one_listening_bootstrap_server_is_enough() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        require_a_reachable_broker(f"127.0.0.1:{_closed_port()}, 127.0.0.1:{port}", 1)


def test_every_unreachable_server_is_named() -> None:
    first, second = _closed_port(), _closed_port()
    with pytest.raises(KafkaUnavailableError) as refused:
        require_a_reachable_broker(f"127.0.0.1:{first},127.0.0.1:{second},no-port", 1)
    message = str(refused.value)
    assert f"broker 127.0.0.1:{first} unreachable" in message
    assert f"broker 127.0.0.1:{second} unreachable" in message
    assert "broker no-port unreachable (not HOST:PORT)" in message
