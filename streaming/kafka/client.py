"""The Kafka clients of this source: kafka-python on the driver (offset lookups), librdkafka
(confluent-kafka) on executors (reading ranges).

Both sides bound every wait and fail with `KafkaUnavailableError`, so a broker outage stops the
query instead of hanging it. That includes a broker that accepts connections and never answers:
bootstrapping and every single request are cut to the caller's budget, so no request outlives it
(kafka-python's own 30 s request timeout would otherwise overrun a shorter budget).

Executors read with librdkafka because reading is the one step every record pays for, deferred
or not: its C decoder costs 2-3 us of CPU a record against kafka-python's 8-12 here
(docs/scale.md), which is what a burst that is only read and parked costs everyone else.
"""

from __future__ import annotations

import socket
from typing import Any

# kafka-python's own default; a lookup never gets more than what is left of its budget.
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
# kafka-python requires a request timeout above its fetch wait (500 ms by default).
MIN_REQUEST_TIMEOUT_MS = 1_000


class KafkaUnavailableError(TimeoutError):
    """The broker did not answer within the source's time budget; the query should fail."""


def require_a_reachable_broker(bootstrap_servers: str, timeout_s: float) -> None:
    """Return once one bootstrap server accepts a TCP connection; otherwise fail at once, in one
    line per server. A client would retry (and log every attempt) for its whole budget before
    saying the same."""
    failures: list[str] = []
    for server in (part.strip() for part in bootstrap_servers.split(",") if part.strip()):
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            failures.append(f"broker {server} unreachable (not HOST:PORT)")
            continue
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                return
        except ConnectionRefusedError:
            failures.append(f"broker {server} unreachable (connection refused)")
        except TimeoutError:
            failures.append(f"broker {server} unreachable (no answer within {timeout_s:g} s)")
        except OSError as error:
            failures.append(f"broker {server} unreachable ({error})")
    raise KafkaUnavailableError("; ".join(failures) or "no bootstrap servers configured")


def request_timeout_within(request_timeout_ms: int | None, budget_ms: int) -> int:
    """The per-request timeout a client with `budget_ms` left may use: never longer than it."""
    configured = request_timeout_ms or DEFAULT_REQUEST_TIMEOUT_MS
    return max(min(configured, budget_ms), MIN_REQUEST_TIMEOUT_MS)


def consumer_config(
    bootstrap_servers: str,
    request_timeout_ms: int | None,
    client_id: str,
    budget_ms: int,
) -> dict[str, Any]:
    """kafka-python settings for a consumer that never joins a group or commits, and never
    waits longer than `budget_ms` for a broker: to bootstrap, or for any one request."""
    return {
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
) -> dict[str, Any]:
    """librdkafka settings for an executor that reads one offset range it was assigned,
    with the same guarantees as `consumer_config`: no group, no commits, no silent jumps, and
    no single request or connection attempt longer than `budget_ms`."""
    request_ms = request_timeout_within(request_timeout_ms, budget_ms)
    return {
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
