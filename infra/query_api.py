"""`tenant-windows serve`: tenants query their own output over HTTP (docs/querying.md).

The door only: who is calling (a tenant's API key, or the operator's), what they asked, and how
the answer or the failure is written. What a statement may do and use is `QueryService`'s.
Every request leaves one JSON audit line: tenant, key name, statement digest, outcome, rows,
elapsed time; never the key.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
import pyarrow as pa
from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from storage.query_service import OPERATOR, QueryError, QueryService
from tenants.api_keys import Caller, verify_key
from tenants.models import SECRET_FILE_PREFIX, QueryLimits
from tenants.registry import ConfigError, ConfReader, TenantRegistry
from tenants.settings import AppSettings

log = logging.getLogger(__name__)
audit_log = logging.getLogger("tenant_windows.audit")


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sql: str = Field(description="One read-only query over the views (docs/querying.md).")
    as_of_version: int | None = Field(
        default=None, ge=0, description="Read every table at its own Delta version N."
    )
    format: Literal["json", "csv", "arrow"] = "json"


@dataclass
class KeyCheck:
    """Verified keys remembered for `recheck_s`: a revoked key stops working within it, and a
    request does not pay for scrypt each time."""

    conf_dir: Path
    operator_key: SecretStr | None
    recheck_s: float
    _verified: dict[bytes, tuple[Caller, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def caller(self, authorization: str | None) -> Caller | None:
        """The caller a `Bearer` header proves; tenant None is the operator."""
        scheme, _, presented = (authorization or "").partition(" ")
        presented = presented.strip()
        if scheme.lower() != "bearer" or not presented:
            return None
        operator = self.operator_key.get_secret_value() if self.operator_key else ""
        if operator and hmac.compare_digest(presented.encode(), operator.encode()):
            return Caller(tenant=None, key_name="operator")
        digest = hashlib.sha256(presented.encode()).digest()
        now = time.monotonic()
        with self._lock:
            remembered = self._verified.get(digest)
        if remembered is not None and now - remembered[1] < self.recheck_s:
            return remembered[0]
        caller = verify_key(self.conf_dir, presented)
        with self._lock:
            if caller is None:
                self._verified.pop(digest, None)
            else:
                self._verified[digest] = (caller, now)
        return caller


def create_app(
    service: QueryService,
    keys: KeyCheck,
    key_status: Callable[[str], list[dict[str, Any]]],
) -> FastAPI:
    app = FastAPI(
        title="tenant-windows query service",
        version="1",
        description="Each tenant queries its own windows, events and status with its API key.",
    )

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        return _error(400, "bad_request", f"{where or 'body'}: {first.get('msg', 'invalid')}")

    @app.get("/", include_in_schema=False)
    def console() -> HTMLResponse:
        return HTMLResponse(CONSOLE_PAGE.read_text(encoding="utf-8"), headers=_CONSOLE_HEADERS)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/query", response_model=None)
    def query(
        request: QueryRequest, authorization: Annotated[str | None, Header()] = None
    ) -> Response:
        started = time.monotonic()
        caller = keys.caller(authorization)
        audit = {
            "tenant": caller.tenant if caller else None,
            "key_name": caller.key_name if caller else None,
            "statement_sha256": hashlib.sha256(request.sql.encode()).hexdigest(),
        }
        if caller is None:
            _audit(audit, "unauthorized", 0, started)
            return _error(401, "unauthorized", "a valid API key is required (Bearer)")
        try:
            result = service.run(
                OPERATOR if caller.tenant is None else caller.tenant,
                request.sql,
                request.as_of_version,
            )
        except QueryError as failure:
            _audit(audit, failure.code, 0, started)
            return _error(failure.status, failure.code, failure.message, failure.retry_after_s)
        except Exception:
            # A caller sees one line; the operator's log has the trace (never the key).
            log.exception("statement of %s failed unexpectedly", audit["tenant"] or "operator")
            _audit(audit, "internal", 0, started)
            return _error(500, "internal", "the statement failed inside the service")
        _audit(audit, "ok", result.table.num_rows, started)
        if request.format == "arrow":
            return Response(_arrow_bytes(result.table), media_type=ARROW_STREAM)
        if request.format == "csv":
            return Response(_csv_text(result.table), media_type="text/csv")
        return Response(
            orjson.dumps(
                {
                    "columns": [
                        {"name": column.name, "type": str(column.type)}
                        for column in result.table.schema
                    ],
                    "rows": [list(row.values()) for row in result.table.to_pylist()],
                    "truncated": result.truncated,
                    "elapsed_ms": result.elapsed_ms,
                },
                default=str,
            ),
            media_type="application/json",
            headers={"X-Truncated": "true" if result.truncated else "false"},
        )

    @app.get("/v1/status", response_model=None)
    def status(authorization: Annotated[str | None, Header()] = None) -> Response:
        caller = keys.caller(authorization)
        if caller is None:
            return _error(401, "unauthorized", "a valid API key is required (Bearer)")
        if caller.tenant is None:
            return _error(400, "no_tenant", "the operator key has no keys of its own")
        return Response(
            orjson.dumps({"tenant": caller.tenant, "keys": key_status(caller.tenant)}),
            media_type="application/json",
        )

    return app


ARROW_STREAM = "application/vnd.apache.arrow.stream"
CONSOLE_PAGE = Path(__file__).with_name("console.html")
# The page talks to this server only, and keeps nothing: no cookie is ever set, and its script
# keeps the key in a variable.
_CONSOLE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'",
    "Referrer-Policy": "no-referrer",
}


def _error(status: int, code: str, message: str, retry_after_s: int | None = None) -> JSONResponse:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return JSONResponse(
        {"error": {"code": code, "message": message}}, status_code=status, headers=headers
    )


def _audit(audit: dict[str, Any], outcome: str, rows: int, started: float) -> None:
    elapsed_ms = int((time.monotonic() - started) * 1000)
    audit_log.info(
        json.dumps({**audit, "outcome": outcome, "rows": rows, "elapsed_ms": elapsed_ms})
    )


def _arrow_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def _csv_text(table: pa.Table) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.column_names)
    for row in table.to_pylist():
        writer.writerow(["" if value is None else _csv_value(value) for value in row.values()])
    return out.getvalue()


def _csv_value(value: Any) -> str:
    if isinstance(value, dict | list):
        return orjson.dumps(value, default=str).decode()
    return str(value)


@dataclass
class TenantLimits:
    """Each tenant's `QueryLimits`: the app's, with its own file's `query:` overrides. The tenant
    config is read again at most every `recheck_s` (only changed files), so an edit takes effect
    without a restart; an invalid edit keeps the last good config."""

    defaults: QueryLimits
    reader: ConfReader
    recheck_s: float
    _registry: TenantRegistry | None = None
    _read_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, tenant: str | None) -> QueryLimits:
        if tenant is None:
            return self.defaults
        config = self._current().tenants.get(tenant)
        return self.defaults.with_overrides(config.query) if config is not None else self.defaults

    def _current(self) -> TenantRegistry:
        with self._lock:
            now = time.monotonic()
            if self._registry is None or now - self._read_at >= self.recheck_s:
                try:
                    self._registry = self.reader.load()
                except ConfigError as error:
                    if self._registry is None:
                        raise
                    log.warning("tenant config refused, keeping the last good one: %s", error)
                self._read_at = now
            return self._registry


def resolved_operator_key(settings: AppSettings) -> SecretStr | None:
    """`query.operator_key` as given, or read from `secret:FILE` (relative to the conf dir)."""
    key = settings.query.operator_key
    text = key.get_secret_value().strip() if key is not None else ""
    if not text.startswith(SECRET_FILE_PREFIX):
        return SecretStr(text) if text else None
    path = settings.conf_dir / text[len(SECRET_FILE_PREFIX) :].strip()
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(path, [("query.operator_key", f"cannot be read: {error}")]) from None
    if not text:
        raise ConfigError(path, [("query.operator_key", "the secret file is empty")])
    return SecretStr(text)


def serve(settings: AppSettings, host: str, port: int, master: str | None) -> None:
    """Run the query service until interrupted: one warm Spark session for every tenant."""
    import uvicorn

    from storage.delta_lake import DeltaLake
    from streaming.session import build_spark
    from streaming.status import tenant_key_status

    spark = build_spark(
        "tenant-windows-serve",
        master,
        settings.stream.shuffle_partitions,
        # Each tenant's jobs in a pool of their own, shared fairly (`QueryService._collect`).
        extra_conf={"spark.scheduler.mode": "FAIR"},
    )
    lake = DeltaLake.from_settings(settings.lake)
    recheck_s = settings.stream.config_recheck_interval_ms / 1000
    limits = TenantLimits(
        settings.query.with_overrides({}), ConfReader(settings.conf_dir), recheck_s
    )
    app = create_app(
        QueryService(spark, lake, limits),
        KeyCheck(settings.conf_dir, resolved_operator_key(settings), recheck_s),
        lambda tenant: tenant_key_status(lake, tenant),
    )
    log.info("query service on http://%s:%d (OpenAPI at /openapi.json)", host, port)
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False)
