"""A TLS and/or SASL front for a Kafka broker that has neither: the only way in is the secure one.

`SecurityTerminator` listens on 127.0.0.1 and connects each client to an upstream Unix socket
(tests/support/netns_forwarder.py, which reaches a broker in another network namespace). With an
`ssl.SSLContext` it speaks TLS to clients (requiring a client certificate if the context does);
with `passwords` it answers the Kafka SASL exchange itself (tests/support/kafka_sasl_protocol.py)
before it relays a single byte of anything else, and closes connections that fail or skip it.

It runs an asyncio loop in a daemon thread; `close()` stops it, its connections with it. Every
wait is bounded: connecting upstream, the TLS handshake and the whole SASL exchange.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tests.support.kafka_sasl_protocol import (
    API_VERSIONS,
    ILLEGAL_SASL_STATE,
    MECHANISMS,
    NO_ERROR,
    SASL_AUTHENTICATE,
    SASL_AUTHENTICATION_FAILED,
    SASL_HANDSHAKE,
    UNSUPPORTED_SASL_MECHANISM,
    UNSUPPORTED_VERSION,
    AuthenticationFailedError,
    SaslExchange,
    WireError,
    authenticate_response,
    exchange_for,
    frame,
    handshake_response,
    parse_authenticate_bytes,
    parse_handshake_mechanism,
    parse_request_header,
    with_sasl_apis,
)
from tests.support.netns_forwarder import pipe_streams

_log = logging.getLogger(__name__)

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0
_CONNECT_TIMEOUT_S = 5.0
_TLS_HANDSHAKE_TIMEOUT_S = 5.0
_SASL_EXCHANGE_TIMEOUT_S = 10.0
# Frames before authentication are small; a larger length is a client speaking something else
# (a TLS ClientHello read as a length is ~370 MB), which must not be waited for.
_MAX_UNAUTHENTICATED_FRAME = 1 << 20
# Kafka holds a connection whose authentication failed this long before closing it
# (connection.failed.authentication.delay.ms, default 100). It matters: kafka-python drops the
# bytes it read along with a close seen in the same read, so a response followed at once by the
# close is lost, and the client reports a disconnection instead of the authentication error.
_FAILED_AUTHENTICATION_CLOSE_DELAY_S = 0.1

_Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (length,) = struct.unpack(">i", await reader.readexactly(4))
    if not 0 < length <= _MAX_UNAUTHENTICATED_FRAME:
        raise WireError(f"frame length {length} before authentication")
    return await reader.readexactly(length)


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


class SecurityTerminator:
    """Listens on 127.0.0.1:`port`; each connection is secured, then relayed to `upstream_socket`.

    `ssl_context`: None for plaintext. `passwords`: user to password, or None for no SASL.
    """

    def __init__(
        self,
        *,
        port: int,
        upstream_socket: Path,
        ssl_context: ssl.SSLContext | None,
        passwords: Mapping[str, str] | None,
    ) -> None:
        self.port = port
        self._upstream_socket = upstream_socket
        self._ssl_context = ssl_context
        self._passwords = passwords
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"security-terminator-{port}", daemon=True
        )
        self.authentication_failures = 0
        """Connections closed because their SASL exchange failed (for tests' messages)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Self:
        """Listen; raises if the port cannot be bound."""
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT_S):
            raise RuntimeError(f"terminator on {self.address} did not start")
        if self._start_error is not None:
            raise RuntimeError(f"terminator cannot listen on {self.address}") from self._start_error
        return self

    def close(self) -> None:
        """Stop listening and drop every connection. Idempotent."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_STOP_TIMEOUT_S)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- The loop's thread ----------------------------------------------------------------------

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        loop.set_exception_handler(self._on_loop_error)
        try:
            server = loop.run_until_complete(
                asyncio.start_server(
                    self._handle,
                    "127.0.0.1",
                    self.port,
                    ssl=self._ssl_context,
                    ssl_handshake_timeout=(
                        _TLS_HANDSHAKE_TIMEOUT_S if self._ssl_context is not None else None
                    ),
                    reuse_address=True,
                )
            )
        except BaseException as error:
            self._start_error = error
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            # Bounded: from Python 3.12 it also waits for connections, all cancelled above.
            loop.run_until_complete(
                asyncio.wait([loop.create_task(server.wait_closed())], timeout=1)
            )
            loop.close()

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # Failed TLS handshakes (a plaintext client, a missing client certificate) land here:
        # expected in these tests, so not worth more than a debug line.
        _log.debug("terminator %s: %s", self.address, context.get("message"))

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await asyncio.wait_for(
                asyncio.open_unix_connection(str(self._upstream_socket)), _CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as error:
            _log.debug("terminator %s: upstream unreachable: %r", self.address, error)
            writer.close()
            return
        try:
            if self._passwords is not None:
                authenticated = await asyncio.wait_for(
                    self._authenticate((reader, writer), upstream, self._passwords),
                    _SASL_EXCHANGE_TIMEOUT_S,
                )
                if not authenticated:
                    await asyncio.sleep(_FAILED_AUTHENTICATION_CLOSE_DELAY_S)
                    return
            await pipe_streams((reader, writer), upstream)
        except (OSError, TimeoutError, WireError, asyncio.IncompleteReadError) as error:
            _log.debug("terminator %s: connection dropped: %r", self.address, error)
        finally:
            writer.close()
            upstream[1].close()

    async def _authenticate(
        self, client: _Stream, upstream: _Stream, passwords: Mapping[str, str]
    ) -> bool:
        """Run the client's SASL exchange; True once it authenticated, False to hang up."""
        client_reader, client_writer = client
        upstream_reader, upstream_writer = upstream
        exchange: SaslExchange | None = None
        while True:
            payload = await _read_frame(client_reader)
            header = parse_request_header(payload)
            if header.api_key == API_VERSIONS:
                # The broker's own answer, so clients see its real versions, plus SASL's.
                await _send(upstream_writer, frame(payload))
                response = await _read_frame(upstream_reader)
                await _send(client_writer, frame(with_sasl_apis(response, header.api_version)))
            elif header.api_key == SASL_HANDSHAKE:
                if header.api_version != 1:
                    await _send(
                        client_writer,
                        handshake_response(header.correlation_id, UNSUPPORTED_VERSION),
                    )
                    return False
                mechanism = parse_handshake_mechanism(payload, header)
                if mechanism not in MECHANISMS:
                    await _send(
                        client_writer,
                        handshake_response(header.correlation_id, UNSUPPORTED_SASL_MECHANISM),
                    )
                    return False
                exchange = exchange_for(mechanism, passwords)
                await _send(client_writer, handshake_response(header.correlation_id, NO_ERROR))
            elif header.api_key == SASL_AUTHENTICATE:
                if exchange is None or exchange.done:
                    reply = authenticate_response(
                        header, ILLEGAL_SASL_STATE, "SaslAuthenticate before SaslHandshake", b""
                    )
                    await _send(client_writer, reply)
                    return False
                try:
                    server_bytes = exchange.step(parse_authenticate_bytes(payload, header))
                except AuthenticationFailedError as failure:
                    self.authentication_failures += 1
                    message = f"Authentication failed: {failure}"
                    reply = authenticate_response(header, SASL_AUTHENTICATION_FAILED, message, b"")
                    await _send(client_writer, reply)
                    return False
                await _send(
                    client_writer, authenticate_response(header, NO_ERROR, None, server_bytes)
                )
                if exchange.done:
                    return True
            else:
                # A broker closes a connection that sends anything else before authenticating.
                _log.debug("terminator %s: API %d before SASL", self.address, header.api_key)
                return False
