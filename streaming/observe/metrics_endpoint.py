"""One registry's `/metrics` on a listener of its own, in Prometheus's text format.

The stream (`run --metrics-port`) and the query service (`serve --metrics-port`) each serve
their own registry this way. A listener of its own keeps the operator's metrics off every port
a tenant reaches: the query service's API port never answers `/metrics`.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger(__name__)

PREFIX = "tenant_windows"
"""Every metric's name starts with it, the stream's and the query service's alike."""


class MetricsEndpoint:
    """`registry` served from a daemon thread between `start` and `close`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server: Any = None
        self.port: int | None = None
        """The port bound while serving; None before `start` and after `close`."""

    def start(self, host: str, port: int) -> int:
        """Serve on `host:port` (0: any free port, which the log names); the port bound."""
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = int(self._server.server_address[1])
        log.info("Prometheus metrics on http://%s:%d/metrics", host, self.port)
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
            self.port = None
