"""The Kafka client settings and checks shared by the driver, executors, `status` and the
start of `run`."""

from __future__ import annotations

import socket
import time

import pytest

from streaming.kafka.client import (
    PLAINTEXT,
    KafkaSecurity,
    KafkaUnavailableError,
    KafkaUnreachableError,
    require_a_reachable_broker,
    require_an_answering_broker,
)
from tests.support.stalling_proxy import StallProxy


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


def test_the_start_check_names_a_refusing_broker_at_once() -> None:
    server = f"127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    with pytest.raises(KafkaUnreachableError) as refused:
        require_an_answering_broker(server, PLAINTEXT, timeout_s=30)
    assert str(refused.value) == f"Kafka at {server} is unreachable: connection refused"
    assert time.monotonic() - started < 1


def test_the_start_check_names_each_refusing_server() -> None:
    first, second = f"127.0.0.1:{_closed_port()}", f"127.0.0.1:{_closed_port()}"
    with pytest.raises(KafkaUnreachableError) as refused:
        require_an_answering_broker(f"{first},{second},no-port", PLAINTEXT, timeout_s=30)
    assert str(refused.value) == (
        f"Kafka at {first},{second},no-port is unreachable: {first}: connection refused; "
        f"{second}: connection refused; no-port: not HOST:PORT"
    )


@pytest.mark.parametrize(
    "security",
    [PLAINTEXT, KafkaSecurity(protocol="SSL")],
    ids=lambda security: security.protocol,
)
def test_the_start_check_waits_out_the_timeout_for_a_silent_broker(
    security: KafkaSecurity,
) -> None:
    """Over TLS too: a handshake that never completes is silence, not a security failure."""
    timeout_s = 1.5
    with StallProxy(None, lifetime_s=30) as silent:
        started = time.monotonic()
        with pytest.raises(KafkaUnreachableError) as unanswered:
            require_an_answering_broker(silent.address, security, timeout_s)
        waited_s = time.monotonic() - started
    assert str(unanswered.value) == (
        f"Kafka at {silent.address} is unreachable: it accepts connections but did not answer "
        f"within {timeout_s:g} s (kafka.broker_timeout)"
    )
    assert timeout_s <= waited_s < timeout_s + 2
