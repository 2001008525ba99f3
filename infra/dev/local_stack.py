"""A real Kafka broker on loopback, backed by the noida-db binary.

The native binary is run directly rather than through the `noida-db` Python wrapper: SIGTERM to
the wrapper leaves its native child holding the port, so the next start on that port fails.
"""

from __future__ import annotations

import importlib.resources
import os
import signal
import socket
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import TopicAlreadyExistsError

from infra.dev.local_process import LocalProcess, log_tail

_ADMIN_TIMEOUT_MS = 10_000
# Short, so one slow probe cannot eat most of the start-up deadline.
_PROBE_TIMEOUT_MS = 2_000


def find_free_loopback_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def noida_binary() -> Path:
    """Path of the native noida-db executable shipped inside the `noida_db` package."""
    resource = importlib.resources.files("noida_db").joinpath("noida-db")
    binary = Path(str(resource))
    if not binary.is_file():
        raise RuntimeError(f"noida-db binary not found at {binary}; is noida-db installed?")
    mode = binary.stat().st_mode
    if mode & stat.S_IXUSR == 0:
        # Wheels sometimes lose the executable bit on unpacking.
        binary.chmod(0o755)
    return binary


def create_topic(admin: KafkaAdminClient, name: str, partitions: int) -> None:
    """Create `name` with `partitions` partitions through `admin`, then close it; a topic that
    already exists is left as is."""
    try:
        admin.create_topics(
            {name: {"num_partitions": partitions, "replication_factor": 1}},
            timeout_ms=_ADMIN_TIMEOUT_MS,
            wait_for_metadata=True,
        )
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


def _port_accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class LocalKafka(LocalProcess):
    """A single-node Kafka broker (noida-db) bound to 127.0.0.1, stopped cleanly with SIGTERM.

    Use as a context manager, or call `start()` and `stop()` yourself; after `stop()`, `start()`
    runs it again on the same port with the same data (a broker outage in tests): noida-db
    writes its data on a clean stop and reads it back at start, while a broker that was
    SIGKILLed loses its last seconds.
    """

    name = "noida-db"
    ready_deadline_s = 20.0

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port if port is not None else find_free_loopback_port()
        super().__init__(self.data_dir / "noida-db.log")

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return self.bootstrap_servers

    def start(self) -> LocalKafka:
        """Launch the broker and wait until it answers metadata requests."""
        # Another listener on the port would answer the readiness probe in our broker's place.
        if _port_accepts_connections(self.port):
            raise RuntimeError(f"port {self.port} on 127.0.0.1 is already in use")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            str(noida_binary()),
            "start",
            "--data-dir",
            str(self.data_dir),
            "--host",
            "127.0.0.1",
            "--only",
            "kafka",
            "--kafka-port",
            str(self.port),
        ]
        self._launch(command)
        return self

    def _probe(self) -> None:
        # A plain TCP probe first: a client against a closed port spends seconds retrying.
        if not _port_accepts_connections(self.port):
            raise ConnectionRefusedError(f"nothing listens on port {self.port} yet")
        self._list_topics()

    def _admin(self, timeout_ms: int = _ADMIN_TIMEOUT_MS) -> KafkaAdminClient:
        return KafkaAdminClient(
            bootstrap_servers=self.bootstrap_servers,
            request_timeout_ms=timeout_ms,
            bootstrap_timeout_ms=timeout_ms,
        )

    def _list_topics(self) -> list[str]:
        admin = self._admin(_PROBE_TIMEOUT_MS)
        try:
            topics: list[str] = admin.list_topics()
            return topics
        finally:
            admin.close()

    def create_topic(self, name: str, partitions: int) -> None:
        """Create `name` with `partitions` partitions; a topic that already exists is left as is."""
        create_topic(self._admin(), name, partitions)

    def delete_records(self, topic: str) -> int:
        """Delete every record `topic` holds now (`DeleteRecords` to each partition's end), as
        a broker's retention would; the records deleted."""
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap_servers)
        admin = self._admin()
        try:
            partitions = [
                TopicPartition(topic, partition)
                for partition in sorted(consumer.partitions_for_topic(topic) or ())
            ]
            ends = consumer.end_offsets(partitions)
            firsts = consumer.beginning_offsets(partitions)
            held = {partition: end for partition, end in ends.items() if end > firsts[partition]}
            if held:
                admin.delete_records(held)
            return sum(end - firsts[partition] for partition, end in held.items())
        finally:
            admin.close()
            consumer.close()


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost"})
_WATCH_INTERVAL_S = 0.5


def loopback_port(bootstrap_servers: str) -> int:
    """The port of the first `host:port` of `bootstrap_servers`, which must be on loopback: the
    development broker never listens beyond this machine."""
    first = bootstrap_servers.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if host not in LOOPBACK_HOSTS or not port.isdigit():
        raise ValueError(
            f"kafka.bootstrap_servers is {bootstrap_servers!r}: the development broker listens on "
            "127.0.0.1 only; set it to 127.0.0.1:PORT (or give --bootstrap-servers)"
        )
    return int(port)


def run_until_stopped(
    kafka: LocalKafka, topic: str, partitions: int, say: Callable[[str], None]
) -> int:
    """Start `kafka` with `topic`, say where it is and how to stop it, and keep it until Ctrl-C
    or SIGTERM (then stop it cleanly: its data is kept for the next start). 0 when stopped so,
    1 when the broker exited on its own."""
    stop_requested = threading.Event()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        with kafka:
            kafka.create_topic(topic, partitions)
            say(
                f"Kafka broker (noida-db) listening on {kafka.bootstrap_servers}, topic {topic!r} "
                f"({partitions} partitions); data in {kafka.data_dir}, log in {kafka.log_path}.\n"
                f"Stop it with Ctrl-C, or `kill {os.getpid()}`."
            )
            try:
                while kafka.is_running and not stop_requested.wait(_WATCH_INTERVAL_S):
                    pass
            except KeyboardInterrupt:
                pass
            if not kafka.is_running:
                say(f"the broker exited on its own; log tail:\n{log_tail(kafka.log_path)}")
                return 1
        say("broker stopped")
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
