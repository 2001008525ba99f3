"""Real sockets that hang: a TCP proxy on 127.0.0.1 that can be switched to stall.

A dependency that refuses connections fails fast; one that accepts them and then says nothing
is what makes clients without timeouts hang. `StallProxy` sits in front of a real server (a
Kafka broker, an S3 server) and forwards bytes both ways until `stall()`: from then on it
accepts new connections and relays nothing on any connection, old or new, so requests in
flight stop mid-stream (a response may stop after its headers, mid-body). `forward()` closes the
held connections, so clients reconnect, and forwards again. With no upstream it is a bare
listener that accepts and never answers. `HeadersThenStall` is an HTTP server that answers
every request with headers promising a body, sends a few bytes of it and stalls.

Everything runs in daemon threads bound to a lifetime (`lifetime_s`) and stops on `close()`:
no loop here waits without a bound.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from types import TracebackType
from typing import Self

_TICK_S = 0.05
_CHUNK = 65_536


class _ClosedOnExit:
    """A server that a `with` block closes."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class StallProxy(_ClosedOnExit):
    """A TCP proxy on 127.0.0.1 in front of `upstream` ("host:port"), or a listener that
    never answers when `upstream` is None. Starts in forwarding mode unless `stalled`."""

    def __init__(
        self,
        upstream: str | None,
        *,
        port: int = 0,
        stalled: bool = False,
        lifetime_s: float = 600.0,
    ) -> None:
        if upstream is None:
            stalled = True
        self._upstream = upstream
        self._deadline = time.monotonic() + lifetime_s
        self._stalled = threading.Event()
        if stalled:
            self._stalled.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._held: list[socket.socket] = []
        self.accepted = 0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(64)
        self._listener.settimeout(_TICK_S)
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, name="stall-proxy", daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stall(self) -> None:
        """Relay nothing from now on, on old and new connections alike; accept new ones."""
        self._stalled.set()

    def forward(self) -> None:
        """Drop every held connection (clients reconnect) and forward again."""
        if self._upstream is None:
            raise ValueError("a proxy without an upstream can only stall")
        with self._lock:
            held, self._held = self._held, []
            self._stalled.clear()
        for connection in held:
            connection.close()

    def close(self) -> None:
        self._closed.set()
        self._acceptor.join(timeout=5)
        self._listener.close()
        with self._lock:
            held, self._held = self._held, []
        for connection in held:
            connection.close()

    def _running(self) -> bool:
        return not self._closed.is_set() and time.monotonic() < self._deadline

    def _accept_loop(self) -> None:
        while self._running():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            with self._lock:
                self._held.append(client)
                stalled = self._stalled.is_set()
            if stalled or self._upstream is None:
                continue  # held open, never read, until forward() or close()
            threading.Thread(
                target=self._relay, args=(client,), name="stall-proxy-relay", daemon=True
            ).start()

    def _relay(self, client: socket.socket) -> None:
        assert self._upstream is not None
        host, port = self._upstream.rsplit(":", 1)
        try:
            server = socket.create_connection((host, int(port)), timeout=5)
        except OSError:
            client.close()
            return
        with self._lock:
            self._held.append(server)
        peers = {client: server, server: client}
        with selectors.DefaultSelector() as selector:
            for end in peers:
                selector.register(end, selectors.EVENT_READ)
            try:
                while self._running():
                    if self._stalled.is_set():
                        # Bytes stay in the kernel's buffers; the other side sees silence.
                        time.sleep(_TICK_S)
                        continue
                    for key, _ in selector.select(timeout=_TICK_S):
                        source: socket.socket = key.fileobj  # type: ignore[assignment]
                        data = source.recv(_CHUNK)
                        if not data:
                            return
                        peers[source].sendall(data)
            except OSError:
                return
            finally:
                client.close()
                server.close()


class HeadersThenStall(_ClosedOnExit):
    """An HTTP/1.1 server on 127.0.0.1 that answers every request with a 200, a
    Content-Length of `body_bytes`, the first `sent_bytes` of the body, and then nothing."""

    def __init__(
        self, *, body_bytes: int = 1_000_000, sent_bytes: int = 16, lifetime_s: float = 300.0
    ) -> None:
        self._head = (
            f"HTTP/1.1 200 OK\r\nContent-Length: {body_bytes}\r\n"
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode() + b"x" * sent_bytes
        self._deadline = time.monotonic() + lifetime_s
        self._closed = threading.Event()
        self._held: list[socket.socket] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(_TICK_S)
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _running(self) -> bool:
        return not self._closed.is_set() and time.monotonic() < self._deadline

    def _accept_loop(self) -> None:
        while self._running():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(connection)
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        connection.settimeout(_TICK_S)
        received = b""
        while self._running() and b"\r\n\r\n" not in received:
            try:
                chunk = connection.recv(_CHUNK)
            except TimeoutError:
                continue
            except OSError:
                return
            if not chunk:
                return
            received += chunk
        try:
            connection.sendall(self._head)
        except OSError:
            return
        # Then nothing: the connection stays open until close().

    def close(self) -> None:
        self._closed.set()
        self._acceptor.join(timeout=5)
        self._listener.close()
        for connection in self._held:
            connection.close()
