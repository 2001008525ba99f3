"""`vacuum`, `retain`, `optimize` and `migrate-layout`: keeping the lake in shape."""

from __future__ import annotations

import argparse
import sys
import time

from infra.cli.command_context import (
    CONF_DIR,
    LAKE_ROOT,
    STREAM_NAME,
    add_settings_flags,
    settings_from,
)
from infra.cli.exit_codes import ExitCode
from tenants.models import parse_duration_ms
from tenants.registry import load_registry


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`vacuum`, `retain`, `optimize`, `migrate-layout`."""
    vacuum = commands.add_parser(
        "vacuum", help="delete data files no longer referenced (crashed attempts, old versions)"
    )
    add_settings_flags(vacuum, LAKE_ROOT)
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
    add_settings_flags(retain, CONF_DIR, LAKE_ROOT)
    retain.add_argument("--dry-run", action="store_true", help="count the rows, delete nothing")
    retain.set_defaults(handler=_retain)

    optimize = commands.add_parser(
        "optimize", help="compact small files and checkpoint every table's log"
    )
    add_settings_flags(optimize, LAKE_ROOT)
    optimize.add_argument(
        "--target-file-mb", type=int, default=None, help="size of compacted files (default: 100)"
    )
    optimize.set_defaults(handler=_optimize)

    migrate = commands.add_parser(
        "migrate-layout",
        help="convert a lake written before staged writes (partitioned by tenant), once",
    )
    add_settings_flags(migrate, LAKE_ROOT, STREAM_NAME)
    migrate.add_argument("--dry-run", action="store_true", help="list the tables, change nothing")
    migrate.set_defaults(handler=_migrate_layout)


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
    return ExitCode.OK


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
    return ExitCode.OK


def _optimize(args: argparse.Namespace) -> int:
    from storage.lake.delta_lake import DeltaLake

    settings = settings_from(args)
    target = None if args.target_file_mb is None else args.target_file_mb * 1_048_576
    for table, done in DeltaLake.from_settings(settings.lake).optimize(target).items():
        print(
            f"{table}: {done.files_removed} files compacted into {done.files_added}, "
            f"version {done.version}"
        )
    return ExitCode.OK


def _migrate_layout(args: argparse.Namespace) -> int:
    from storage.lake.delta_lake import DeltaLake
    from storage.lake.writer_lease import read_lease

    settings = settings_from(args)
    lake = DeltaLake.from_settings(settings.lake)
    outdated = lake.outdated_tables()
    if not outdated:
        print(f"every table under {lake.root} is in the current layout: nothing to do")
        return ExitCode.OK
    lease = read_lease(lake, settings.stream.name, settings.stream.lease_ttl_ms)
    if lease is not None and lease.state == "held" and not args.dry_run:
        print(
            f"not migrating: stream {settings.stream.name!r} is running (its lease is held by "
            f"{lease.instance_id}); stop it first",
            file=sys.stderr,
        )
        return ExitCode.REFUSED
    for spec in outdated:
        if args.dry_run:
            print(f"{spec.name}: would be rewritten in the staged layout")
            continue
        version = lake.migrate_layout(spec)
        print(f"{spec.name}: rewritten in the staged layout, version {version}")
    return ExitCode.OK
