"""The Postgres door (`serve --pg-port`): tenants' SQL clients (psql, psycopg, SQLAlchemy,
JDBC, BI tools) over the Postgres wire protocol, into the same engine as the HTTP API.

- **Who:** the user is the tenant id, the password one of its API keys (`KeyCheck`: the same
  keys, revocation within its recheck). The password is asked in clear, so with a certificate
  every connection must be TLS; without one the door binds loopback unless told otherwise (and
  warns). A wrong, revoked or foreign key, or an unknown tenant, gets SQLSTATE 28P01 with
  Postgres' own words, the same for all, and an `unauthorized` audit line; nothing at ERROR.
- **What:** the database is `lake` (a client naming none, or its user, gets the same). A
  statement over the views goes to `QueryService.run` with the tenant's scope, as over HTTP:
  the guard, the limits, the remembered results, and one audit line each (`account_query`).
  Session commands and the catalog are answered without the lake (`pg_catalog`).
- **Protocol:** version 3, simple and extended queries (Parse/Bind/Describe/Execute/Sync, as
  psycopg 3 and JDBC send), text results and binary for the fixed-size types (`pg_wire`).
  CancelRequest is not honoured: the statement timeout ends a statement.

Not buenavista (the pure-Python Postgres server on PyPI): it authenticates with MD5 against
plaintext passwords it holds (API keys are stored as scrypt hashes only), has no TLS, logs
every failure at ERROR, sends errors without SQLSTATE, and runs a statement to describe it (a
second run against the rate limit and audit); what would be left of it is the framing.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import logging
import re
import secrets
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

import pyarrow as pa

from infra.service import pg_wire as wire
from infra.service.pg_catalog import (
    DATABASE,
    STARTUP_PARAMETERS,
    STATUS_NAMES,
    CatalogDatabase,
    SessionSettings,
    lake_statement,
    reads_catalog,
    session_command,
)
from infra.service.query_audit import QueryAudit, account_query
from infra.service.query_metrics import QueryMetrics
from infra.service.tenant_access import KeyCheck
from storage.query.query_errors import QueryError
from storage.query.query_service import QueryService
from tenants.models import QueryLimits

log = logging.getLogger(__name__)
_HANDSHAKE_TIMEOUT_S = 15.0
_SQLSTATES = {
    "refused": "42501",
    "analysis_error": "42000",
    "resource_limit": "54000",
    "too_many_concurrent": "53400",
    "rate_limited": "53400",
    "statement_timeout": "57014",
    "statement_too_long": "54000",
    "bad_version": "22023",
    "query_failed": "22000",
}


@dataclass(frozen=True)
class PgDoorConfig:
    host: str = "127.0.0.1"
    port: int = 5432
    cert_file: Path | None = None
    key_file: Path | None = None
    max_connections: int = 256
    """More at once are refused (53300): each holds a thread."""

    def tls(self) -> ssl.SSLContext | None:
        if self.cert_file is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


@dataclass
class _Prepared:
    sql: str
    oids: list[int]


@dataclass
class _Outcome:
    """A statement's answer: rows (None for a command) and its command tag."""

    tag: str
    table: pa.Table | None = None
    columns: list[wire.Column] = field(default_factory=list)


@dataclass
class _Portal:
    prepared: _Prepared
    params: list[Any]
    formats: list[int]
    outcome: _Outcome | None = None
    sent: int = 0


class _Refused(Exception):  # noqa: N818 - a handshake's outcome
    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class PgDoor:
    """The door's listener: a thread per connection, `max_connections` at most."""

    def __init__(
        self,
        service: QueryService,
        keys: KeyCheck,
        metrics: QueryMetrics,
        limits_of: Callable[[str | None], QueryLimits],
        config: PgDoorConfig,
    ) -> None:
        self.service = service
        self.keys = keys
        self.metrics = metrics
        self.limits_of = limits_of
        self.config = config
        self.catalog = CatalogDatabase()
        self._tls = config.tls()
        self._slots = threading.BoundedSemaphore(config.max_connections)
        door = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                door._serve_connection(cast(socket.socket, self.request), self.client_address)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((config.host, config.port), Handler)
        self._thread: threading.Thread | None = None
        if self._tls is None and not _is_loopback(config.host):
            log.warning(
                "the Postgres door listens on %s without TLS: tenants' API keys cross the "
                "network in clear; give it a certificate (--pg-cert-file, --pg-key-file)",
                config.host,
            )

    @property
    def port(self) -> int:
        address: tuple[str, int] = self._server.server_address  # type: ignore[assignment]
        return address[1]

    def start(self) -> PgDoor:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="pg-door", daemon=True
        )
        self._thread.start()
        log.info(
            "Postgres door on %s:%d (database %s%s)",
            self.config.host,
            self.port,
            DATABASE,
            ", TLS required" if self._tls else "",
        )
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> PgDoor:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    def _serve_connection(self, sock: socket.socket, address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                sock.sendall(wire.error_response("53300", "too many connections", "FATAL"))
            return
        try:
            _Connection(self, sock).run()
        except (EOFError, OSError, ssl.SSLError):
            pass  # the client went away
        except wire.ProtocolError as error:
            log.info("Postgres client %s broke the protocol: %s", address[0], error)
        finally:
            self._slots.release()


class _Connection:
    """One client connection, from the handshake to Terminate."""

    def __init__(self, door: PgDoor, sock: socket.socket) -> None:
        self.door = door
        self.sock = sock
        self.reader: BinaryIO = sock.makefile("rb")
        self.writer: BinaryIO = sock.makefile("wb")
        self.tenant = ""
        self.key_name = ""
        self.settings = SessionSettings()
        self.in_transaction = False
        self.failed = False
        self.statements: dict[str, _Prepared] = {}
        self.portals: dict[str, _Portal] = {}
        self.skip_to_sync = False

    def run(self) -> None:
        self.sock.settimeout(_HANDSHAKE_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            parameters = self._handshake()
        except _Refused as refused:
            self._send(wire.error_response(refused.sqlstate, str(refused), "FATAL"))
            self.writer.flush()
            return
        self.sock.settimeout(None)
        self._send(wire.authentication(0))
        self.settings.values["application_name"] = parameters.get("application_name", "")
        for name in STARTUP_PARAMETERS:
            self._send(
                wire.parameter_status(STATUS_NAMES.get(name, name), self.settings.status(name))
            )
        self._send(wire.parameter_status("session_authorization", self.tenant))
        self._send(wire.backend_key_data(secrets.randbits(31), secrets.randbits(31)))
        self._ready()
        while True:
            kind, body = wire.read_message(self.reader)
            if kind == b"X":
                return
            self._dispatch(kind, body)

    def _handshake(self) -> dict[str, str]:
        tls = self.door._tls
        for _ in range(3):  # SSLRequest and GSSENCRequest each come at most once
            code, body = wire.read_startup(self.reader)
            if (
                code == wire.SSL_REQUEST
                and tls is not None
                and not isinstance(self.sock, ssl.SSLSocket)
            ):
                self.sock.sendall(b"S")
                self.sock = tls.wrap_socket(self.sock, server_side=True)
                self.reader, self.writer = self.sock.makefile("rb"), self.sock.makefile("wb")
            elif code in (wire.SSL_REQUEST, wire.GSS_REQUEST):
                self.sock.sendall(b"N")
            elif code == wire.CANCEL_REQUEST:
                raise EOFError("cancel requests are not honoured")
            elif code == wire.PROTOCOL_3:
                break
            else:
                raise _Refused("0A000", "unsupported frontend protocol")
        else:
            raise wire.ProtocolError("no startup message")
        parameters = wire.startup_parameters(body)
        if tls is not None and not isinstance(self.sock, ssl.SSLSocket):
            raise _Refused("28000", "this server takes TLS connections only (sslmode=require)")
        user = parameters.get("user", "")
        self._send(wire.authentication(3))
        self.writer.flush()
        kind, password = wire.read_message(self.reader)
        if kind != b"p":
            raise wire.ProtocolError("expected a password message")
        caller = self.door.keys.caller_of_key(password.rstrip(b"\x00").decode("utf-8", "replace"))
        if caller is None or caller.tenant is None or caller.tenant != user:
            # One answer for a wrong, revoked or another tenant's key and an unknown tenant.
            log.info("refused a Postgres connection: no valid key for the user it named")
            account_query(
                self.door.metrics, QueryAudit(outcome="unauthorized"), "unauthorized", 0.0
            )
            raise _Refused("28P01", f'password authentication failed for user "{user[:63]}"')
        database = parameters.get("database", "")
        if database not in ("", DATABASE, user):
            raise _Refused(
                "3D000", f'database "{database[:63]}" does not exist (it is "{DATABASE}")'
            )
        self.tenant, self.key_name = caller.tenant, caller.key_name
        return parameters

    def _dispatch(self, kind: bytes, body: bytes) -> None:
        if kind == b"S":
            self.skip_to_sync = False
            self._ready()
            return
        if kind == b"H":
            self.writer.flush()
            return
        if self.skip_to_sync and kind in b"PBDEC":
            return
        try:
            if kind == b"Q":
                self._simple_query(wire.Reader(body).string())
            elif kind == b"P":
                self._parse(wire.Reader(body))
            elif kind == b"B":
                self._bind(wire.Reader(body))
            elif kind == b"D":
                self._describe(wire.Reader(body))
            elif kind == b"E":
                self._execute(wire.Reader(body))
            elif kind == b"C":
                self._close(wire.Reader(body))
            else:
                raise wire.WireError("08P01", f"unexpected message type {kind!r}")
        except wire.WireError as error:
            self._error(error.sqlstate, error.message)
            if kind == b"Q":
                self._ready()
            else:
                self.skip_to_sync = True

    def _simple_query(self, text: str) -> None:
        if not text.strip().strip(";").strip():
            self._send(wire.EMPTY_QUERY)
            self._ready()
            return
        outcome = self._run(text, [])
        if outcome.table is not None:
            formats = [0] * len(outcome.columns)
            self._send(wire.row_description(outcome.columns, formats))
            self._send_rows(outcome, formats, 0, 0)
        self._send(wire.command_complete(outcome.tag))
        self._ready()

    def _parse(self, reader: wire.Reader) -> None:
        name, sql = reader.string(), reader.string()
        oids = [reader.int32() for _ in range(reader.int16())]
        self.statements[name] = _Prepared(sql, oids)
        self._send(wire.PARSE_COMPLETE)

    def _bind(self, reader: wire.Reader) -> None:
        portal, name = reader.string(), reader.string()
        prepared = self.statements.get(name)
        if prepared is None:
            raise wire.WireError("26000", f'prepared statement "{name}" does not exist')
        codes = [reader.int16() for _ in range(reader.int16())]
        count = reader.int16()
        codes = codes * count if len(codes) == 1 else codes or [0] * count
        if len(codes) != count:
            raise wire.WireError("08P01", "parameter format codes do not match the parameters")
        params: list[Any] = []
        for number in range(count):
            size = reader.int32()
            oid = prepared.oids[number] if number < len(prepared.oids) else 0
            params.append(
                None if size < 0 else wire.parameter_value(oid, codes[number], reader.raw(size))
            )
        formats = [reader.int16() for _ in range(reader.int16())]
        self.portals[portal] = _Portal(prepared, params, formats)
        self._send(wire.BIND_COMPLETE)

    def _describe(self, reader: wire.Reader) -> None:
        what, name = reader.byte(), reader.string()
        if what == "S":
            prepared = self.statements.get(name)
            if prepared is None:
                raise wire.WireError("26000", f'prepared statement "{name}" does not exist')
            count = _parameter_count(prepared)
            oids = [*prepared.oids, *[0] * (count - len(prepared.oids))][:count]
            self._send(wire.parameter_description([oid or wire.TEXT for oid in oids]))
            # The columns are known only by running it; the service remembers the result.
            outcome = self._run(prepared.sql, [None] * count)
            self._describe_outcome(outcome, [])
            return
        portal = self._portal(name)
        if portal.outcome is None:
            portal.outcome = self._run(portal.prepared.sql, portal.params)
        self._describe_outcome(portal.outcome, portal.formats)

    def _describe_outcome(self, outcome: _Outcome, requested: list[int]) -> None:
        if outcome.table is None:
            self._send(wire.NO_DATA)
        else:
            formats = wire.result_formats(outcome.columns, requested)
            self._send(wire.row_description(outcome.columns, formats))

    def _execute(self, reader: wire.Reader) -> None:
        portal = self._portal(reader.string())
        max_rows = reader.int32()
        if portal.outcome is None:
            if not portal.prepared.sql.strip().strip(";").strip():
                self._send(wire.EMPTY_QUERY)
                return
            portal.outcome = self._run(portal.prepared.sql, portal.params)
        outcome = portal.outcome
        if outcome.table is None:
            self._send(wire.command_complete(outcome.tag))
            return
        formats = wire.result_formats(outcome.columns, portal.formats)
        portal.sent = self._send_rows(outcome, formats, portal.sent, max_rows)
        if portal.sent < outcome.table.num_rows:
            self._send(wire.PORTAL_SUSPENDED)
        else:
            self._send(wire.command_complete(outcome.tag))

    def _close(self, reader: wire.Reader) -> None:
        what, name = reader.byte(), reader.string()
        if what == "S":
            self.statements.pop(name, None)
        else:
            self.portals.pop(name, None)
        self._send(wire.CLOSE_COMPLETE)

    def _portal(self, name: str) -> _Portal:
        portal = self.portals.get(name)
        if portal is None:
            raise wire.WireError("34000", f'portal "{name}" does not exist')
        return portal

    def _run(self, sql: str, params: list[Any]) -> _Outcome:
        """One statement's answer: a session command's, the catalog's, or the lake's."""
        answer = session_command(sql, self.settings)
        if answer is not None:
            if answer.transaction is not None:
                self.in_transaction, self.failed = answer.transaction, False
            return _outcome(answer.tag, answer.rows)
        limits = self.door.limits_of(self.tenant)
        if reads_catalog(sql):
            table = self.door.catalog.answer(
                sql, self.tenant, params, limits.statement_timeout_ms / 1000
            )
            return _outcome(f"SELECT {table.num_rows}", table)
        return self._lake(lake_statement(sql, params))

    def _lake(self, statement: str) -> _Outcome:
        """A statement over the views, through the query service, audited as over HTTP."""
        started = time.monotonic()
        audit = QueryAudit(
            tenant=self.tenant,
            key_name=self.key_name,
            statement_sha256=hashlib.sha256(statement.encode()).hexdigest(),
        )
        try:
            result = self.door.service.run(self.tenant, statement)
        except QueryError as failure:
            account_query(self.door.metrics, audit, failure.code, time.monotonic() - started)
            sqlstate = failure.sqlstate or _SQLSTATES.get(failure.code, "XX000")
            raise wire.WireError(sqlstate, failure.message) from None
        except Exception:
            log.exception("statement of %s failed unexpectedly (Postgres door)", self.tenant)
            account_query(self.door.metrics, audit, "internal", time.monotonic() - started)
            raise wire.WireError("XX000", "the statement failed inside the service") from None
        audit.rows, audit.truncated = result.table.num_rows, result.truncated
        account_query(self.door.metrics, audit, "ok", time.monotonic() - started)
        return _outcome(f"SELECT {result.table.num_rows}", result.table)

    def _send_rows(self, outcome: _Outcome, formats: list[int], start: int, max_rows: int) -> int:
        table = cast(pa.Table, outcome.table)
        total: int = table.num_rows
        end = total if max_rows <= 0 else min(total, start + max_rows)
        for row in wire.data_rows(table.slice(start, end - start), outcome.columns, formats):
            self._send(row)
        return end

    def _error(self, sqlstate: str, text: str) -> None:
        if self.in_transaction:
            self.failed = True
        self._send(wire.error_response(sqlstate, text))

    def _ready(self) -> None:
        status = b"I" if not self.in_transaction else b"E" if self.failed else b"T"
        self._send(wire.ready_for_query(status))
        self.writer.flush()

    def _send(self, data: bytes) -> None:
        self.writer.write(data)


def _outcome(tag: str, table: pa.Table | None) -> _Outcome:
    if table is None:
        return _Outcome(tag)
    return _Outcome(tag, table, wire.columns_of(table.schema))


def _parameter_count(prepared: _Prepared) -> int:
    numbers = [int(n) for n in re.findall(r"\$(\d+)", prepared.sql)]
    return max([len(prepared.oids), *numbers])


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
