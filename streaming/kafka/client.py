"""The one place that builds Kafka clients: kafka-python on the driver (offset lookups,
`status`, `produce`), librdkafka (confluent-kafka) on executors (reading ranges). Every client
gets the same security (`KafkaSecurity`: TLS, SASL) from here;
`tests/unit/streaming/kafka/test_client.py` checks that no other module constructs a Kafka client.

Both sides bound every wait and fail with `KafkaUnavailableError`, so a broker outage stops the
query instead of hanging it. That includes a broker that accepts connections and never answers:
bootstrapping and every single request are cut to the caller's budget, so no request outlives it
(kafka-python's own 30 s request timeout would otherwise overrun a shorter budget).

Executors read with librdkafka because reading is the one step every record pays for, deferred
or not: its C decoder costs 2-3 us of CPU a record against kafka-python's 8-12 here
(docs/scale.md), which is what a burst that is only read and parked costs everyone else.
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# Both Kafka clients and the settings are imported where a client or the settings are used:
# `KafkaSecurity` travels inside the pickled Data Source to every Python process Spark starts
# for it, and the ones that only describe the source (its schema, its read plan) never open a
# client. Each of those fresh processes is on a start's critical path.
if TYPE_CHECKING:
    from confluent_kafka import Consumer, KafkaError
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from pydantic import SecretStr

    from tenants.settings import KafkaSettings

# kafka-python's own default; a lookup never gets more than what is left of its budget.
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
# kafka-python requires a request timeout above its fetch wait (500 ms by default).
MIN_REQUEST_TIMEOUT_MS = 1_000


@dataclass(frozen=True)
class KafkaSecurity:
    """How a client proves itself to the brokers and checks them, resolved from the settings
    on the driver. It travels to executors inside the pickled source (never as a Spark option,
    which plans and the UI show); the password stays a `SecretStr`, so it never prints."""

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_file: str | None = None
    ssl_cert_file: str | None = None
    ssl_key_file: str | None = None
    ssl_check_hostname: bool = True

    @classmethod
    def of(cls, kafka: KafkaSettings) -> KafkaSecurity:
        """The settings' security, with the password from `kafka.secrets_file` if not set."""
        password = kafka.sasl.password
        if password is None and kafka.secrets_file is not None and kafka.sasl.mechanism:
            from tenants.settings import read_secrets_file

            password = read_secrets_file(kafka.secrets_file, ("sasl_password",))["sasl_password"]
        ssl = kafka.ssl
        return cls(
            protocol=kafka.security_protocol,
            sasl_mechanism=kafka.sasl.mechanism,
            sasl_username=kafka.sasl.username,
            sasl_password=password,
            ssl_ca_file=None if ssl.ca_file is None else str(ssl.ca_file.resolve()),
            ssl_cert_file=None if ssl.cert_file is None else str(ssl.cert_file.resolve()),
            ssl_key_file=None if ssl.key_file is None else str(ssl.key_file.resolve()),
            ssl_check_hostname=ssl.check_hostname,
        )

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    def kafka_python(self) -> dict[str, Any]:
        """kafka-python's settings for this security."""
        config: dict[str, Any] = {"security_protocol": self.protocol}
        if self.uses_tls:
            config.update(
                ssl_cafile=self.ssl_ca_file,
                ssl_certfile=self.ssl_cert_file,
                ssl_keyfile=self.ssl_key_file,
                ssl_check_hostname=self.ssl_check_hostname,
            )
        if self.uses_sasl:
            config.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self._password(),
            )
        return config

    def librdkafka(self) -> dict[str, Any]:
        """librdkafka's settings for this security."""
        config: dict[str, Any] = {"security.protocol": self.protocol.lower()}
        if self.uses_tls:
            optional = {
                "ssl.ca.location": self.ssl_ca_file,
                "ssl.certificate.location": self.ssl_cert_file,
                "ssl.key.location": self.ssl_key_file,
            }
            config.update({key: value for key, value in optional.items() if value})
            config["ssl.endpoint.identification.algorithm"] = (
                "https" if self.ssl_check_hostname else "none"
            )
        if self.uses_sasl:
            config.update(
                {
                    "sasl.mechanism": self.sasl_mechanism,
                    "sasl.username": self.sasl_username,
                    "sasl.password": self._password(),
                }
            )
        return config

    def spark_options(self) -> dict[str, str]:
        """Spark's own Kafka source (`kafka.source_format: kafka`): the `kafka.`-prefixed
        options of the Java client. The password is inside `kafka.sasl.jaas.config`, whose text
        holds `password=`, so Spark redacts it in plans and the UI (`spark.redaction.regex`)."""
        options = {"kafka.security.protocol": self.protocol}
        if self.uses_tls:
            if self.ssl_ca_file:
                options["kafka.ssl.truststore.type"] = "PEM"
                options["kafka.ssl.truststore.location"] = self.ssl_ca_file
            if self.ssl_cert_file:
                if self.ssl_cert_file != self.ssl_key_file:
                    from tenants.registry import ConfigError

                    raise ConfigError(
                        "kafka.ssl",
                        [
                            (
                                "cert_file",
                                "Spark's Kafka source reads a client certificate and its key "
                                "from one PEM file: set ssl.cert_file and ssl.key_file to it",
                            )
                        ],
                    )
                options["kafka.ssl.keystore.type"] = "PEM"
                options["kafka.ssl.keystore.location"] = self.ssl_cert_file
            if not self.ssl_check_hostname:
                options["kafka.ssl.endpoint.identification.algorithm"] = ""
        if self.uses_sasl:
            module = (
                "org.apache.kafka.common.security.plain.PlainLoginModule"
                if self.sasl_mechanism == "PLAIN"
                else "org.apache.kafka.common.security.scram.ScramLoginModule"
            )
            options["kafka.sasl.mechanism"] = str(self.sasl_mechanism)
            options["kafka.sasl.jaas.config"] = (
                f'{module} required username="{_jaas_quoted(self.sasl_username or "")}" '
                f'password="{_jaas_quoted(self._password() or "")}";'
            )
        return options

    def _password(self) -> str | None:
        return None if self.sasl_password is None else self.sasl_password.get_secret_value()


PLAINTEXT = KafkaSecurity()


class _WithoutConfigs(logging.Filter):
    """Drops kafka-python's DEBUG line that prints a client's whole configuration, password
    included ("Starting KafkaAdminClient with configuration: ...")."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "configuration" not in str(record.msg)


def _hide_configs_of(logger: logging.Logger) -> None:
    if not any(isinstance(existing, _WithoutConfigs) for existing in logger.filters):
        logger.addFilter(_WithoutConfigs())


def _jaas_quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


class KafkaUnavailableError(TimeoutError):
    """The broker did not answer within the source's time budget; the query should fail."""


def require_a_reachable_broker(bootstrap_servers: str, timeout_s: float) -> None:
    """Return once one bootstrap server accepts a TCP connection; otherwise fail at once, in one
    line per server. A client would retry (and log every attempt) for its whole budget before
    saying the same."""
    failures: list[str] = []
    for server in _servers(bootstrap_servers):
        cause = _connect_failure(server, timeout_s)
        if cause is None:
            return
        failures.append(f"broker {server} unreachable ({cause})")
    raise KafkaUnavailableError("; ".join(failures) or "no bootstrap servers configured")


def _servers(bootstrap_servers: str) -> list[str]:
    return [part.strip() for part in bootstrap_servers.split(",") if part.strip()]


def _connect_failure(server: str, timeout_s: float) -> str | None:
    """Why `server` ("host:port") does not accept a TCP connection within `timeout_s`; None
    if it does."""
    host, _, port = server.rpartition(":")
    if not host or not port.isdigit():
        return "not HOST:PORT"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except OSError as error:
        return str(error)


class KafkaSecurityError(KafkaUnavailableError):
    """The brokers answer, but refuse this client's security: an untrusted certificate, failed
    authentication, or TLS where the client speaks plaintext (or the reverse)."""


class KafkaUnreachableError(KafkaUnavailableError):
    """Before the stream starts, no bootstrap server answers: each refuses the connection (or
    cannot be dialled), or the ones that accept it say nothing within `kafka.broker_timeout`."""


# librdkafka's words for a security cause, where its error code alone does not say it.
_SECURITY_HINTS = ("security.protocol", "SSL handshake", "certificate", "Authentication")
_PROBE_S = 15.0
# One metadata request's wait inside a probe: short, so the probe's own deadline is kept.
_PROBE_REQUEST_S = 1.0
_TLS_PROBE_S = 3.0


def check_broker_security(
    bootstrap_servers: str, security: KafkaSecurity, budget_s: float = _PROBE_S
) -> None:
    """Fail at once, in one line naming the servers, the protocol and the cause, when the
    brokers refuse this client's security; return otherwise. A broker that is down or slow is
    not this check's business: the stream waits for it (`kafka.broker_timeout`)."""
    try:
        require_a_reachable_broker(bootstrap_servers, min(budget_s, 5.0))
    except KafkaUnavailableError:
        return
    _probe_metadata(bootstrap_servers, security, time.monotonic() + budget_s)


def require_an_answering_broker(
    bootstrap_servers: str, security: KafkaSecurity, timeout_s: float
) -> None:
    """Return once a bootstrap server answers a metadata request with this client's security;
    otherwise fail in one line naming the servers and the cause (`KafkaUnreachableError`): at
    once when every server refuses the connection or cannot be dialled, after `timeout_s` when
    a server accepts connections and says nothing. A refused certificate or password fails at
    once too (`KafkaSecurityError`).

    `run` calls it before anything else, so that a broker it cannot use costs seconds and
    leaves nothing behind, instead of a Spark query that retries for the whole timeout after
    it has created the lake and the checkpoint."""
    deadline = time.monotonic() + timeout_s
    servers = _servers(bootstrap_servers)
    causes: list[str] = []
    for server in servers:
        # Each server gets what is left of the budget: a silent first server must not make
        # the check overrun it.
        cause = _connect_failure(server, max(deadline - time.monotonic(), 0.001))
        if cause is None:
            break
        causes.append(cause if len(servers) == 1 else f"{server}: {cause}")
    else:
        reasons = "; ".join(causes) or "no bootstrap servers configured"
        raise KafkaUnreachableError(f"Kafka at {bootstrap_servers} is unreachable: {reasons}")
    answered, last_error = _probe_metadata(bootstrap_servers, security, deadline)
    if not answered:
        said = "" if last_error is None else f" (last error: {last_error})"
        raise KafkaUnreachableError(
            f"Kafka at {bootstrap_servers} is unreachable: it accepts connections but did not "
            f"answer within {timeout_s:g} s (kafka.broker_timeout){said}"
        )


def _probe_metadata(
    bootstrap_servers: str, security: KafkaSecurity, deadline: float
) -> tuple[bool, str | None]:
    """Ask for the cluster's metadata until `deadline`: whether a broker answered, and the
    last error librdkafka reported. Raises `KafkaSecurityError` as soon as a reported error
    is about this client's security."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    causes: deque[KafkaError] = deque(maxlen=8)
    budget_ms = int(max(deadline - time.monotonic(), 0) * 1000)
    config: dict[str, Any] = {
        **security.librdkafka(),
        "bootstrap.servers": bootstrap_servers,
        "client.id": "tenant-windows-broker-check",
        "socket.connection.setup.timeout.ms": max(budget_ms, 1_000),
        "error_cb": causes.append,
        "log_level": 0,
    }
    admin = AdminClient(config)
    tls_probed = security.uses_tls
    while (remaining_s := deadline - time.monotonic()) > 0:
        try:
            admin.list_topics(timeout=min(_PROBE_REQUEST_S, remaining_s))
            return True, None
        except KafkaException:
            admin.poll(0)  # librdkafka hands its errors to `error_cb` only from poll()
        for cause in causes:
            if cause.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL) or any(
                hint in cause.str() for hint in _SECURITY_HINTS
            ):
                raise KafkaSecurityError(
                    f"Kafka at {bootstrap_servers} over {security.protocol}: {cause.str()}"
                )
        if not tls_probed:
            tls_probed = True
            # A plaintext client at a TLS port hears nothing back, which looks like a slow
            # broker: ask the port for a TLS handshake.
            probe_s = min(_TLS_PROBE_S, max(deadline - time.monotonic(), 0.001))
            if _speaks_tls(bootstrap_servers, probe_s):
                raise KafkaSecurityError(
                    f"Kafka at {bootstrap_servers} over {security.protocol}: the port answers "
                    "TLS: set kafka.security_protocol to SSL or SASL_SSL"
                )
    return False, causes[-1].str() if causes else None


def _speaks_tls(bootstrap_servers: str, timeout_s: float = _TLS_PROBE_S) -> bool:
    """Whether the first bootstrap server completes a TLS handshake (certificate unchecked:
    only the protocol is in question)."""
    host, _, port = bootstrap_servers.split(",")[0].strip().rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host.strip("[]")),
        ):
            return True
    except (OSError, ValueError):
        return False


def request_timeout_within(request_timeout_ms: int | None, budget_ms: int) -> int:
    """The per-request timeout a client with `budget_ms` left may use: never longer than it."""
    configured = request_timeout_ms or DEFAULT_REQUEST_TIMEOUT_MS
    return max(min(configured, budget_ms), MIN_REQUEST_TIMEOUT_MS)


def kafka_python_consumer(
    bootstrap_servers: str,
    request_timeout_ms: int | None,
    client_id: str,
    budget_ms: int,
    security: KafkaSecurity = PLAINTEXT,
) -> KafkaConsumer:
    """A driver-side consumer for offset lookups (`consumer_config`)."""
    from kafka import KafkaConsumer

    return KafkaConsumer(
        **consumer_config(bootstrap_servers, request_timeout_ms, client_id, budget_ms, security)
    )


def kafka_python_admin(
    bootstrap_servers: str, security: KafkaSecurity, client_id: str, budget_ms: int
) -> KafkaAdminClient:
    """An admin client (the consumer group's offsets) whose waits end within `budget_ms`."""
    from kafka import KafkaAdminClient

    _hide_configs_of(logging.getLogger("kafka.admin.client"))
    return KafkaAdminClient(
        bootstrap_servers=bootstrap_servers,
        client_id=client_id,
        bootstrap_timeout_ms=max(budget_ms, 1),
        request_timeout_ms=request_timeout_within(None, budget_ms),
        **security.kafka_python(),
    )


def kafka_python_producer(
    bootstrap_servers: str, security: KafkaSecurity = PLAINTEXT, **options: Any
) -> KafkaProducer:
    """A producer (`tenant-windows produce`, load generators) with `options` (acks, ...)."""
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap_servers, **security.kafka_python(), **options)


def librdkafka_consumer(
    bootstrap_servers: str,
    request_timeout_ms: int | None,
    client_id: str,
    budget_ms: int,
    security: KafkaSecurity,
    error_cb: Callable[[KafkaError], None],
) -> Consumer:
    """An executor's consumer of assigned ranges (`reader_config`); `error_cb` hears of
    broker errors librdkafka retries by itself."""
    from confluent_kafka import Consumer

    return Consumer(
        {
            **reader_config(bootstrap_servers, request_timeout_ms, client_id, budget_ms, security),
            "error_cb": error_cb,
        }
    )


def consumer_config(
    bootstrap_servers: str,
    request_timeout_ms: int | None,
    client_id: str,
    budget_ms: int,
    security: KafkaSecurity = PLAINTEXT,
) -> dict[str, Any]:
    """kafka-python settings for a consumer that never joins a group or commits, and never
    waits longer than `budget_ms` for a broker: to bootstrap, or for any one request."""
    return {
        **security.kafka_python(),
        "bootstrap_servers": bootstrap_servers,
        "client_id": client_id,
        # Offsets live in Spark's checkpoint; a group would only add rebalances and commits.
        "group_id": None,
        "enable_auto_commit": False,
        # A metadata lookup of a missing topic must not create it behind the producer's back.
        "allow_auto_create_topics": False,
        # Fail instead of silently jumping elsewhere when a requested offset is gone.
        "auto_offset_reset": "none",
        # Creating a consumer blocks until a broker answers; unbounded it would outlast the
        # caller's own deadline when the broker is down or silent.
        "bootstrap_timeout_ms": max(budget_ms, 1),
        # Calls without a timeout argument (metadata in `topics()`, `close()`) wait this long
        # for a silent broker.
        "request_timeout_ms": request_timeout_within(request_timeout_ms, budget_ms),
    }


READER_GROUP_ID = "tenant-windows-reader-unused"
"""librdkafka's consumer requires a group id. The reader never subscribes or commits, so the
group never has members or offsets: Spark's checkpoint holds the offsets."""


def reader_config(
    bootstrap_servers: str,
    request_timeout_ms: int | None,
    client_id: str,
    budget_ms: int,
    security: KafkaSecurity = PLAINTEXT,
) -> dict[str, Any]:
    """librdkafka settings for an executor that reads one offset range it was assigned,
    with the same guarantees as `consumer_config`: no group, no commits, no silent jumps, and
    no single request or connection attempt longer than `budget_ms`."""
    request_ms = request_timeout_within(request_timeout_ms, budget_ms)
    return {
        **security.librdkafka(),
        "bootstrap.servers": bootstrap_servers,
        "client.id": client_id,
        "group.id": READER_GROUP_ID,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "allow.auto.create.topics": False,
        # A range whose start is gone fails the read (an error message) instead of jumping.
        "auto.offset.reset": "error",
        # As kafka-python and Spark's own source: the planner's end offsets are high
        # watermarks, and read_committed would stop short of them at an open transaction.
        "isolation.level": "read_uncommitted",
        "socket.timeout.ms": request_ms,
        "socket.connection.setup.timeout.ms": max(budget_ms, MIN_REQUEST_TIMEOUT_MS),
        # librdkafka logs every failed reconnect to stderr; its errors reach the reader, which
        # reports the last one when it gives up.
        "log_level": 0,
    }
