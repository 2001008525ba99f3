"""`tenants ...`: validate the config, offboard, purge and reprocess a tenant, its API keys."""

from __future__ import annotations

import argparse
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from infra.cli.command_context import (
    CONF_DIR,
    LAKE_ROOT,
    STREAM_NAME,
    add_settings_flags,
    cluster_conf,
    settings_from,
)
from infra.cli.exit_codes import ExitCode
from tenants.api_keys import ApiKeyError, issue_key, revoke_key
from tenants.conf_reader import load_registry, load_tenant
from tenants.models import ID_PATTERN, parse_duration_ms


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`tenants validate|offboard|purge|reprocess|issue-key|revoke-key`."""
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
    add_settings_flags(offboard, CONF_DIR, LAKE_ROOT)
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
    add_settings_flags(purge, CONF_DIR, LAKE_ROOT)
    purge.add_argument("--dry-run", action="store_true", help="say what would go; change nothing")
    purge.set_defaults(handler=_purge)
    reprocess = tenant_commands.add_parser(
        "reprocess",
        help="recompute a tenant's windows in a time range with its current rules, from the "
        "records the lake holds; runs beside the stream",
    )
    reprocess.add_argument("tenant", help="the tenant id")
    add_settings_flags(reprocess, CONF_DIR, LAKE_ROOT, STREAM_NAME)
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
    reprocess.add_argument(
        "--master", help="Spark master, as for run (default local[N]: two task slots a core)"
    )
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


def _validate(args: argparse.Namespace) -> int:
    from tenants.tenant_lists import TenantDirectory

    registry = load_registry(args.conf)
    # Counted without building a config per tenant: a million listed tenants share a few.
    routes = sum(len(registry.source_ids(tenant)) for tenant in registry.tenants)
    tenants = f"{len(registry.tenants)} tenants"
    directory = registry.tenants
    if isinstance(directory, TenantDirectory):
        tenants += (
            f" ({len(directory.listed)} from tenant lists, {len(directory.rule_sets)} rule sets)"
        )
    print(f"{args.conf}: {tenants}, {len(registry.sources)} sources, {routes} routes: OK")
    return ExitCode.OK


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
        return ExitCode.OK
    lake = DeltaLake.from_settings(settings.lake)
    deadline_s = time.monotonic() + parse_duration_ms(args.timeout) / 1000
    while True:
        open_sources = sources_with_state(lake, done.tenant_id)
        if not open_sources:
            print(f"every key of {done.tenant_id!r} is closed")
            return ExitCode.OK
        if time.monotonic() >= deadline_s:
            print(
                f"still open after {args.timeout}: {', '.join(open_sources)} (is the stream "
                "running? with --available-now a bucket wakes only in batches with data)",
                file=sys.stderr,
            )
            return ExitCode.FAILED
        time.sleep(1.0)


def _purge(args: argparse.Namespace) -> int:
    from storage.lake.delta_lake import DeltaLake
    from storage.upkeep.key_lifecycle import sources_with_state
    from storage.upkeep.purge import purge_tenant

    settings = settings_from(args)
    tenant = args.tenant
    if not re.fullmatch(ID_PATTERN, tenant):
        print(f"not a tenant id: {tenant!r} (ids match {ID_PATTERN})", file=sys.stderr)
        return ExitCode.REFUSED
    if load_tenant(settings.conf_dir, tenant) is not None:
        print(
            f"tenant {tenant!r} is still configured in {settings.conf_dir}: offboard it first "
            f"(tenant-windows tenants offboard {tenant} --wait)",
            file=sys.stderr,
        )
        return ExitCode.REFUSED
    lake = DeltaLake.from_settings(settings.lake)
    open_sources = sources_with_state(lake, tenant)
    if open_sources:
        print(
            f"tenant {tenant!r} still has open windows in {', '.join(open_sources)}: the stream "
            "would write their final panes after the purge; wait until offboarding has closed "
            f"them (tenant-windows tenants offboard {tenant} --wait)",
            file=sys.stderr,
        )
        return ExitCode.REFUSED
    purged = purge_tenant(lake, tenant, args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for table in purged:
        print(f"{table.table}: {verb} {table.rows} rows of {tenant!r}, {len(table.files)} files")
    if not args.dry_run:
        print(
            f"No table version and no data file holds a row of {tenant!r} now; time travel to a "
            "version from before the purge fails on a missing file."
        )
    return ExitCode.OK


def _reprocess(args: argparse.Namespace) -> int:
    from storage.lake.delta_lake import DeltaLake
    from streaming.pipeline.spark_session import build_spark
    from streaming.repair.replay import NO_TIME
    from streaming.repair.reprocess import ReprocessError, reprocess_tenant

    settings = settings_from(args)
    try:
        since_ms = _time_ms(args.since) if args.since else 0
        until_ms = _time_ms(args.until) if args.until else NO_TIME
    except ValueError as error:
        print(
            f"--since/--until: {error} (an ISO 8601 time, e.g. 2026-11-01T00:00Z)", file=sys.stderr
        )
        return ExitCode.REFUSED
    if until_ms <= since_ms:
        print("--until must be after --since", file=sys.stderr)
        return ExitCode.REFUSED
    spark = build_spark(
        "tenant-windows-reprocess",
        args.master,
        settings.stream.shuffle_partitions,
        cluster_conf(args.master),
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
        return ExitCode.REFUSED
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
    return ExitCode.OK


def _iso_ms(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def _issue_key(args: argparse.Namespace) -> int:
    if load_tenant(args.conf, args.tenant) is None:
        raise ApiKeyError(f"tenant {args.tenant!r} is not configured in {args.conf}")
    # The key alone on stdout, so `KEY=$(tenant-windows tenants issue-key T)` takes it.
    print(issue_key(args.conf, args.tenant, args.name))
    return ExitCode.OK


def _revoke_key(args: argparse.Namespace) -> int:
    revoke_key(args.conf, args.tenant, args.name)
    print(f"key {args.name!r} of tenant {args.tenant!r} revoked", file=sys.stderr)
    return ExitCode.OK


def _time_ms(text: str) -> int:
    """An ISO 8601 time (UTC when it names no zone) as ms since the epoch."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
