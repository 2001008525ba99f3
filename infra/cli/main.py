"""`tenant-windows`: run the stream, validate tenants, query the output, produce load, demo."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltalake.exceptions import TableNotFoundError
from pyspark.sql import DataFrame

from storage.lake.delta_lake import LakeLayoutError
from storage.lake.s3_options import LakeUnavailableError
from storage.lake.writer_lease import StreamLeaseHeldError
from streaming.checkpoint.checkpoint_identity import CheckpointMismatchError
from streaming.hooks import NO_FAULTS, FaultHook
from streaming.kafka.client import KafkaSecurityError
from tenants.api_keys import ApiKeyError, issue_key, revoke_key
from tenants.models import ID_PATTERN, QueryLimits, parse_duration_ms
from tenants.registry import ConfigError, load_registry
from tenants.settings import AppSettings, load_settings

if TYPE_CHECKING:
    from infra.cli.progress_bar import ProgressBar

log = logging.getLogger("tenant_windows")
DEFAULT_APP_CONFIG = Path("conf/app.yaml")
# `produce` and `demo` run development-only parts: `infra.dev`, which the wheel does not ship, and
# for the demo's local broker the noida-db binary from the dev extras.
DEV_PACKAGE = "infra.dev"


class DevToolsMissingError(Exception):
    """A command needs a development-only part that this installation does not have."""


def require_dev_tools(command: str, *modules: str) -> None:
    """Stop `command` before it starts when `infra.dev` or another module it needs is missing."""
    missing = [name for name in (DEV_PACKAGE, *modules) if importlib.util.find_spec(name) is None]
    if missing:
        raise DevToolsMissingError(
            f"`tenant-windows {command}` needs the development tools, which are not in the wheel "
            f"(missing here: {', '.join(missing)}); from a source checkout, run "
            "`pip install -e '.[dev]'`"
        )


def main(argv: Sequence[str] | None = None, fault_hook: FaultHook = NO_FAULTS) -> int:
    """Parse `argv` and run its command; `fault_hook` is for the recovery tests."""
    parser = _parser()
    args = parser.parse_args(argv)
    args.fault_hook = fault_hook
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for chatty in ("py4j", "kafka"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        result: int = args.handler(args)
        return result
    except ConfigError as error:
        print(f"invalid config:\n{error}", file=sys.stderr)
        return 2
    except CheckpointMismatchError as error:
        print(f"refusing the checkpoint: {error}", file=sys.stderr)
        return 2
    except (StreamLeaseHeldError, LakeLayoutError) as error:
        print(f"not starting: {error}", file=sys.stderr)
        return 2
    except LakeUnavailableError as error:
        print(f"{error}", file=sys.stderr)
        return 1
    except DevToolsMissingError as error:
        print(f"{error}", file=sys.stderr)
        return 2
    except ApiKeyError as error:
        print(f"{error}", file=sys.stderr)
        return 2
    except KafkaSecurityError as error:
        print(f"not starting: {error}", file=sys.stderr)
        return 2
    except TableNotFoundError as error:
        # delta-rs adds a Rust error chain below the one line that says which table.
        print(
            f"{str(error).splitlines()[0]}: is the lake root (--lake-root, lake.root) the one "
            "the stream writes, and has it started once?",
            file=sys.stderr,
        )
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tenant-windows", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run the stream (continuously, or --available-now)")
    _settings_options(run)
    run.add_argument(
        "--available-now", action="store_true", help="process what is in the topic, then exit"
    )
    run.add_argument(
        "--master",
        help="Spark master; default local[2] outside spark-submit. A cluster master "
        "(spark://, yarn, k8s://) gets the code and executor dependencies shipped",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics on this port (stream.metrics_port; 0: any free port)",
    )
    run.set_defaults(handler=_run)

    status = commands.add_parser(
        "status",
        help="per-key watermarks and counters, Kafka lag, the last batch, the writer lease "
        "(reads only: works while the stream runs)",
    )
    _settings_options(status)
    status.add_argument("--format", choices=["table", "json"], default="table")
    status.set_defaults(handler=_status)

    config = commands.add_parser("config", help="the config files themselves")
    config_commands = config.add_subparsers(required=True, metavar="ACTION")
    schema = config_commands.add_parser(
        "schema",
        help="write the JSON Schemas of app.yaml, sources.yaml and tenants/*.yaml "
        "to CONF/schema/, for editors",
    )
    schema.add_argument("--conf", type=Path, default=Path("conf"), help="config directory")
    schema.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a schema is stale"
    )
    schema.set_defaults(handler=_config_schema)

    tenants = commands.add_parser("tenants", help="tenant config")
    tenant_commands = tenants.add_subparsers(required=True, metavar="ACTION")
    validate = tenant_commands.add_parser("validate", help="check every file under the conf dir")
    validate.add_argument("--conf", type=Path, default=Path("conf"), help="config directory")
    validate.set_defaults(handler=_validate)
    offboard = tenant_commands.add_parser(
        "offboard",
        help="remove a tenant: the stream closes its windows and quarantines its later records",
    )
    offboard.add_argument("tenant", help="the tenant id")
    _settings_options(offboard)
    offboard.add_argument(
        "--wait",
        action="store_true",
        help="wait until tenant_status shows every key of the tenant closed",
    )
    offboard.add_argument("--timeout", default="5m", help="how long --wait waits at most")
    offboard.set_defaults(handler=_offboard)
    purge = tenant_commands.add_parser(
        "purge",
        help="erase every row of an offboarded tenant from every table, and the files that "
        "held them",
    )
    purge.add_argument("tenant", help="the tenant id")
    _settings_options(purge)
    purge.add_argument("--dry-run", action="store_true", help="say what would go; change nothing")
    purge.set_defaults(handler=_purge)
    reprocess = tenant_commands.add_parser(
        "reprocess",
        help="recompute a tenant's windows in a time range with its current rules, from the "
        "records the lake holds; runs beside the stream",
    )
    reprocess.add_argument("tenant", help="the tenant id")
    _settings_options(reprocess)
    reprocess.add_argument(
        "--since", help="windows starting at or after this ISO 8601 time (UTC if no zone)"
    )
    reprocess.add_argument(
        "--until",
        help="windows ending by this ISO 8601 time (default: up to the oldest open window)",
    )
    reprocess.add_argument(
        "--dry-run", action="store_true", help="say what would change; write nothing"
    )
    reprocess.add_argument("--master", help="Spark master, as for run (default local[2])")
    reprocess.set_defaults(handler=_reprocess)
    issue_key = tenant_commands.add_parser(
        "issue-key",
        help="print a new API key for the tenant's queries; only its salted hash is kept",
    )
    issue_key.add_argument("tenant", help="the tenant id")
    issue_key.add_argument("--name", help="what the key is called (default key-N)")
    issue_key.add_argument("--conf", type=Path, default=Path("conf"), help="config directory")
    issue_key.set_defaults(handler=_issue_key)
    revoke_key = tenant_commands.add_parser("revoke-key", help="revoke a tenant's API key")
    revoke_key.add_argument("tenant", help="the tenant id")
    revoke_key.add_argument("name", help="the key's name")
    revoke_key.add_argument("--conf", type=Path, default=Path("conf"), help="config directory")
    revoke_key.set_defaults(handler=_revoke_key)

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
    _settings_options(sql)
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
    _settings_options(serve)
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

    produce = commands.add_parser("produce", help="produce sample multi-tenant load")
    _settings_options(produce)
    produce.add_argument("--tenants", default="acme,globex,initech")
    produce.add_argument("--sources", default="web,billing")
    produce.add_argument("--count", type=int, default=6000)
    produce.add_argument(
        "--rate", type=float, default=None, help="records per second (default: as fast as possible)"
    )
    produce.add_argument("--jitter", default="5s", help="out-of-orderness of event times")
    produce.add_argument("--late-share", type=float, default=0.02)
    produce.add_argument("--malformed-share", type=float, default=0.01)
    produce.add_argument("--ahead", action="append", default=[], metavar="TENANT=DURATION")
    produce.add_argument("--seed", type=int, default=7)
    produce.set_defaults(handler=_produce)

    vacuum = commands.add_parser(
        "vacuum", help="delete data files no longer referenced (crashed attempts, old versions)"
    )
    _settings_options(vacuum)
    vacuum.add_argument(
        "--retention", default="7d", help="keep files referenced by versions this recent"
    )
    vacuum.add_argument("--dry-run", action="store_true", help="list the files, delete nothing")
    vacuum.set_defaults(handler=_vacuum)

    retain = commands.add_parser(
        "retain",
        help="delete rows of windows that ended before their tenant's retention "
        "(lake.default_retention, or a tenant's retention)",
    )
    _settings_options(retain)
    retain.add_argument("--dry-run", action="store_true", help="count the rows, delete nothing")
    retain.set_defaults(handler=_retain)

    optimize = commands.add_parser(
        "optimize", help="compact small files and checkpoint every table's log"
    )
    _settings_options(optimize)
    optimize.add_argument(
        "--target-file-mb", type=int, default=None, help="size of compacted files (default: 100)"
    )
    optimize.set_defaults(handler=_optimize)

    migrate = commands.add_parser(
        "migrate-layout",
        help="convert a lake written before staged writes (partitioned by tenant), once",
    )
    _settings_options(migrate)
    migrate.add_argument("--dry-run", action="store_true", help="list the tables, change nothing")
    migrate.set_defaults(handler=_migrate_layout)

    _notify_parser(commands)

    demo = commands.add_parser(
        "demo", help="local broker + sample load + stream + summary, then stop"
    )
    demo.add_argument("--workdir", type=Path, default=Path("data/demo"))
    demo.add_argument("--count", type=int, default=12_000)
    demo.set_defaults(handler=_demo)
    return parser


def _settings_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--app-config", type=Path, default=DEFAULT_APP_CONFIG)
    parser.add_argument("--conf", dest="conf_dir", type=Path, help="tenant config directory")
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--topic")
    parser.add_argument("--lake-root")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--trigger-interval", help="e.g. 5s")
    parser.add_argument("--max-offsets-per-trigger", type=int)
    parser.add_argument("--starting-offsets", help="earliest, latest or Spark's JSON form")
    parser.add_argument("--stream-name")


def settings_from(args: argparse.Namespace) -> AppSettings:
    overrides: dict[str, Any] = {
        "conf_dir": args.conf_dir,
        "kafka.bootstrap_servers": args.bootstrap_servers,
        "kafka.topic": args.topic,
        "kafka.max_offsets_per_trigger": args.max_offsets_per_trigger,
        "kafka.starting_offsets": args.starting_offsets,
        "lake.root": args.lake_root,
        "stream.checkpoint_dir": args.checkpoint_dir,
        "stream.trigger_interval": args.trigger_interval,
        "stream.name": args.stream_name,
        "stream.metrics_port": getattr(args, "metrics_port", None),
        # `serve --metrics-port`: the query service's endpoint, not the stream's.
        "query.metrics_port": getattr(args, "query_metrics_port", None),
    }
    app_file = args.app_config if args.app_config.exists() else None
    return load_settings(app_file, overrides=overrides)


def _config_schema(args: argparse.Namespace) -> int:
    from tenants.json_schema import SCHEMA_DIR, stale_schemas, write_schemas

    schema_dir = args.conf / SCHEMA_DIR
    if args.check:
        stale = stale_schemas(schema_dir)
        for path in stale:
            print(f"{path} is stale: run `tenant-windows config schema --conf {args.conf}`")
        return 1 if stale else 0
    for path in write_schemas(schema_dir):
        print(f"wrote {path}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    registry = load_registry(args.conf)
    routes = sum(len(tenant.sources) for tenant in registry.tenants.values())
    print(
        f"{args.conf}: {len(registry.tenants)} tenants, {len(registry.sources)} sources, "
        f"{routes} routes: OK"
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    from infra.service.query_api import serve

    # sqlglot logs a warning for every statement it can only read as a bare command; the guard
    # refuses those with its own message.
    logging.getLogger("sqlglot").setLevel(logging.ERROR)
    serve(settings_from(args), args.host, args.port, args.master)
    return 0


def _issue_key(args: argparse.Namespace) -> int:
    if not load_registry(args.conf).knows_tenant(args.tenant):
        raise ApiKeyError(f"tenant {args.tenant!r} is not configured in {args.conf}")
    # The key alone on stdout, so `KEY=$(tenant-windows tenants issue-key T)` takes it.
    print(issue_key(args.conf, args.tenant, args.name))
    return 0


def _revoke_key(args: argparse.Namespace) -> int:
    revoke_key(args.conf, args.tenant, args.name)
    print(f"key {args.name!r} of tenant {args.tenant!r} revoked", file=sys.stderr)
    return 0


def _retain(args: argparse.Namespace) -> int:
    from storage.lake.delta_lake import DeltaLake
    from storage.upkeep.retention import (
        TenantRetention,
        apply_retention,
        plan_cuts,
        tenant_retentions,
    )
    from streaming.observe.stream_status import tenant_watermarks

    settings = settings_from(args)
    registry = load_registry(settings.conf_dir)
    lake = DeltaLake.from_settings(settings.lake)
    default = settings.lake.default_retention_ms
    tenants = tenant_retentions(registry, default, tenant_watermarks(lake, registry))
    now_ms = time.time_ns() // 1_000_000
    cuts = plan_cuts(tenants, TenantRetention(default), now_ms)
    deleted = apply_retention(lake, cuts, args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    for table, rows in deleted.items():
        print(f"{table}: {verb} {rows} rows")
    if not args.dry_run:
        print("Their files go at the next `tenant-windows vacuum`.")
    return 0


def _purge(args: argparse.Namespace) -> int:
    from storage.lake.delta_lake import DeltaLake
    from storage.upkeep.key_lifecycle import sources_with_state
    from storage.upkeep.purge import purge_tenant

    settings = settings_from(args)
    tenant = args.tenant
    if not re.fullmatch(ID_PATTERN, tenant):
        print(f"not a tenant id: {tenant!r} (ids match {ID_PATTERN})", file=sys.stderr)
        return 2
    if load_registry(settings.conf_dir).knows_tenant(tenant):
        print(
            f"tenant {tenant!r} is still configured in {settings.conf_dir}: offboard it first "
            f"(tenant-windows tenants offboard {tenant} --wait)",
            file=sys.stderr,
        )
        return 2
    lake = DeltaLake.from_settings(settings.lake)
    open_sources = sources_with_state(lake, tenant)
    if open_sources:
        print(
            f"tenant {tenant!r} still has open windows in {', '.join(open_sources)}: the stream "
            "would write their final panes after the purge; wait until offboarding has closed "
            f"them (tenant-windows tenants offboard {tenant} --wait)",
            file=sys.stderr,
        )
        return 2
    purged = purge_tenant(lake, tenant, args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for table in purged:
        print(f"{table.table}: {verb} {table.rows} rows of {tenant!r}, {len(table.files)} files")
    if not args.dry_run:
        print(
            f"No table version and no data file holds a row of {tenant!r} now; time travel to a "
            "version from before the purge fails on a missing file."
        )
    return 0


def _reprocess(args: argparse.Namespace) -> int:
    from storage.lake.delta_lake import DeltaLake
    from streaming.pipeline.spark_session import build_spark
    from streaming.repair.replay import NO_TIME
    from streaming.repair.reprocess import ReprocessError, parse_time_ms, reprocess_tenant

    settings = settings_from(args)
    try:
        since_ms = parse_time_ms(args.since) if args.since else 0
        until_ms = parse_time_ms(args.until) if args.until else NO_TIME
    except ValueError as error:
        print(
            f"--since/--until: {error} (an ISO 8601 time, e.g. 2026-11-01T00:00Z)", file=sys.stderr
        )
        return 2
    if until_ms <= since_ms:
        print("--until must be after --since", file=sys.stderr)
        return 2
    spark = build_spark(
        "tenant-windows-reprocess",
        args.master,
        settings.stream.shuffle_partitions,
        _cluster_conf(args.master),
    )
    try:
        report = reprocess_tenant(
            spark,
            settings,
            DeltaLake.from_settings(settings.lake),
            args.tenant,
            since_ms,
            until_ms,
            args.dry_run,
            args.fault_hook,
        )
    except ReprocessError as error:
        print(f"not reprocessed: {error}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    if report.resumed:
        print(
            f"finished the interrupted run {report.run} of {args.tenant!r} from its plan; run "
            "the command again if the rules changed since"
        )
    verb = "would replace" if args.dry_run else "replaced"
    for table in report.tables:
        print(
            f"{table.table}: {verb} {table.rows_removed} rows with {table.rows_added} "
            f"({table.files_removed} files out, {table.files_added} in)"
        )
    for source, horizon_ms in sorted(report.horizons_ms.items()):
        if horizon_ms is not None and horizon_ms < until_ms:
            print(
                f"{args.tenant}/{source}: windows ending after {_iso_ms(horizon_ms)} are left "
                "as they are (still open in the stream or in the replay)"
            )
    if report.run is None and not args.dry_run:
        print("nothing changed: the current rules give the rows the tables hold")
    return 0


def _iso_ms(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def _cluster_conf(master: str | None) -> dict[str, str]:
    """What executors on other machines need: they have neither this checkout nor its venv."""
    from streaming.pipeline.spark_session import is_local_master

    if master is None or is_local_master(master):
        return {}
    from infra.cluster.ship import build_artifacts

    return build_artifacts().spark_conf()


def _offboard(args: argparse.Namespace) -> int:
    from storage.lake.delta_lake import DeltaLake
    from storage.upkeep.key_lifecycle import sources_with_state
    from tenants.offboard_config import offboard_tenant

    settings = settings_from(args)
    done = offboard_tenant(settings.conf_dir, args.tenant)
    recheck_s = settings.stream.config_recheck_interval_ms / 1000
    print(
        f"tenant {done.tenant_id!r} offboarded: {done.moved_from} moved to {done.moved_to}.\n"
        f"The running stream takes the change at its next micro-batch: records of "
        f"{done.tenant_id!r} go to quarantine as unknown_tenant, and within "
        f"config_recheck_interval ({recheck_s:g}s) each of its keys "
        f"({', '.join(done.sources)}) gets a final pane for every open window, a tenant_status "
        f"row with lifecycle 'offboarded', and no more state.\n"
        f"To onboard it again, move the file back to {done.moved_from}."
    )
    if not args.wait:
        return 0
    lake = DeltaLake.from_settings(settings.lake)
    deadline_s = time.monotonic() + parse_duration_ms(args.timeout) / 1000
    while True:
        open_sources = sources_with_state(lake, done.tenant_id)
        if not open_sources:
            print(f"every key of {done.tenant_id!r} is closed")
            return 0
        if time.monotonic() >= deadline_s:
            print(
                f"still open after {args.timeout}: {', '.join(open_sources)} (is the stream "
                "running? with --available-now a bucket wakes only in batches with data)",
                file=sys.stderr,
            )
            return 1
        time.sleep(1.0)


def _run(args: argparse.Namespace) -> int:
    from streaming.app import run_stream
    from streaming.kafka.client import KafkaSecurity, check_broker_security

    spark_conf = _cluster_conf(args.master)
    settings = settings_from(args)
    # Before Spark starts: a refused certificate or password is one line, not a query that
    # retries for the whole broker timeout.
    check_broker_security(settings.kafka.bootstrap_servers, KafkaSecurity.of(settings.kafka))
    bar = _progress_bar(settings) if args.available_now and sys.stderr.isatty() else None
    try:
        return run_stream(
            settings, args.master, args.available_now, args.fault_hook, spark_conf, on_batch=bar
        )
    finally:
        if bar is not None:
            bar.close()


def _progress_bar(settings: AppSettings) -> ProgressBar | None:
    from infra.cli.progress_bar import ProgressBar
    from streaming.observe.stream_status import backlog_records

    try:
        return ProgressBar(backlog_records(settings))
    except Exception as error:  # the stream reports an unreachable broker itself
        log.warning("no progress bar: the backlog could not be read (%s)", error)
        return None


def _status(args: argparse.Namespace) -> int:
    from infra.cli.status_view import render_json, render_table
    from streaming.observe.stream_status import gather_status

    # An unreachable broker is the Kafka lag section's one line, not kafka-python's retries.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    sections = gather_status(settings_from(args))
    print(render_json(sections) if args.format == "json" else render_table(sections), end="")
    if args.format == "json":
        print()
    return 0


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
        return 2
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
        return 2

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
        return 0 if run_statement(args.query) else 2
    scope = f"[{args.tenant}]" if args.tenant else ""
    return run_prompt(run_statement, f"tenant-windows{scope}> ", sys.stdin, sys.stdout)


def _tenant_limits(settings: AppSettings, tenant: str) -> QueryLimits:
    """The limits of a `--tenant`, which must be a tenant id that the registry knows."""
    from infra.cli.sql_shell import SqlOptionError
    from tenants.models import ID_PATTERN

    if re.fullmatch(ID_PATTERN, tenant) is None:
        raise SqlOptionError(
            f"--tenant {tenant!r} is not a tenant id (lower-case letters, digits, '_' and '-', "
            "at most 63, starting with a letter or digit)"
        )
    config = load_registry(settings.conf_dir).tenants.get(tenant)
    if config is None:
        raise SqlOptionError(f"--tenant {tenant!r}: no such tenant in {settings.conf_dir}")
    return settings.query.with_overrides(config.query)


def _produce(args: argparse.Namespace) -> int:
    require_dev_tools("produce")
    from infra.dev.load_generator import LoadSpec, generate, send
    from streaming.kafka.client import KafkaSecurity, check_broker_security

    settings = settings_from(args)
    check_broker_security(settings.kafka.bootstrap_servers, KafkaSecurity.of(settings.kafka))
    registry = load_registry(settings.conf_dir)
    ahead = {}
    for item in args.ahead:
        tenant, _, duration = item.partition("=")
        ahead[tenant] = parse_duration_ms(duration)
    spec = LoadSpec(
        tenants=tuple(args.tenants.split(",")),
        sources=tuple(args.sources.split(",")),
        count=args.count,
        jitter=args.jitter,
        late_share=args.late_share,
        malformed_share=args.malformed_share,
        ahead=ahead,
        seed=args.seed,
    )
    time_specs = {name: source.event_time for name, source in registry.sources.items()}
    sent = send(
        generate(spec, time_specs),
        settings.kafka.bootstrap_servers,
        settings.kafka.topic,
        args.rate,
        security=KafkaSecurity.of(settings.kafka),
    )
    print(json.dumps({"produced": sent, "topic": settings.kafka.topic}))
    return 0


def _vacuum(args: argparse.Namespace) -> int:
    from storage.lake.delta_lake import DeltaLake

    settings = settings_from(args)
    removed = DeltaLake.from_settings(settings.lake).vacuum(
        parse_duration_ms(args.retention), args.dry_run
    )
    verb = "would delete" if args.dry_run else "deleted"
    for table, files in removed.items():
        print(f"{table}: {verb} {len(files)} files")
        for name in files:
            print(f"  {name}")
    return 0


def _optimize(args: argparse.Namespace) -> int:
    from storage.lake.delta_lake import DeltaLake

    settings = settings_from(args)
    target = None if args.target_file_mb is None else args.target_file_mb * 1_048_576
    for table, done in DeltaLake.from_settings(settings.lake).optimize(target).items():
        print(
            f"{table}: {done.files_removed} files compacted into {done.files_added}, "
            f"version {done.version}"
        )
    return 0


def _migrate_layout(args: argparse.Namespace) -> int:
    from storage.lake.delta_lake import DeltaLake
    from storage.lake.writer_lease import read_lease

    settings = settings_from(args)
    lake = DeltaLake.from_settings(settings.lake)
    outdated = lake.outdated_tables()
    if not outdated:
        print(f"every table under {lake.root} is in the current layout: nothing to do")
        return 0
    lease = read_lease(lake, settings.stream.name, settings.stream.lease_ttl_ms)
    if lease is not None and lease.state == "held" and not args.dry_run:
        print(
            f"not migrating: stream {settings.stream.name!r} is running (its lease is held by "
            f"{lease.instance_id}); stop it first",
            file=sys.stderr,
        )
        return 2
    for spec in outdated:
        if args.dry_run:
            print(f"{spec.name}: would be rewritten in the staged layout")
            continue
        version = lake.migrate_layout(spec)
        print(f"{spec.name}: rewritten in the staged layout, version {version}")
    return 0


def _notify_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    notify = commands.add_parser("notify", help="pane notifications: dead letters, retry")
    actions = notify.add_subparsers(required=True, metavar="ACTION")
    retry = actions.add_parser(
        "retry", help="attempt dead-lettered deliveries again (same key and body)"
    )
    _settings_options(retry)
    retry.add_argument("--tenant", help="only this tenant's dead letters")
    retry.set_defaults(handler=_notify_retry)
    dead = actions.add_parser("dead-letters", help="dead-lettered deliveries per endpoint")
    _settings_options(dead)
    dead.set_defaults(handler=_notify_dead_letters)


def _notify_retry(args: argparse.Namespace) -> int:
    from storage.lake.delta_lake import DeltaLake
    from streaming.notify.notifier import retry_dead_letters

    settings = settings_from(args)
    report = retry_dead_letters(
        settings, DeltaLake.from_settings(settings.lake), args.tenant, args.fault_hook
    )
    print(json.dumps(dataclasses.asdict(report)))
    return 0 if report.dead_lettered == 0 else 1


def _notify_dead_letters(args: argparse.Namespace) -> int:
    from storage.lake.delivery_outbox import dead_letter_summary
    from storage.lake.delta_lake import DeltaLake

    settings = settings_from(args)
    summary = dead_letter_summary(DeltaLake.from_settings(settings.lake), settings.stream.name)
    for group in summary:
        print(json.dumps(dataclasses.asdict(group)))
    return 0


def _demo(args: argparse.Namespace) -> int:
    require_dev_tools("demo", "noida_db")
    from infra.dev.demo import run_demo

    return run_demo(args.workdir, args.count)


if __name__ == "__main__":
    sys.exit(main())
