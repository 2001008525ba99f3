"""`sql` and `serve`: SQL over the lake, from the command line or over HTTP."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from infra.cli.command_context import add_settings_flags, settings_from
from infra.cli.exit_codes import ExitCode
from tenants.models import ID_PATTERN, QueryLimits
from tenants.registry import load_registry
from tenants.settings import AppSettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`sql`, `serve`."""
    sql = commands.add_parser(
        "sql",
        help="run Spark SQL over the output tables (docs/querying.md)",
        description="Spark SQL over the output tables, registered as views named after them. "
        "With --tenant, a statement sees only that tenant's rows and must pass the guard "
        "described in docs/querying.md. Without a query, reads statements from a prompt.",
    )
    sql.add_argument(
        "query",
        nargs="?",
        help='e.g. "SELECT tenant, count(*) FROM events GROUP BY tenant"; omit it for a prompt',
    )
    add_settings_flags(sql)
    sql.add_argument("--format", choices=["table", "csv", "json"], default="table")
    sql.add_argument(
        "--tenant", help="scope every view to this tenant's rows (a security boundary)"
    )
    sql.add_argument("--limit", type=int, default=1000, help="rows to print at most")
    sql.add_argument(
        "--as-of-version",
        action="append",
        default=[],
        metavar="N|TABLE=N",
        help="time travel: read every table at its own Delta version N, or one table at N "
        "(repeatable)",
    )
    sql.add_argument(
        "--delta-spark", action="store_true", help="read with delta-spark (cluster with Delta jars)"
    )
    sql.set_defaults(handler=_sql)

    serve = commands.add_parser(
        "serve",
        help="answer tenants' SQL over HTTP, each with its own API key (docs/querying.md)",
    )
    add_settings_flags(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--master", help="Spark master, as for run (default local[2])")
    serve.add_argument(
        "--metrics-port",
        dest="query_metrics_port",
        type=int,
        help="serve Prometheus metrics on this port, apart from --port (query.metrics_port; "
        "0: any free port)",
    )
    serve.set_defaults(handler=_serve)


def _sql(args: argparse.Namespace) -> int:
    from pyspark.errors import AnalysisException

    from infra.cli.sql_shell import (
        SqlOptionError,
        parse_versions,
        print_frame,
        render_frame,
        run_prompt,
    )
    from storage.lake.delta_lake import DeltaLake
    from storage.query.query_service import QueryError, check_statement_length, run_within_limits
    from storage.query.scoped_sql import TenantSql
    from storage.query.sql_guard import QueryRefused
    from storage.query.sql_views import LakeNotWrittenError, TableVersionError, register_views
    from streaming.pipeline.spark_session import build_spark

    settings = settings_from(args)
    # A tenant's statements get the query service's limits, as over HTTP.
    limits: QueryLimits | None = None
    try:
        versions = parse_versions(args.as_of_version)
        if args.tenant is not None:
            limits = _tenant_limits(settings, args.tenant)
    except SqlOptionError as error:
        print(f"{error}", file=sys.stderr)
        return ExitCode.REFUSED
    # sqlglot logs a warning for every statement it can only read as a bare command; the guard
    # refuses those with its own message.
    logging.getLogger("sqlglot").setLevel(logging.ERROR)
    spark = build_spark("tenant-windows-sql", shuffle_partitions=settings.stream.shuffle_partitions)
    lake = DeltaLake.from_settings(settings.lake)
    run_query: Callable[[str], DataFrame]
    try:
        if args.tenant is None:
            register_views(spark, lake, None, args.delta_spark, versions)
            run_query = spark.sql
        else:
            run_query = TenantSql.open(spark, lake, args.tenant, args.delta_spark, versions).query
    except (TableVersionError, LakeNotWrittenError) as error:
        print(f"{error}", file=sys.stderr)
        return ExitCode.REFUSED

    def run_statement(statement: str) -> bool:
        try:
            if limits is None:
                print_frame(run_query(statement), args.format, args.limit)
                return True
            check_statement_length(statement, limits)
            frame = run_query(statement)
            rows = min(args.limit, limits.max_result_rows)
            text = run_within_limits(
                spark, args.tenant, frame, limits, lambda: render_frame(frame, args.format, rows)
            )
            print(text, end="")
        except QueryRefused as error:
            print(f"refused: {error.reason}", file=sys.stderr)
            return False
        except AnalysisException as error:
            print(f"query failed: {str(error).splitlines()[0]}", file=sys.stderr)
            return False
        except QueryError as error:
            print(f"{error.code}: {error.message}", file=sys.stderr)
            return False
        return True

    if args.query is not None:
        return ExitCode.OK if run_statement(args.query) else ExitCode.REFUSED
    scope = f"[{args.tenant}]" if args.tenant else ""
    return run_prompt(run_statement, f"tenant-windows{scope}> ", sys.stdin, sys.stdout)


def _tenant_limits(settings: AppSettings, tenant: str) -> QueryLimits:
    """The limits of a `--tenant`, which must be a tenant id that the registry knows."""
    from infra.cli.sql_shell import SqlOptionError

    if re.fullmatch(ID_PATTERN, tenant) is None:
        raise SqlOptionError(
            f"--tenant {tenant!r} is not a tenant id (lower-case letters, digits, '_' and '-', "
            "at most 63, starting with a letter or digit)"
        )
    config = load_registry(settings.conf_dir).tenants.get(tenant)
    if config is None:
        raise SqlOptionError(f"--tenant {tenant!r}: no such tenant in {settings.conf_dir}")
    return settings.query.with_overrides(config.query)


def _serve(args: argparse.Namespace) -> int:
    from infra.service.query_api import serve

    # sqlglot logs a warning for every statement it can only read as a bare command; the guard
    # refuses those with its own message.
    logging.getLogger("sqlglot").setLevel(logging.ERROR)
    serve(settings_from(args), args.host, args.port, args.master)
    return ExitCode.OK
