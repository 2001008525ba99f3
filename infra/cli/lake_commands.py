"""`vacuum`, `retain`, `optimize` and `migrate-layout`: keeping the lake in shape."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from infra.cli.command_context import (
    CONF_DIR,
    LAKE_ROOT,
    STREAM_NAME,
    add_settings_flags,
    settings_from,
)
from infra.cli.exit_codes import ExitCode
from tenants.conf_reader import load_registry
from tenants.models import parse_duration_ms

if TYPE_CHECKING:
    from storage.upkeep.retention import CutReason


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`vacuum`, `retain`, `optimize`, `migrate-layout`."""
    vacuum = commands.add_parser(
        "vacuum", help="delete data files no longer referenced (crashed attempts, old versions)"
    )
    add_settings_flags(vacuum, LAKE_ROOT)
    vacuum.add_argument(
        "--retention",
        default=None,
        help="keep files referenced by versions this recent (default: lake.vacuum_retention)",
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
    retention_ms = (
        settings.lake.vacuum_retention_ms
        if args.retention is None
        else parse_duration_ms(args.retention)
    )
    removed = DeltaLake.from_settings(settings.lake).vacuum(retention_ms, args.dry_run)
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
        explain_cuts,
        plan_cuts,
        tenant_retentions,
    )
    from streaming.observe.stream_status import slowest_keys

    settings = settings_from(args)
    registry = load_registry(settings.conf_dir)
    lake = DeltaLake.from_settings(settings.lake)
    default = settings.lake.default_retention_ms
    tenants = tenant_retentions(registry, default, slowest_keys(lake, registry))
    now_ms = time.time_ns() // 1_000_000
    cuts = plan_cuts(tenants, TenantRetention(default), now_ms)
    reasons, kept = explain_cuts(cuts, tenants, now_ms)
    print(
        "A row goes when its window ended before its tenant's cut-off (quarantine: when it "
        "was ingested before that day):"
    )
    for reason in reasons:
        print(f"  {_cut_line(reason)}")
    if kept:
        print(f"  none for {_some(kept)}: retention null, kept until purged")
    if not reasons and not kept:
        print("  no tenant has a retention (lake.default_retention is null): nothing to delete")
    deleted = apply_retention(lake, cuts, args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    for table, rows in deleted.items():
        print(f"{table}: {verb} {rows} rows")
    if not args.dry_run:
        print("Their files go at the next `tenant-windows vacuum`.")
    return ExitCode.OK


def _cut_line(reason: CutReason) -> str:
    """`2026-10-28T09:00:00Z for acme, globex: ...why`, once per cut."""
    cut = reason.cut
    if cut.except_tenants is None:
        who = _some(reason.tenants)
    else:
        configured = f"{len(reason.tenants)} configured" if reason.tenants else "none configured"
        who = f"any tenant without a cut-off of its own ({configured})"
    why = []
    plain = len(reason.tenants) - len(reason.held_back)
    if plain and reason.retention_ms is not None:
        setting = "lake.default_retention" if cut.except_tenants is not None else "retention"
        why.append(f"now minus {setting} ({_duration(reason.retention_ms)})")
    elif plain:
        why.append("now minus each tenant's retention")
    slowest = reason.slowest
    if slowest is not None and slowest.watermark_ms is not None:
        key = f"{reason.held_back[0]}/{slowest.slowest_source or '?'}"
        lateness = (
            f" minus its allowed lateness {_duration(slowest.allowed_lateness_ms)}"
            if slowest.allowed_lateness_ms
            else ""
        )
        others = (
            f" (the slowest of the {len(reason.held_back)} tenants held back)"
            if len(reason.held_back) > 1
            else ""
        )
        why.append(
            f"held back to the watermark {_iso(slowest.watermark_ms)} of {key}{lateness}"
            f"{others}, not now minus retention ({_duration(slowest.retention_ms or 0)}): "
            "windows after it may still be open"
        )
    if not why:
        why.append("now minus lake.default_retention")
    return f"{_iso(cut.cutoff_ms)} for {who}: {'; '.join(why)}"


def _some(names: tuple[str, ...], shown: int = 5) -> str:
    listed = ", ".join(names[:shown])
    return f"{listed} and {len(names) - shown} more" if len(names) > shown else listed


def _iso(epoch_ms: int) -> str:
    moment = datetime.fromtimestamp(epoch_ms // 1000, UTC)
    return moment.isoformat().replace("+00:00", "Z")


def _duration(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


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
