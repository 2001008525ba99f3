"""Every Kafka client of the product is built in one place (`streaming.kafka.client`), with the
security the settings give (TLS, SASL), and the password never shows."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest
from pydantic import SecretStr

from streaming.kafka.client import (
    PLAINTEXT,
    KafkaSecurity,
    consumer_config,
    reader_config,
)
from tenants.registry import ConfigError
from tenants.settings import load_settings
from tests.support.paths import ROOT

CLIENT_MODULE = ROOT / "streaming" / "kafka" / "client.py"
KAFKA_CLIENT_CLASSES = {
    "KafkaConsumer",
    "KafkaProducer",
    "KafkaAdminClient",
    "Consumer",
    "Producer",
    "AdminClient",
}
# The local test broker's own admin (topics on a loopback broker the tests start): not a client
# of a user's Kafka.
NOT_A_USERS_CLIENT = {ROOT / "infra" / "dev" / "local_stack.py"}
PASSWORD = "pa55-w0rd-never-printed"


def test_no_module_but_the_client_module_constructs_a_kafka_client() -> None:
    found = []
    for package in ("streaming", "storage", "tenants", "infra"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == CLIENT_MODULE or path in NOT_A_USERS_CLIENT:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                    if name in KAFKA_CLIENT_CLASSES:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}(...)")
    assert not found, "build Kafka clients with streaming.kafka.client's functions: " + str(found)


def sasl_ssl(tmp_path: Path, **extra: str) -> KafkaSecurity:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    settings = load_settings(
        None,
        environ={
            "TW_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
            "TW_KAFKA__SASL__MECHANISM": "SCRAM-SHA-256",
            "TW_KAFKA__SASL__USERNAME": "tenant-windows",
            "TW_KAFKA__SSL__CA_FILE": str(ca),
            **extra,
        },
    )
    return KafkaSecurity.of(settings.kafka)


def test_sasl_ssl_reaches_both_client_libraries(tmp_path: Path) -> None:
    security = sasl_ssl(tmp_path, TW_KAFKA__SASL__PASSWORD=PASSWORD)
    driver = consumer_config("b:9093", None, "c", 1_000, security)
    assert driver["security_protocol"] == "SASL_SSL"
    assert driver["sasl_mechanism"] == "SCRAM-SHA-256"
    assert driver["sasl_plain_username"] == "tenant-windows"
    assert driver["sasl_plain_password"] == PASSWORD
    assert driver["ssl_cafile"] == str(tmp_path / "ca.pem")
    assert driver["ssl_check_hostname"] is True
    executor = reader_config("b:9093", None, "c", 1_000, security)
    assert executor["security.protocol"] == "sasl_ssl"
    assert executor["sasl.username"] == "tenant-windows"
    assert executor["sasl.password"] == PASSWORD
    assert executor["ssl.ca.location"] == str(tmp_path / "ca.pem")
    assert executor["ssl.endpoint.identification.algorithm"] == "https"
    # The settings the client needs are not overridden by the security ones, nor the reverse.
    assert executor["bootstrap.servers"] == "b:9093" and executor["enable.auto.commit"] is False


def test_plaintext_adds_nothing_but_the_protocol() -> None:
    assert PLAINTEXT.kafka_python() == {"security_protocol": "PLAINTEXT"}
    assert PLAINTEXT.librdkafka() == {"security.protocol": "plaintext"}
    assert PLAINTEXT.spark_options() == {"kafka.security.protocol": "PLAINTEXT"}


def test_the_password_comes_from_a_secrets_file(tmp_path: Path) -> None:
    secrets = tmp_path / "kafka-secrets.yaml"
    secrets.write_text(f"sasl_password: {PASSWORD}\n")
    security = sasl_ssl(tmp_path, TW_KAFKA__SECRETS_FILE=str(secrets))
    assert security.librdkafka()["sasl.password"] == PASSWORD
    secrets.write_text("other: 1\n")
    with pytest.raises(ConfigError, match="sasl_password"):
        sasl_ssl(tmp_path, TW_KAFKA__SECRETS_FILE=str(secrets))


def test_the_password_never_prints_nor_pickles_in_clear(tmp_path: Path) -> None:
    security = sasl_ssl(tmp_path, TW_KAFKA__SASL__PASSWORD=PASSWORD)
    assert PASSWORD not in repr(security) and PASSWORD not in str(security)
    assert isinstance(pickle.loads(pickle.dumps(security)).sasl_password, SecretStr)
    settings = load_settings(
        None,
        environ={
            "TW_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "TW_KAFKA__SASL__MECHANISM": "PLAIN",
            "TW_KAFKA__SASL__USERNAME": "u",
            "TW_KAFKA__SASL__PASSWORD": PASSWORD,
        },
    )
    assert PASSWORD not in repr(settings) and PASSWORD not in settings.model_dump_json()


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"TW_KAFKA__SECURITY_PROTOCOL": "SASL_SSL"}, "sasl.mechanism: required"),
        (
            {
                "TW_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "TW_KAFKA__SASL__MECHANISM": "PLAIN",
                "TW_KAFKA__SASL__USERNAME": "u",
            },
            "sasl.password: required with security_protocol SASL_PLAINTEXT: set "
            "TW_KAFKA__SASL__PASSWORD",
        ),
        ({"TW_KAFKA__SSL__CA_FILE": "/no/such/ca.pem"}, "ssl.ca_file: no file /no/such/ca.pem"),
        ({"TW_KAFKA__SSL__CERT_FILE": "/no/such/cert.pem"}, "set both for mutual TLS"),
        ({"TW_KAFKA__SASL__MECHANISM": "GSSAPI"}, "sasl.mechanism"),
    ],
)
def test_an_incomplete_security_setting_is_refused_with_the_field(
    environ: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError, match="kafka") as refused:
        load_settings(None, environ=environ)
    assert named in str(refused.value)


def test_sparks_kafka_source_gets_the_java_clients_options(tmp_path: Path) -> None:
    security = sasl_ssl(tmp_path, TW_KAFKA__SASL__PASSWORD='pa"ss')
    options = security.spark_options()
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-256"
    assert options["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="tenant-windows" password="pa\\"ss";'
    )
    assert options["kafka.ssl.truststore.type"] == "PEM"
    assert options["kafka.ssl.truststore.location"] == str(tmp_path / "ca.pem")
    plain = KafkaSecurity("SASL_PLAINTEXT", "PLAIN", "u", SecretStr("p"))
    assert plain.spark_options()["kafka.sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required"
    )
    mutual = KafkaSecurity("SSL", ssl_cert_file="/c/client.pem", ssl_key_file="/c/client.pem")
    assert mutual.spark_options()["kafka.ssl.keystore.location"] == "/c/client.pem"
    apart = KafkaSecurity("SSL", ssl_cert_file="/c/cert.pem", ssl_key_file="/c/key.pem")
    with pytest.raises(ConfigError, match="one PEM file"):
        apart.spark_options()
    unchecked = KafkaSecurity("SSL", ssl_check_hostname=False)
    assert unchecked.spark_options()["kafka.ssl.endpoint.identification.algorithm"] == ""
    assert unchecked.librdkafka()["ssl.endpoint.identification.algorithm"] == "none"
