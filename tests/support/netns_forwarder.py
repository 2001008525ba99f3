"""Carry connections from a Unix socket to a TCP port on this network namespace's loopback.

Run it inside a network namespace (`ip netns exec NS python netns_forwarder.py ...`): a Unix
socket is a file, so a process in the root namespace reaches it, while the TCP port behind it
is reachable from nowhere else. tests/support/secured_kafka.py puts a broker behind it, so that
the only way to the broker is through the TLS/SASL terminator that connects here.

Run as a script it is its own process in the other namespace, which the harness stops by its
PID (SIGTERM ends it); tests/support/tls_sasl_terminator.py imports `pipe_streams` from it. It
imports nothing outside the standard library, so it runs without the project on its path.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

_CHUNK = 65_536
_CONNECT_TIMEOUT_S = 5.0


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    while data := await source.read(_CHUNK):
        sink.write(data)
        await sink.drain()


async def pipe_streams(
    first: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    second: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    """Copy bytes both ways until either side closes, then close both."""
    (first_reader, first_writer), (second_reader, second_writer) = first, second
    copies = {
        asyncio.ensure_future(_copy(first_reader, second_writer)),
        asyncio.ensure_future(_copy(second_reader, first_writer)),
    }
    try:
        # Either side closing ends the connection: Kafka connections are not half-closed.
        await asyncio.wait(copies, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for copy in copies:
            copy.cancel()
        for writer in (first_writer, second_writer):
            writer.close()
        await asyncio.gather(*copies, return_exceptions=True)


async def _forward(
    client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter, port: int
) -> None:
    try:
        upstream = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), _CONNECT_TIMEOUT_S
        )
    except (OSError, TimeoutError):
        # Nothing listens yet (the broker is starting): the caller sees a closed connection.
        client_writer.close()
        return
    await pipe_streams((client_reader, client_writer), upstream)


async def _serve(socket_path: Path, port: int) -> None:
    socket_path.unlink(missing_ok=True)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _forward(reader, writer, port)

    server = await asyncio.start_unix_server(handle, path=str(socket_path))
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen-unix", type=Path, required=True)
    parser.add_argument("--connect-port", type=int, required=True)
    arguments = parser.parse_args()
    asyncio.run(_serve(arguments.listen_unix, arguments.connect_port))


if __name__ == "__main__":
    main()
