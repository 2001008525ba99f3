"""A real HTTP endpoint on 127.0.0.1 for the notification tests: records every request it gets.

Paths choose the behaviour: `/<run>/ok/...` answers 200; `/<run>/flaky/...` answers 503 to its
first `flaky_failures` requests, then 200; `/<run>/down/...` answers 503 while `down` is set;
`/<run>/hang/...` answers 200 only once `release` is set (at most `HANG_LIMIT_S` later).

A request whose body ends before its `Content-Length` (the sender died mid-send, as the crash
tests make it) is not a request an HTTP server acts on: it is kept apart in `incomplete`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY_BYTES = 1_000_000
HANG_LIMIT_S = 60


@dataclass(frozen=True)
class Received:
    path: str
    key: str
    body: bytes
    status: int


@dataclass
class Receiver:
    flaky_failures: int = 2
    down: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    requests: list[Received] = field(default_factory=list)
    incomplete: list[Received] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _flaky_seen: dict[str, int] = field(default_factory=dict)

    def answer(self, path: str, key: str, body: bytes) -> int:
        if "/hang/" in path:
            self.release.wait(timeout=HANG_LIMIT_S)
        with self._lock:
            status = 200
            if "/flaky/" in path:
                seen = self._flaky_seen.get(path, 0)
                self._flaky_seen[path] = seen + 1
                status = 503 if seen < self.flaky_failures else 200
            elif "/down/" in path and self.down.is_set():
                status = 503
            self.requests.append(Received(path, key, body, status))
            return status

    def cut_short(self, path: str, key: str, body: bytes) -> None:
        with self._lock:
            self.incomplete.append(Received(path, key, body, status=0))

    def received(self, prefix: str) -> list[Received]:
        with self._lock:
            return [request for request in self.requests if request.path.startswith(prefix)]


def serve(receiver: Receiver) -> ThreadingHTTPServer:
    """Start a server for `receiver` on 127.0.0.1 (a free port) in a daemon thread; the caller
    shuts it down."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = min(int(self.headers.get("Content-Length", "0")), MAX_BODY_BYTES)
            body = self.rfile.read(length)
            key = self.headers.get("Idempotency-Key", "")
            if len(body) < length:
                receiver.cut_short(self.path, key, body)
                self.close_connection = True
                return
            status = receiver.answer(self.path, key, body)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="notify-receiver", daemon=True).start()
    return server
