"""kafka-python consumers as this source uses them, on the driver and on executors alike.

Both sides bound every wait and fail with `KafkaUnavailableError`, so a broker outage stops the
query instead of hanging it.
"""

from __future__ import annotations

from typing import Any

# kafka-python's own default; a lookup never gets more than what is left of its budget.
DEFAULT_REQUEST_TIMEOUT_MS = 30_000


class KafkaUnavailableError(TimeoutError):
    """The broker did not answer within the source's time budget; the query should fail."""


def consumer_config(
    bootstrap_servers: str,
    request_timeout_ms: int | None,
    client_id: str,
    bootstrap_timeout_ms: int | None = None,
) -> dict[str, Any]:
    """kafka-python settings for a consumer that never joins a group or commits."""
    config: dict[str, Any] = {
        "bootstrap_servers": bootstrap_servers,
        "client_id": client_id,
        # Offsets live in Spark's checkpoint; a group would only add rebalances and commits.
        "group_id": None,
        "enable_auto_commit": False,
        # A metadata lookup of a missing topic must not create it behind the producer's back.
        "allow_auto_create_topics": False,
        # Fail instead of silently jumping elsewhere when a requested offset is gone.
        "auto_offset_reset": "none",
    }
    if request_timeout_ms is not None:
        config["request_timeout_ms"] = request_timeout_ms
    if bootstrap_timeout_ms is not None:
        # Creating a consumer blocks until a broker answers; unbounded it would outlast the
        # caller's own deadline when the broker is down.
        config["bootstrap_timeout_ms"] = max(bootstrap_timeout_ms, 1)
    return config
