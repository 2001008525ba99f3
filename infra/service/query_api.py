"""`tenant-windows serve`: tenants query their own output over HTTP (docs/querying.md).

The door only: who is calling (a tenant's API key, or the operator's), what they asked, and how
the answer or the failure is written. What a statement may do and use is `QueryService`'s.
Every query request leaves one JSON audit line (tenant, key name, statement digest, outcome,
rows, truncated, elapsed time; never the key) and is counted once in `QueryMetrics` by the same
outcome: `QueryAccounting` writes both, whatever answered the request.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import orjson
import pyarrow as pa
from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infra.service.query_audit import QueryAudit, account_query
from infra.service.query_metrics import Outcome, QueryMetrics
from infra.service.tenant_access import KeyCheck, TenantLimits, resolved_operator_key

if TYPE_CHECKING:
    from infra.service.pg_door import PgDoorConfig
from storage.query.query_errors import QueryError
from storage.query.query_service import (
    OPERATOR,
    QueryService,
    fair_scheduler_conf,
    leave_statement_errors_to_the_service,
)
from tenants.conf_reader import ConfReader
from tenants.models import WindowRules
from tenants.settings import AppSettings

log = logging.getLogger(__name__)
QUERY_PATH = "/v1/query"
_AUDIT_STATE = "tenant_windows_query_audit"
"""The key of a query request's `QueryAudit` in its ASGI scope's state."""


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sql: str = Field(description="One read-only query over the views (docs/querying.md).")
    as_of_version: int | None = Field(
        default=None, ge=0, description="Read every table at its own Delta version N."
    )
    format: Literal["json", "csv", "arrow"] = "json"


class QueryAccounting:
    """ASGI middleware: the one place each `POST /v1/query` is audited and counted.

    It wraps everything that can answer the request, so a request is written exactly once with
    the outcome its answer carried: the handler's, the validation's 400, or `internal` for an
    exception nothing caught (the 500 of the server's last resort).
    """

    def __init__(self, app: ASGIApp, metrics: QueryMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != QUERY_PATH:
            await self.app(scope, receive, send)
            return
        audit = QueryAudit()
        scope.setdefault("state", {})[_AUDIT_STATE] = audit
        started = time.monotonic()
        written = False
        self.metrics.in_flight.inc()

        def write_once() -> None:
            nonlocal written
            if not written:
                written = True
                self.metrics.in_flight.dec()
                # No outcome: the request was cancelled before any answer; counted all the same.
                self._write(audit, audit.outcome or "internal", time.monotonic() - started)

        async def send_when_written(message: Message) -> None:
            # Written before the answer leaves: a caller holding its answer finds it counted.
            if message["type"] == "http.response.start":
                write_once()
            await send(message)

        try:
            await self.app(scope, receive, send_when_written)
        except Exception:
            if not written:
                audit.outcome = "internal"
            raise
        finally:
            write_once()

    def _write(self, audit: QueryAudit, outcome: Outcome, elapsed_s: float) -> None:
        account_query(self.metrics, audit, outcome, elapsed_s)


def query_audit(request: Request) -> QueryAudit | None:
    """The `QueryAudit` of a query request (None for any other request)."""
    return cast(QueryAudit | None, request.scope.get("state", {}).get(_AUDIT_STATE))


def create_app(
    service: QueryService,
    keys: KeyCheck,
    key_status: Callable[[str], list[dict[str, Any]]],
    metrics: QueryMetrics,
    window_rules: Callable[[str], dict[str, WindowRules]] = lambda _tenant: {},
) -> FastAPI:
    """The API; each query request is audited and counted into `metrics` (`QueryAccounting`),
    which the caller serves on a port of its own, if at all. `window_rules` are a tenant's rules
    per source, which `/v1/status` shows (the console's chart needs each source's accumulation)."""
    app = FastAPI(
        title="tenant-windows query service",
        version="1",
        description="Each tenant queries its own windows, events and status with its API key.",
    )
    app.add_middleware(QueryAccounting, metrics=metrics)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, error: RequestValidationError) -> JSONResponse:
        audit = query_audit(request)
        if audit is not None:
            audit.outcome = "bad_request"
        return _error(400, "bad_request", _bad_body_message(error))

    @app.get("/", include_in_schema=False)
    def console() -> HTMLResponse:
        return HTMLResponse(CONSOLE_PAGE.read_text(encoding="utf-8"), headers=_CONSOLE_HEADERS)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post(QUERY_PATH, response_model=None)
    def query(
        body: QueryRequest,
        request: Request,
        authorization: Annotated[str | None, Header()] = None,
    ) -> Response:
        audit = query_audit(request)
        assert audit is not None  # `QueryAccounting` wraps every query request
        caller = keys.caller(authorization)
        audit.statement_sha256 = hashlib.sha256(body.sql.encode()).hexdigest()
        if caller is None:
            audit.outcome = "unauthorized"
            return _error(401, "unauthorized", "a valid API key is required (Bearer)")
        audit.tenant, audit.key_name = caller.tenant, caller.key_name
        try:
            result = service.run(
                OPERATOR if caller.tenant is None else caller.tenant,
                body.sql,
                body.as_of_version,
            )
        except QueryError as failure:
            audit.outcome = failure.code
            return _error(failure.status, failure.code, failure.message, failure.retry_after_s)
        except Exception:
            # A caller sees one line; the operator's log has the trace (never the key).
            log.exception("statement of %s failed unexpectedly", caller.tenant or "operator")
            audit.outcome = "internal"
            return _error(500, "internal", "the statement failed inside the service")
        audit.outcome = "ok"
        audit.rows, audit.truncated = result.table.num_rows, result.truncated
        if body.format == "arrow":
            return Response(_arrow_bytes(result.table), media_type=ARROW_STREAM)
        if body.format == "csv":
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
        sources = [
            {
                "source": source,
                "window": rules.window.model_dump(mode="json"),
                "accumulation": rules.accumulation.value,
                "emit": rules.emit.value,
            }
            for source, rules in sorted(window_rules(caller.tenant).items())
        ]
        return Response(
            orjson.dumps(
                {"tenant": caller.tenant, "keys": key_status(caller.tenant), "sources": sources}
            ),
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


def _bad_body_message(error: RequestValidationError) -> str:
    """What is wrong with a request body, in words: where, and what was expected there."""
    first = error.errors()[0] if error.errors() else {}
    if first.get("type") == "json_invalid":
        # FastAPI keeps only the decoder's words and offset; the body it failed on says where
        # that is as a person counts it.
        reason = str(first.get("ctx", {}).get("error", "it cannot be decoded"))
        offset = next((part for part in first.get("loc", ()) if isinstance(part, int)), None)
        text = error.body if isinstance(error.body, str) else None
        if offset is None or text is None:
            return f"the request body is not valid JSON: {reason.lower()}"
        at = json.JSONDecodeError(reason, text, offset)
        return (
            f"the request body is not valid JSON: {reason.lower()} at line {at.lineno} "
            f"column {at.colno}"
        )
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    return f"{where or 'body'}: {first.get('msg', 'invalid')}"


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


def serve(
    settings: AppSettings,
    host: str,
    port: int,
    master: str | None,
    pg_door: PgDoorConfig | None = None,
) -> None:
    """Run the query service until interrupted: one warm Spark session for every tenant; with
    `pg_door`, its Postgres door beside the HTTP API, on the same engine."""
    import uvicorn

    from infra.service.pg_door import PgDoor
    from storage.lake.delta_lake import DeltaLake
    from storage.query.local_sql import LocalSql
    from streaming.observe.stream_status import tenant_key_status
    from streaming.pipeline.spark_session import build_spark

    leave_statement_errors_to_the_service()
    # Tenants' jobs in FAIR pools Spark is told of up front (`query_service.scheduler_pool`);
    # Spark reads the file when the session starts, so it need not outlive that.
    with tempfile.TemporaryDirectory(prefix="tw-serve-") as pools_dir:
        spark = build_spark(
            "tenant-windows-serve",
            master,
            settings.stream.shuffle_partitions,
            extra_conf=fair_scheduler_conf(Path(pools_dir)),
        )
    lake = DeltaLake.from_settings(settings.lake)
    recheck_s = settings.stream.config_recheck_interval_ms / 1000
    limits = TenantLimits(
        settings.query.with_overrides({}), ConfReader(settings.conf_dir), recheck_s
    )
    metrics = QueryMetrics()
    local = LocalSql.of_settings(lake, settings.query) if settings.query.local_engine else None
    service = QueryService(spark, lake, limits, local)
    service.follow_tables(settings.query.table_follow_interval_ms / 1000)
    keys = KeyCheck(settings.conf_dir, resolved_operator_key(settings), recheck_s)
    app = create_app(
        service,
        keys,
        lambda tenant: tenant_key_status(lake, tenant),
        metrics,
        limits.window_rules,
    )
    if settings.query.metrics_port is not None:
        metrics.serve(settings.query.metrics_host, settings.query.metrics_port)
    log.info("query engine warmed in %.1f s", service.warm())
    door = PgDoor(service, keys, metrics, limits, pg_door).start() if pg_door else None
    log.info("query service on http://%s:%d (OpenAPI at /openapi.json)", host, port)
    try:
        uvicorn.run(app, host=host, port=port, log_config=None, access_log=False)
    finally:
        if door is not None:
            door.close()
        service.close()
        metrics.close()
