"""Run the query service's app on loopback for a test: the real uvicorn server, in a thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from tests.support.waiting import wait_until

START_DEADLINE_S = 30.0
STOP_DEADLINE_S = 30.0


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """`app` answering on a free port of 127.0.0.1 (the OS picks it, so no other test's server
    can take it first); its base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    def running() -> None:
        assert thread.is_alive(), "the server stopped before it started"

    wait_until(
        lambda: server.started,
        START_DEADLINE_S,
        "the server to start",
        alive=running,
        interval_s=0.05,
    )
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=STOP_DEADLINE_S)
