"""The secured broker of tests/support/secured_kafka.py, driven by kafka-python and librdkafka
clients configured by hand, as a user would: the right settings get through, the wrong ones fail
fast.

Each mode's broker is started once for the module (about half a second each). Client configs
here are written out rather than taken from SecuredKafka's helpers, so that the helpers'
correctness is not what makes these tests pass.
"""

from __future__ import annotations

import logging
import secrets
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any

import confluent_kafka
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaTimeoutError

from tests.support.secured_kafka import (
    SaslMechanism,
    SecuredKafka,
    SecurityMode,
    network_namespace,
    secured_kafka,
)

pytestmark = pytest.mark.integration

_CLIENT_TIMEOUT_MS = 10_000
# How long a client with wrong settings may try before it gives up: the point is that it ends.
_FAILING_BOOTSTRAP_MS = 3_000
_FAILURE_BOUND_S = 8.0
_POLL_DEADLINE_S = 10.0


def _broker(tmp_path_factory: pytest.TempPathFactory, mode: SecurityMode) -> Iterator[SecuredKafka]:
    with secured_kafka(tmp_path_factory.mktemp(f"kafka-{mode}"), mode=mode) as broker:
        yield broker


@pytest.fixture(scope="module")
def ssl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    yield from _broker(tmp_path_factory, "ssl")


@pytest.fixture(scope="module")
def mtls_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    yield from _broker(tmp_path_factory, "mtls")


@pytest.fixture(scope="module")
def sasl_ssl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    yield from _broker(tmp_path_factory, "sasl_ssl")


@pytest.fixture(scope="module")
def sasl_plaintext_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    yield from _broker(tmp_path_factory, "sasl_plaintext")


def _new_topic() -> str:
    return f"secured-{secrets.token_hex(4)}"


# --- kafka-python -------------------------------------------------------------------------------


def _kafka_python_round_trip(config: dict[str, Any]) -> None:
    """Create a topic, produce a record and read it back, all with `config`."""
    topic = _new_topic()
    admin = KafkaAdminClient(**config, request_timeout_ms=_CLIENT_TIMEOUT_MS)
    try:
        admin.create_topics(
            {topic: {"num_partitions": 1, "replication_factor": 1}},
            timeout_ms=_CLIENT_TIMEOUT_MS,
            wait_for_metadata=True,
        )
    finally:
        admin.close()
    producer = KafkaProducer(**config, request_timeout_ms=_CLIENT_TIMEOUT_MS)
    try:
        producer.send(topic, key=b"tenant-1", value=b"secured").get(timeout=10)
    finally:
        producer.close(timeout=5)
    consumer = KafkaConsumer(**config, request_timeout_ms=_CLIENT_TIMEOUT_MS)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        values: list[bytes] = []
        deadline = time.monotonic() + _POLL_DEADLINE_S
        while not values and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(record.value for record in records)
    finally:
        consumer.close()
    assert values == [b"secured"]


def _assert_kafka_python_fails_fast(config: dict[str, Any]) -> None:
    """A producer with `config` gives up within the bound instead of hanging."""
    started = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaProducer(**config, bootstrap_timeout_ms=_FAILING_BOOTSTRAP_MS)
    assert time.monotonic() - started < _FAILURE_BOUND_S


def test_kafka_python_ssl_produces_and_consumes(ssl_kafka: SecuredKafka) -> None:
    _kafka_python_round_trip(
        {
            "bootstrap_servers": ssl_kafka.bootstrap_servers,
            "security_protocol": "SSL",
            "ssl_cafile": str(ssl_kafka.ca_file),
        }
    )


def test_plaintext_client_cannot_use_the_tls_port(ssl_kafka: SecuredKafka) -> None:
    _assert_kafka_python_fails_fast({"bootstrap_servers": ssl_kafka.bootstrap_servers})


def _sasl_ssl_config(broker: SecuredKafka, mechanism: str, password: str | None) -> dict[str, Any]:
    return {
        "bootstrap_servers": broker.bootstrap_servers,
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(broker.ca_file),
        "sasl_mechanism": mechanism,
        "sasl_plain_username": broker.username,
        "sasl_plain_password": password,
    }


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_sasl_ssl_with_the_right_password(
    sasl_ssl_kafka: SecuredKafka, mechanism: str
) -> None:
    _kafka_python_round_trip(_sasl_ssl_config(sasl_ssl_kafka, mechanism, sasl_ssl_kafka.password))


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_kafka_python_sasl_ssl_with_a_wrong_password_fails_authentication(
    sasl_ssl_kafka: SecuredKafka, mechanism: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kafka")
    # So that a failure shows the terminator's side of each connection too.
    caplog.set_level(logging.DEBUG, logger="tests.support.tls_sasl_terminator")
    _assert_kafka_python_fails_fast(_sasl_ssl_config(sasl_ssl_kafka, mechanism, "not-the-password"))
    # kafka-python reports why only in its log: the bootstrap error says it timed out.
    assert "SaslAuthenticationFailedError" in caplog.text
    assert "Invalid username or password" in caplog.text


def test_kafka_python_sasl_plaintext(sasl_plaintext_kafka: SecuredKafka) -> None:
    _kafka_python_round_trip(
        {
            "bootstrap_servers": sasl_plaintext_kafka.bootstrap_servers,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": sasl_plaintext_kafka.username,
            "sasl_plain_password": sasl_plaintext_kafka.password,
        }
    )


# --- Mutual TLS ---------------------------------------------------------------------------------


def _tls_handshake(broker: SecuredKafka, with_client_cert: bool) -> None:
    """A TLS 1.2 handshake with the terminator: in 1.2 the server's verdict on the client
    certificate is part of the handshake (in 1.3 it comes after, at the first read)."""
    context = ssl.create_default_context(cafile=str(broker.ca_file))
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    if with_client_cert:
        context.load_cert_chain(str(broker.client_cert_file), str(broker.client_key_file))
    host, port = broker.bootstrap_servers.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as connection,
        context.wrap_socket(connection, server_hostname=host),
    ):
        pass


def test_mtls_handshake_needs_the_client_certificate(mtls_kafka: SecuredKafka) -> None:
    with pytest.raises(ssl.SSLError):
        _tls_handshake(mtls_kafka, with_client_cert=False)
    _tls_handshake(mtls_kafka, with_client_cert=True)


def test_kafka_python_mtls(mtls_kafka: SecuredKafka) -> None:
    config = {
        "bootstrap_servers": mtls_kafka.bootstrap_servers,
        "security_protocol": "SSL",
        "ssl_cafile": str(mtls_kafka.ca_file),
    }
    _assert_kafka_python_fails_fast(config)
    _kafka_python_round_trip(
        config
        | {
            "ssl_certfile": str(mtls_kafka.client_cert_file),
            "ssl_keyfile": str(mtls_kafka.client_key_file),
        }
    )


# --- confluent-kafka (librdkafka) ---------------------------------------------------------------


def _raw_confluent_config(broker: SecuredKafka, mechanism: SaslMechanism | None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": broker.bootstrap_servers,
        "security.protocol": {
            "ssl": "SSL",
            "mtls": "SSL",
            "sasl_ssl": "SASL_SSL",
            "sasl_plaintext": "SASL_PLAINTEXT",
        }[broker.mode],
    }
    if broker.mode in ("ssl", "mtls", "sasl_ssl"):
        config["ssl.ca.location"] = str(broker.ca_file)
    if broker.mode == "mtls":
        config["ssl.certificate.location"] = str(broker.client_cert_file)
        config["ssl.key.location"] = str(broker.client_key_file)
    if mechanism is not None:
        config["sasl.mechanism"] = mechanism
        config["sasl.username"] = broker.username
        config["sasl.password"] = broker.password
    return config


def _confluent_round_trip(config: dict[str, Any], create_topic: Callable[[str], None]) -> None:
    topic = _new_topic()
    create_topic(topic)
    delivery_errors: list[object] = []
    producer = confluent_kafka.Producer(config | {"message.timeout.ms": _CLIENT_TIMEOUT_MS})
    producer.produce(
        topic,
        key=b"tenant-1",
        value=b"secured",
        on_delivery=lambda error, _: delivery_errors.append(error),
    )
    assert producer.flush(_CLIENT_TIMEOUT_MS / 1000) == 0
    assert delivery_errors == [None]
    consumer = confluent_kafka.Consumer(
        config | {"group.id": f"group-{topic}", "enable.auto.commit": False}
    )
    try:
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)]
        )
        message = None
        deadline = time.monotonic() + _POLL_DEADLINE_S
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
        assert message is not None, "no record within the deadline"
        assert message.error() is None, message.error()
        assert message.value() == b"secured"
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("broker_fixture", "mechanism"),
    [
        ("ssl_kafka", None),
        ("mtls_kafka", None),
        ("sasl_ssl_kafka", "PLAIN"),
        ("sasl_ssl_kafka", "SCRAM-SHA-256"),
        ("sasl_ssl_kafka", "SCRAM-SHA-512"),
        ("sasl_plaintext_kafka", "PLAIN"),
        ("sasl_plaintext_kafka", "SCRAM-SHA-256"),
    ],
)
def test_confluent_kafka_produces_and_consumes(
    request: pytest.FixtureRequest, broker_fixture: str, mechanism: SaslMechanism | None
) -> None:
    broker: SecuredKafka = request.getfixturevalue(broker_fixture)
    _confluent_round_trip(_raw_confluent_config(broker, mechanism), broker.create_topic)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_confluent_kafka_wrong_password_is_an_authentication_error(
    sasl_ssl_kafka: SecuredKafka, mechanism: SaslMechanism
) -> None:
    errors: list[confluent_kafka.KafkaError] = []
    config = _raw_confluent_config(sasl_ssl_kafka, mechanism) | {
        "sasl.password": "not-the-password",
        "error_cb": errors.append,
    }
    producer = confluent_kafka.Producer(config)
    try:
        deadline = time.monotonic() + _FAILURE_BOUND_S
        while not errors and time.monotonic() < deadline:
            producer.poll(0.2)
    finally:
        # librdkafka would go on retrying in its own threads until the handle is destroyed.
        del producer
    assert errors, "no error reported within the bound"
    assert errors[0].code() == confluent_kafka.KafkaError._AUTHENTICATION
    assert "Invalid username or password" in errors[0].str()


def test_helper_configs_match_each_mode(
    ssl_kafka: SecuredKafka, mtls_kafka: SecuredKafka, sasl_plaintext_kafka: SecuredKafka
) -> None:
    """SecuredKafka's own config helpers get through too (they are what other tests may use)."""
    for broker in (ssl_kafka, mtls_kafka, sasl_plaintext_kafka.with_mechanism("SCRAM-SHA-512")):
        _kafka_python_round_trip(broker.kafka_python_config())
        _confluent_round_trip(broker.confluent_config(), broker.create_topic)


def test_client_that_skips_sasl_gets_nothing(sasl_plaintext_kafka: SecuredKafka) -> None:
    """A plaintext client on the SASL_PLAINTEXT port: its first non-SASL request ends the
    connection, so it never reaches the broker."""
    _assert_kafka_python_fails_fast({"bootstrap_servers": sasl_plaintext_kafka.bootstrap_servers})


def test_without_root_the_harness_skips_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match="needs root"), network_namespace():
        pass
