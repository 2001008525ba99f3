"""`sql` and `serve`: SQL over the lake, from the command line or over HTTP."""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from infra.cli.command_context import (
    CONF_DIR,
    LAKE_ROOT,
    QUERY_METRICS_PORT,
    add_settings_flags,
    settings_from,
)
from infra.cli.exit_codes import ExitCode
from tenants.conf_reader import load_tenant
from tenants.models import ID_PATTERN, QueryLimits
from tenants.settings import AppSettings

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from sqlglot import exp

    from storage.lake.delta_lake import DeltaLake
    from storage.lake.table_files import TableFiles
    from storage.query.local_sql import LocalSql


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`sql`, `serve`, `serve-jdbc`."""
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
    add_settings_flags(sql, CONF_DIR, LAKE_ROOT)
    sql.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default="table",
        help="output format (default table)",
    )
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
    add_settings_flags(serve, CONF_DIR, LAKE_ROOT, QUERY_METRICS_PORT)
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    serve.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    serve.add_argument(
        "--master", help="Spark master, as for run (default local[N]: two task slots a core)"
    )
    serve.add_argument(
        "--pg-port",
        type=int,
        help="also answer tenants over the Postgres protocol on this port: user = tenant id, "
        "password = an API key, database lake (docs/querying.md)",
    )
    serve.add_argument("--pg-host", default="127.0.0.1", help="the Postgres door's address")
    serve.add_argument(
        "--pg-cert-file", type=Path, help="TLS certificate (PEM) for the Postgres door"
    )
    serve.add_argument("--pg-key-file", type=Path, help="its private key (PEM)")
    serve.set_defaults(handler=_serve)

    serve_jdbc = commands.add_parser(
        "serve-jdbc",
        help="Spark's JDBC/ODBC (thrift) server over every tenant's views, for the operator "
        "(loopback only; docs/querying.md)",
    )
    add_settings_flags(serve_jdbc, LAKE_ROOT)
    serve_jdbc.add_argument("--host", default="127.0.0.1", help="a loopback address")
    serve_jdbc.add_argument(
        "--port", type=int, default=10000, help="port to listen on (default 10000)"
    )
    serve_jdbc.add_argument(
        "--master", help="Spark master, as for run (default local[N]: two task slots a core)"
    )
    serve_jdbc.set_defaults(handler=_serve_jdbc)


def _sql(args: argparse.Namespace) -> int:
    """Everything that can be checked without Spark is checked first (the tenant, the statement
    against the guard, the lake), and a statement the in-process engine answers as Spark would
    is answered without a JVM; Spark starts only for the rest."""
    from infra.cli.sql_shell import SqlOptionError, parse_versions, run_prompt

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
    try:
        # A single statement is checked before the lake: refusing it needs no table.
        tree = None if args.query is None else _checked(args.query, limits)
        # delta-spark reads the lake its own way: Spark checks it.
        lake, tables = _open_lake(settings, args.tenant, versions, not args.delta_spark)
    except _Refusal as refusal:
        print(refusal.line, file=sys.stderr)
        return ExitCode.REFUSED
    in_process = None
    if tables is not None and settings.query.local_engine:
        in_process = _InProcess(args, settings, lake, tables, limits)
    on_spark = _OnSpark(args, settings, lake, versions, limits)
    if args.delta_spark and not on_spark.open():
        return ExitCode.REFUSED

    def run_checked(statement: str, tree: exp.Query | None) -> bool:
        if in_process is not None and tree is not None:
            answered = in_process.answer(tree)
            if isinstance(answered, _Refusal):
                print(answered.line, file=sys.stderr)
                return False
            if answered is not None:
                print(answered, end="")
                return True
        return on_spark.run(statement, tree)

    def run_statement(statement: str) -> bool:
        try:
            tree = _checked(statement, limits)
        except _Refusal as refusal:
            print(refusal.line, file=sys.stderr)
            return False
        return run_checked(statement, tree)

    if args.query is not None:
        return ExitCode.OK if run_checked(args.query, tree) else ExitCode.REFUSED
    scope = f"[{args.tenant}]" if args.tenant else ""
    return run_prompt(run_statement, f"tenant-windows{scope}> ", sys.stdin, sys.stdout)


def _open_lake(
    settings: AppSettings, tenant: str | None, versions: dict[str, int], open_tables: bool
) -> tuple[DeltaLake, Mapping[str, DeltaTable | None] | None]:
    """The lake, and with `open_tables` its tables for the in-process engine: with `versions`
    (time travel), every table the views read at the version asked for, checked now as Spark's
    views check them; without, none yet (`_FilesOnFirstRead` opens those a statement names).
    `_Refusal` with the line Spark's views give when the lake has no such table or version."""
    from storage.lake.tables import ALL_TABLES, LAKE_TABLES
    from storage.query.view_catalog import (
        LakeNotWrittenError,
        TableVersionError,
        open_view_tables,
        unwritten_local_lake,
    )

    specs = ALL_TABLES if tenant is not None else LAKE_TABLES
    # A local root without the first table's log: said before loading delta-rs and pyarrow.
    unwritten = unwritten_local_lake(settings.lake.root, specs) if open_tables else None
    if unwritten is not None:
        raise _Refusal(str(unwritten))
    from storage.lake.delta_lake import DeltaLake

    lake = DeltaLake.from_settings(settings.lake)
    if not open_tables:
        return lake, None
    if not versions:
        return lake, {}
    try:
        return lake, open_view_tables(lake, specs, versions)
    except (TableVersionError, LakeNotWrittenError) as error:
        raise _Refusal(str(error)) from None


class _Refusal(Exception):  # noqa: N818 - an outcome, printed as one line
    """A statement refused or stopped before it printed anything: its one line on stderr."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


def _checked(statement: str, limits: QueryLimits | None) -> exp.Query | None:
    """The statement's tree, if the guard accepts it. A tenant's statement must pass its length
    limit and the guard (`_Refusal` in the words Spark's path uses); an operator's statement
    the guard does not accept is any Spark SQL, left to Spark (None), unless it names a view
    that does not exist. A column that no view has is refused here, with the names it could
    mean (`unknown_names`), before Spark starts."""
    from storage.lake.tables import ALL_TABLES, LAKE_TABLES
    from storage.query.query_errors import QueryError, check_statement_length
    from storage.query.sql_guard import QueryRefused, UnknownRelation, check_query
    from storage.query.unknown_names import UnknownColumnError, check_columns
    from storage.query.view_catalog import OPERATOR_VIEW_NAMES, TENANT_VIEW_NAMES, view_columns

    try:
        if limits is None:
            try:
                tree = check_query(statement, OPERATOR_VIEW_NAMES)
            except UnknownRelation as unknown:
                # Spark has no such view either: said now, not after Spark has started.
                raise _Refusal(f"query failed: {unknown.reason}") from None
            except QueryRefused:
                return None
        else:
            check_statement_length(statement, limits)
            tree = check_query(statement, TENANT_VIEW_NAMES)
        check_columns(tree, view_columns(ALL_TABLES if limits is not None else LAKE_TABLES))
        return tree
    except QueryError as error:
        raise _Refusal(f"{error.code}: {error.message}") from None
    except QueryRefused as refused:
        raise _Refusal(f"refused: {refused.reason}") from None
    except UnknownColumnError as unknown:
        raise _Refusal(f"query failed: {unknown}") from None


@dataclass
class _InProcess:
    """Statements answered in this process (`storage.query.local_sql`), printed as Spark would
    print them (`storage.query.spark_text`), or left to Spark (None)."""

    args: argparse.Namespace
    settings: AppSettings
    lake: DeltaLake
    tables: Mapping[str, DeltaTable | None]
    limits: QueryLimits | None
    _engine: LocalSql = field(init=False)
    _files: _FilesOnFirstRead = field(init=False)

    def __post_init__(self) -> None:
        from storage.query.local_sql import LocalSql

        self._engine = LocalSql.of_settings(self.lake, self.settings.query)
        self._files = _FilesOnFirstRead(self.lake, self.tables, self.args.tenant)

    def answer(self, tree: exp.Query) -> str | _Refusal | None:
        from storage.query.local_sql import StatementTimeout
        from storage.query.query_errors import statement_timeout
        from storage.query.spark_text import NotPrintable, render_rows
        from storage.query.view_catalog import LakeNotWrittenError

        query = self.settings.query
        limits = self.limits or query  # the operator's bounds: the defaults
        rows = (
            self.args.limit if self.limits is None else min(self.args.limit, limits.max_result_rows)
        )
        try:
            answer = self._engine.answer(
                self.args.tenant,
                tree,
                self._files,
                limits.max_joins,
                rows + 1,  # one more than printed: the table format says there are more
                limits.statement_timeout_ms / 1000,
            )
        except LakeNotWrittenError as error:
            return _Refusal(str(error))
        except StatementTimeout:
            if self.limits is None:
                return None  # the operator's statement has no timeout on Spark
            timeout = statement_timeout(limits)
            return _Refusal(f"{timeout.code}: {timeout.message}")
        if answer is None:
            return None
        try:
            return render_rows(answer, self.args.format, rows)
        except NotPrintable:
            return None


class _FilesOnFirstRead(Mapping[str, "TableFiles | None"]):
    """Each table's files for the scope, listed when a statement first reads the table: a
    statement over `events` opens no other table. `tables`: the tables opened at the versions
    asked for (time travel); empty: each at its newest version, opened here, and for a tenant
    read from the log's checkpoint, that tenant's files only (`TableFiles.of_log`).
    `LakeNotWrittenError` for a table the lake does not have."""

    def __init__(
        self, lake: DeltaLake, tables: Mapping[str, DeltaTable | None], tenant: str | None
    ) -> None:
        from storage.lake.tables import ALL_TABLES, LAKE_TABLES

        self._lake = lake
        self._tables = tables
        self._tenant = tenant
        self._specs = {spec.name: spec for spec in (ALL_TABLES if tenant else LAKE_TABLES)}
        self._files: dict[str, TableFiles | None] = {}

    def __getitem__(self, name: str) -> TableFiles | None:
        if name not in self._files:
            self._files[name] = self._open(name)
        return self._files[name]

    def _open(self, name: str) -> TableFiles | None:
        from storage.lake.table_files import TableFiles

        if self._tables:
            table = self._tables[name]
            return None if table is None else TableFiles.of_table(table, only_tenant=self._tenant)
        spec = self._specs[name]
        if self._tenant is not None:
            files = TableFiles.of_log(
                self._lake.table_uri(spec),
                spec.storage_schema,
                self._lake.storage_options,
                only_tenant=self._tenant,
            )
            if files is not None:
                return files
        from deltalake.exceptions import TableNotFoundError

        from storage.lake.tables import DELIVERIES
        from storage.query.view_catalog import lake_not_written

        try:
            table = self._lake.open(spec)
        except TableNotFoundError:
            if spec is DELIVERIES:
                return None  # a lake from before notifications: an empty view
            raise lake_not_written(self._lake.root, spec) from None
        return TableFiles.of_table(table, only_tenant=self._tenant)

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)


@dataclass
class _OnSpark:
    """Spark's side of `sql`, as it always ran: started at the first statement that needs it."""

    args: argparse.Namespace
    settings: AppSettings
    lake: DeltaLake
    versions: dict[str, int]
    limits: QueryLimits | None
    _spark: SparkSession | None = None
    _query: Callable[[str], DataFrame] | None = None

    def open(self) -> bool:
        """Start Spark and register the views; False (with its line printed) if the lake does
        not have them."""
        from storage.query.query_service import leave_statement_errors_to_the_service
        from storage.query.scoped_sql import TenantSql
        from storage.query.spark_views import register_views
        from storage.query.view_catalog import LakeNotWrittenError, TableVersionError
        from streaming.pipeline.spark_session import build_spark

        shuffle_partitions = self.settings.stream.shuffle_partitions
        spark = build_spark("tenant-windows-sql", shuffle_partitions=shuffle_partitions)
        # A failed statement is the one line `run` prints, not PySpark's ERROR with Java frames.
        leave_statement_errors_to_the_service()
        try:
            if self.args.tenant is None:
                register_views(spark, self.lake, None, self.args.delta_spark, self.versions)
                self._query = spark.sql
            else:
                self._query = TenantSql.open(
                    spark, self.lake, self.args.tenant, self.args.delta_spark, self.versions
                ).query
        except (TableVersionError, LakeNotWrittenError) as error:
            print(f"{error}", file=sys.stderr)
            return False
        self._spark = spark
        return True

    def run(self, statement: str, tree: exp.Query | None) -> bool:
        """Run `statement` (`tree`: its guarded tree, whose rows come in `result_order`'s order
        where it gives none; None: any other Spark SQL of the operator's, as Spark orders it)."""
        from pyspark.errors import AnalysisException

        from infra.cli.sql_shell import print_frame, render_frame
        from storage.query.query_errors import QueryError
        from storage.query.query_service import run_within_limits, spark_frame_in_order
        from storage.query.sql_guard import QueryRefused

        if (self._query is None or self._spark is None) and not self.open():
            return False
        assert self._query is not None and self._spark is not None
        try:
            # Its length and the guard were checked before (`_checked`); TenantSql runs the
            # guard again, as the security boundary it is.
            frame = (
                self._query(statement)
                if tree is None
                else spark_frame_in_order(self._query, statement, tree)
            )
            if self.limits is None:
                print_frame(frame, self.args.format, self.args.limit)
                return True
            rows = min(self.args.limit, self.limits.max_result_rows)
            text = run_within_limits(
                self._spark,
                self.args.tenant,
                frame,
                self.limits,
                lambda: render_frame(frame, self.args.format, rows),
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


def _tenant_limits(settings: AppSettings, tenant: str) -> QueryLimits:
    """The limits of a `--tenant`, which must be a tenant id that the registry knows."""
    from infra.cli.sql_shell import SqlOptionError

    if re.fullmatch(ID_PATTERN, tenant) is None:
        raise SqlOptionError(
            f"--tenant {tenant!r} is not a tenant id (lower-case letters, digits, '_' and '-', "
            "at most 63, starting with a letter or digit)"
        )
    config = load_tenant(settings.conf_dir, tenant)
    if config is None:
        raise SqlOptionError(f"--tenant {tenant!r}: no such tenant in {settings.conf_dir}")
    return settings.query.with_overrides(config.query)


def _serve(args: argparse.Namespace) -> int:
    from infra.service.pg_door import PgDoorConfig
    from infra.service.query_api import serve

    # sqlglot logs a warning for every statement it can only read as a bare command; the guard
    # refuses those with its own message.
    logging.getLogger("sqlglot").setLevel(logging.ERROR)
    if (args.pg_cert_file is None) != (args.pg_key_file is None):
        print("--pg-cert-file and --pg-key-file: give both, or neither", file=sys.stderr)
        return ExitCode.REFUSED
    pg_door = (
        PgDoorConfig(args.pg_host, args.pg_port, args.pg_cert_file, args.pg_key_file)
        if args.pg_port is not None
        else None
    )
    serve(settings_from(args), args.host, args.port, args.master, pg_door)
    return ExitCode.OK


def _serve_jdbc(args: argparse.Namespace) -> int:
    import signal
    import threading

    from infra.service.jdbc_door import JdbcDoorError, check_loopback, serve_jdbc

    try:
        check_loopback(args.host)
    except JdbcDoorError as error:
        print(f"{error}", file=sys.stderr)
        return ExitCode.REFUSED
    # SIGTERM (`kill`, a service manager's stop) stops the door as Ctrl-C does: the session
    # stops and the thrift server's scratch folder (its metastore) goes. Killed by the signal's
    # default action, each stop left the folder behind.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        serve_jdbc(settings_from(args), args.host, args.port, args.master, stop)
    return ExitCode.OK
