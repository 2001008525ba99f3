"""A real Kafka broker reachable only through TLS, TLS with client certificates, or SASL.

The broker (noida-db, which speaks neither TLS nor SASL) runs in a network namespace of its own,
listening on 127.0.0.1:P there and advertising 127.0.0.1:P. In the root namespace a
`SecurityTerminator` listens on the same 127.0.0.1:P, so the advertised address leads clients
back to it, and relays each connection it secured over a Unix socket (a file, so it crosses
namespaces) to a forwarder inside the namespace that connects to the broker:

    client --TLS/SASL--> terminator 127.0.0.1:P --unix--> forwarder (netns) --> broker 127.0.0.1:P

Nothing in the root namespace can reach the broker's port, so a client whose security settings
are wrong fails: this is what the product's Kafka security settings are tested against.

`secured_kafka(work_dir, mode=...)` starts it all and stops it all (by PID, and deletes the
namespace), also when start-up fails. Creating a namespace needs root and `ip` (iproute2);
without them it skips the test, saying why.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from kafka import KafkaAdminClient

from infra.dev.local_process import LocalProcess
from infra.dev.local_stack import create_topic, find_free_loopback_port, noida_binary
from tests.support.kafka_sasl_protocol import api_versions_request
from tests.support.tls_sasl_terminator import SecurityTerminator

SecurityMode = Literal["ssl", "mtls", "sasl_ssl", "sasl_plaintext"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

_SECURITY_PROTOCOLS: dict[SecurityMode, str] = {
    "ssl": "SSL",
    "mtls": "SSL",
    "sasl_ssl": "SASL_SSL",
    "sasl_plaintext": "SASL_PLAINTEXT",
}
_FORWARDER_SCRIPT = Path(__file__).with_name("netns_forwarder.py")
_COMMAND_TIMEOUT_S = 30.0
_PROBE_TIMEOUT_S = 2.0
_ADMIN_TIMEOUT_MS = 10_000
USERNAME = "tenant-windows"


# --- Network namespace --------------------------------------------------------------------------


def namespace_unavailable_reason() -> str | None:
    """Why this machine cannot create network namespaces, or None when it can (probably)."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return f"creating a network namespace needs root (euid is {os.geteuid()})"
    return None


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False
    )


@contextmanager
def network_namespace() -> Iterator[str]:
    """A new network namespace with loopback up, deleted on exit; skips the test where none can
    be created."""
    reason = namespace_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    name = f"tw-{secrets.token_hex(4)}"
    added = _run(["ip", "netns", "add", name])
    if added.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {added.stderr.strip()}")
    try:
        loopback = _run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"])
        if loopback.returncode != 0:
            raise RuntimeError(f"cannot bring up loopback in {name}: {loopback.stderr.strip()}")
        yield name
    finally:
        _run(["ip", "netns", "delete", name])


# --- Certificates -------------------------------------------------------------------------------

# A config of our own: the system's openssl.cnf adds extensions that would clash with these.
# Key identifiers are there because Python 3.13's default context checks X.509 strictly.
_OPENSSL_CONFIG = """\
[req]
distinguished_name = subject
prompt = no
[subject]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""
# EC keys: generated in milliseconds where RSA takes a noticeable fraction of a second.
_NEW_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Certificates:
    """A throw-away CA, a server certificate for 127.0.0.1/localhost, a client certificate."""

    ca_file: Path
    server_cert_file: Path
    server_key_file: Path
    client_cert_file: Path
    client_key_file: Path


def _openssl(*arguments: str) -> None:
    result = _run(["openssl", *arguments])
    if result.returncode != 0:
        raise RuntimeError(f"openssl {arguments[0]} failed: {result.stderr.strip()}")


def make_certificates(directory: Path) -> Certificates:
    """Write a CA and the certificates it signs into `directory` (valid for two days)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "openssl.cnf"
    config.write_text(_OPENSSL_CONFIG)
    ca_cert, ca_key = directory / "ca.crt", directory / "ca.key"
    _openssl(
        "req", "-x509", "-config", str(config), "-extensions", "ca", *_NEW_KEY,
        "-keyout", str(ca_key), "-out", str(ca_cert), "-days", "2",
        "-subj", "/CN=tenant-windows test CA",
    )  # fmt: skip
    signed: dict[str, tuple[Path, Path]] = {}
    for role, common_name in (("server", "127.0.0.1"), ("client", USERNAME)):
        cert, key, request = (directory / f"{role}.{suffix}" for suffix in ("crt", "key", "csr"))
        _openssl(
            "req", "-new", "-config", str(config), *_NEW_KEY,
            "-keyout", str(key), "-out", str(request), "-subj", f"/CN={common_name}",
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", str(request), "-CA", str(ca_cert), "-CAkey", str(ca_key),
            "-set_serial", str(secrets.randbits(63)), "-days", "2",
            "-extfile", str(config), "-extensions", role, "-out", str(cert),
        )  # fmt: skip
        signed[role] = (cert, key)
    return Certificates(ca_cert, *signed["server"], *signed["client"])


def server_ssl_context(certificates: Certificates, *, require_client_cert: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificates.server_cert_file, certificates.server_key_file)
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(certificates.ca_file)
    return context


# --- Processes inside the namespace -------------------------------------------------------------


class _NamespaceForwarder(LocalProcess):
    """netns_forwarder.py (beside this file) in `namespace`: `socket_path` to 127.0.0.1:`port`
    there."""

    name = "netns forwarder"
    ready_deadline_s = 10.0

    def __init__(self, namespace: str, socket_path: Path, port: int, log_path: Path) -> None:
        self.namespace = namespace
        self.socket_path = socket_path
        self.port = port
        super().__init__(log_path)

    @property
    def address(self) -> str:
        return f"unix:{self.socket_path}"

    def start(self) -> _NamespaceForwarder:
        # `ip netns exec` replaces itself with the command: the PID is the forwarder's own.
        command = [
            "ip", "netns", "exec", self.namespace, sys.executable, str(_FORWARDER_SCRIPT),
            "--listen-unix", str(self.socket_path), "--connect-port", str(self.port),
        ]  # fmt: skip
        self._launch(command)
        return self

    def _probe(self) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(_PROBE_TIMEOUT_S)
            probe.connect(str(self.socket_path))


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed before a whole response arrived")
        data += chunk
    return data


class _NamespacedBroker(LocalProcess):
    """noida-db in `namespace` on 127.0.0.1:`port`, probed through the forwarder's socket."""

    name = "noida-db (in a network namespace)"
    ready_deadline_s = 20.0

    def __init__(self, namespace: str, data_dir: Path, port: int, forwarder_socket: Path) -> None:
        self.namespace = namespace
        self.data_dir = data_dir
        self.port = port
        self.forwarder_socket = forwarder_socket
        super().__init__(data_dir / "noida-db.log")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port} in {self.namespace}"

    def start(self) -> _NamespacedBroker:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # The command line of infra.dev.local_stack.LocalKafka, run in the namespace.
        command = [
            "ip", "netns", "exec", self.namespace, str(noida_binary()), "start",
            "--data-dir", str(self.data_dir), "--host", "127.0.0.1", "--only", "kafka",
            "--kafka-port", str(self.port),
        ]  # fmt: skip
        self._launch(command)
        return self

    def _probe(self) -> None:
        # A bare ApiVersions round trip: no client library, whose retries would eat seconds.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(_PROBE_TIMEOUT_S)
            probe.connect(str(self.forwarder_socket))
            probe.sendall(api_versions_request(correlation_id=7))
            (length,) = struct.unpack(">i", _receive_exactly(probe, 4))
            (correlation_id,) = struct.unpack(">i", _receive_exactly(probe, length)[:4])
            if correlation_id != 7:
                raise ConnectionError(f"ApiVersions answered with correlation id {correlation_id}")


# --- The secured broker -------------------------------------------------------------------------


@dataclass(frozen=True)
class SecuredKafka:
    """Where a secured broker listens and what a client needs to get in.

    `ca_file` and the client certificate exist in the TLS modes (None in "sasl_plaintext"); the
    terminator asks for the client certificate only in "mtls". `username` and `password` are
    set in the SASL modes; every mechanism of `kafka_sasl_protocol.MECHANISMS` accepts them,
    and `mechanism` is the one the config helpers use (`with_mechanism` for another).
    """

    mode: SecurityMode
    bootstrap_servers: str
    ca_file: Path | None
    client_cert_file: Path | None
    client_key_file: Path | None
    username: str | None
    password: str | None
    mechanism: SaslMechanism | None

    @property
    def security_protocol(self) -> str:
        """Kafka's name for the mode: SSL, SASL_SSL or SASL_PLAINTEXT."""
        return _SECURITY_PROTOCOLS[self.mode]

    def with_mechanism(self, mechanism: SaslMechanism) -> SecuredKafka:
        return dataclasses.replace(self, mechanism=mechanism)

    def kafka_python_config(self) -> dict[str, Any]:
        """Keyword arguments for kafka-python clients (KafkaProducer, KafkaAdminClient, ...)."""
        config: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": self.security_protocol,
        }
        if self.ca_file is not None:
            config["ssl_cafile"] = str(self.ca_file)
        if self.mode == "mtls":
            config["ssl_certfile"] = str(self.client_cert_file)
            config["ssl_keyfile"] = str(self.client_key_file)
        if self.mechanism is not None:
            config["sasl_mechanism"] = self.mechanism
            config["sasl_plain_username"] = self.username
            config["sasl_plain_password"] = self.password
        return config

    def confluent_config(self) -> dict[str, str]:
        """librdkafka properties for confluent_kafka clients."""
        config = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        if self.ca_file is not None:
            config["ssl.ca.location"] = str(self.ca_file)
        if self.mode == "mtls":
            config["ssl.certificate.location"] = str(self.client_cert_file)
            config["ssl.key.location"] = str(self.client_key_file)
        if self.mechanism is not None and self.username is not None and self.password is not None:
            config["sasl.mechanism"] = self.mechanism
            config["sasl.username"] = self.username
            config["sasl.password"] = self.password
        return config

    def admin(self) -> KafkaAdminClient:
        """A kafka-python admin client with these security settings; the caller closes it."""
        return KafkaAdminClient(
            **self.kafka_python_config(),
            request_timeout_ms=_ADMIN_TIMEOUT_MS,
            bootstrap_timeout_ms=_ADMIN_TIMEOUT_MS,
        )

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create `name` through the secured listener; an existing topic is left as is."""
        create_topic(self.admin(), name, partitions)


@contextmanager
def secured_kafka(
    work_dir: Path, mode: SecurityMode = "ssl", mechanism: SaslMechanism = "PLAIN"
) -> Iterator[SecuredKafka]:
    """A broker reachable only as `mode` says, its data, certificates and logs in `work_dir`.

    `mechanism` is what the returned object's config helpers use in the SASL modes; the broker
    accepts PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 whatever it is.
    """
    uses_tls = mode in ("ssl", "mtls", "sasl_ssl")
    uses_sasl = mode in ("sasl_ssl", "sasl_plaintext")
    work_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        namespace = stack.enter_context(network_namespace())
        # Unix socket paths are limited to 107 bytes, which pytest's tmp_path can exceed.
        socket_dir = Path(tempfile.mkdtemp(prefix="tw-kafka-"))
        stack.callback(shutil.rmtree, socket_dir, ignore_errors=True)
        forwarder_socket = socket_dir / "broker.sock"
        port = find_free_loopback_port()
        forwarder = _NamespaceForwarder(
            namespace, forwarder_socket, port, work_dir / "forwarder.log"
        )
        stack.enter_context(forwarder)
        stack.enter_context(
            _NamespacedBroker(namespace, work_dir / "broker", port, forwarder_socket)
        )
        certificates = make_certificates(work_dir / "certificates") if uses_tls else None
        password = secrets.token_urlsafe(12) if uses_sasl else None
        terminator = SecurityTerminator(
            port=port,
            upstream_socket=forwarder_socket,
            ssl_context=(
                server_ssl_context(certificates, require_client_cert=mode == "mtls")
                if certificates is not None
                else None
            ),
            passwords={USERNAME: password} if password is not None else None,
        )
        stack.enter_context(terminator)
        yield SecuredKafka(
            mode=mode,
            bootstrap_servers=terminator.address,
            ca_file=certificates.ca_file if certificates else None,
            client_cert_file=certificates.client_cert_file if certificates else None,
            client_key_file=certificates.client_key_file if certificates else None,
            username=USERNAME if uses_sasl else None,
            password=password,
            mechanism=mechanism if uses_sasl else None,
        )


def security_environ(broker: SecuredKafka, **changes: str) -> dict[str, str]:
    """The `TW_KAFKA__*` variables of a stream that reads from `broker` over TLS and SASL."""
    assert broker.mechanism and broker.username and broker.password and broker.ca_file
    return {
        "TW_KAFKA__SECURITY_PROTOCOL": broker.security_protocol,
        "TW_KAFKA__SASL__MECHANISM": broker.mechanism,
        "TW_KAFKA__SASL__USERNAME": broker.username,
        "TW_KAFKA__SASL__PASSWORD": broker.password,
        "TW_KAFKA__SSL__CA_FILE": str(broker.ca_file),
        **changes,
    }
