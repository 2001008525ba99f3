"""Retention: deleting the rows of windows that ended longer ago than their tenant keeps data.

`tenant-windows retain` runs it, on a schedule like `optimize`'s. A tenant keeps its rows for
its own `retention` or the lake's `default_retention`; a row goes once its window ended before
now minus that (`events`, `windows`, `late_events`; `quarantine` by ingest date). The files
that held them go at the next `vacuum`, which keeps time travel within its own retention.

A window can still be open long after its end in event time when the tenant's watermark lags
the clock (a backfill, a paused producer). Its rows are never deleted: a tenant's cut-off is
lowered to its slowest key's watermark minus its largest allowed lateness, below which every
window of the tenant has had its final pane.

Tenants share one delete per distinct cut-off: at 100,000 tenants with the default, a table
gets one commit, not one per tenant.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.dataset as ds

from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import EVENTS, LATE_EVENTS, QUARANTINE, WINDOWS, TableSpec
from tenants.registry import TenantRegistry

log = logging.getLogger(__name__)

WINDOWED_TABLES = (EVENTS, WINDOWS, LATE_EVENTS)
HOUR_MS = 3_600_000


@dataclass(frozen=True)
class TenantRetention:
    """What retention needs to know of one tenant."""

    retention_ms: int | None
    """None: kept until purged."""
    watermark_ms: int | None = None
    """Its slowest key's watermark; None without data."""
    allowed_lateness_ms: int = 0
    """The largest allowed lateness of its sources."""
    slowest_source: str | None = None
    """The source of the key whose watermark that is: for saying why a cut-off is held back."""

    def cutoff_ms(self, now_ms: int) -> int | None:
        """Windows that ended before this are closed and past retention; None: keep all."""
        if self.retention_ms is None:
            return None
        cutoff = now_ms - self.retention_ms
        if self.watermark_ms is not None:
            cutoff = min(cutoff, self.watermark_ms - self.allowed_lateness_ms)
        return cutoff

    def held_back(self, now_ms: int) -> bool:
        """Whether its cut-off is its watermark's (windows after it may still be open), not
        now minus its retention."""
        if self.retention_ms is None or self.watermark_ms is None:
            return False
        return self.watermark_ms - self.allowed_lateness_ms < now_ms - self.retention_ms


@dataclass(frozen=True)
class Cut:
    """One delete: the rows of `tenants` (or of every tenant but `except_tenants`) before
    `cutoff_ms`."""

    cutoff_ms: int
    tenants: tuple[str, ...] = ()
    except_tenants: tuple[str, ...] | None = None
    """Set for the shared cut: every tenant without one of its own, unknown ones included."""

    def sql(self, time_column: str, as_date: bool) -> str:
        moment = datetime.fromtimestamp(self.cutoff_ms / 1000, tz=UTC)
        literal = moment.date().isoformat() if as_date else moment.isoformat()
        # Tenant ids match ID_PATTERN (the registry and the stream refuse others), and the
        # time is formatted here: nothing in a literal can end it.
        before = f"{time_column} < '{literal}'"
        if self.except_tenants is None:
            return f"{before} AND tenant IN ({_sql_list(self.tenants)})"
        if not self.except_tenants:
            return f"{before}"
        return f"{before} AND (tenant IS NULL OR tenant NOT IN ({_sql_list(self.except_tenants)}))"

    def expression(self, time_column: str, as_date: bool) -> ds.Expression:
        moment = datetime.fromtimestamp(self.cutoff_ms / 1000, tz=UTC)
        bound = (
            pa.scalar(moment.date(), pa.date32())
            if as_date
            else pa.scalar(moment, pa.timestamp("us", tz="UTC"))
        )
        before = ds.field(time_column) < bound
        if self.except_tenants is None:
            return before & ds.field("tenant").isin(list(self.tenants))
        if not self.except_tenants:
            return before
        others = ~ds.field("tenant").isin(list(self.except_tenants))
        return before & (ds.field("tenant").is_null() | others)


def tenant_retentions(
    registry: TenantRegistry,
    default_ms: int | None,
    slowest_keys: Mapping[str, tuple[str, int]],
) -> dict[str, TenantRetention]:
    """What retention needs of every configured tenant, and of every tenant with a
    watermark that is no longer configured (offboarded: kept until its keys have closed).
    `slowest_keys`: each tenant's slowest key, (source, watermark ms)."""
    tenants: dict[str, TenantRetention] = {}
    for tenant, config in registry.tenants.items():
        lateness = [
            route.rules.allowed_lateness_ms
            for source in registry.source_ids(tenant)
            if (route := registry.resolve(tenant, source)) is not None
        ]
        tenants[tenant] = TenantRetention(
            retention_ms=config.retention_ms or default_ms,
            watermark_ms=slowest_keys[tenant][1] if tenant in slowest_keys else None,
            allowed_lateness_ms=max(lateness, default=0),
            slowest_source=slowest_keys[tenant][0] if tenant in slowest_keys else None,
        )
    for tenant, (source, watermark_ms) in slowest_keys.items():
        tenants.setdefault(tenant, TenantRetention(default_ms, watermark_ms, slowest_source=source))
    return tenants


def plan_cuts(
    tenants: Mapping[str, TenantRetention], default: TenantRetention, now_ms: int
) -> list[Cut]:
    """The deletes that apply every tenant's retention: one shared by the tenants whose
    cut-off is the default's, and one per other cut-off, shared by the tenants that have it.

    Other cut-offs are rounded down to a whole hour, which only ever keeps more: tenants with
    the same retention, or lagging watermarks within the same hour, then share a delete."""
    shared = default.cutoff_ms(now_ms)
    own: dict[str, int | None] = {}
    for tenant, retention in tenants.items():
        cutoff = retention.cutoff_ms(now_ms)
        if cutoff != shared:
            own[tenant] = None if cutoff is None else cutoff - cutoff % HOUR_MS
    cuts = [] if shared is None else [Cut(shared, except_tenants=tuple(sorted(own)))]
    by_cutoff: dict[int, list[str]] = {}
    for tenant, cutoff in sorted(own.items()):
        if cutoff is not None:
            by_cutoff.setdefault(cutoff, []).append(tenant)
    cuts += [Cut(cutoff, tenants=tuple(names)) for cutoff, names in sorted(by_cutoff.items())]
    return cuts


@dataclass(frozen=True)
class CutReason:
    """Why one cut's cut-off is where it is, for the user: the tenants it covers, how many of
    them are held back to their watermark, and the one held back furthest."""

    cut: Cut
    tenants: tuple[str, ...]
    """The tenants it covers; for the shared cut, the configured ones without a cut of their
    own (any other tenant's rows too)."""
    retention_ms: int | None
    """The retention that set the cut-off when no tenant is held back; None when they differ."""
    held_back: tuple[str, ...]
    """The tenants whose cut-off is their watermark's, slowest first."""
    slowest: TenantRetention | None
    """The first of `held_back`."""


def explain_cuts(
    cuts: list[Cut], tenants: Mapping[str, TenantRetention], now_ms: int
) -> tuple[list[CutReason], tuple[str, ...]]:
    """Why each cut is where it is, and the tenants that keep everything (no retention)."""
    reasons = []
    for cut in cuts:
        if cut.except_tenants is None:
            covered = cut.tenants
        else:
            excluded = set(cut.except_tenants)
            covered = tuple(sorted(tenant for tenant in tenants if tenant not in excluded))
        held = sorted(
            (t for t in covered if tenants[t].held_back(now_ms)),
            key=lambda t: (tenants[t].watermark_ms or 0, t),
        )
        retentions = {tenants[t].retention_ms for t in covered if t not in set(held)}
        reasons.append(
            CutReason(
                cut,
                covered,
                next(iter(retentions)) if len(retentions) == 1 else None,
                tuple(held),
                tenants[held[0]] if held else None,
            )
        )
    kept = tuple(sorted(t for t, retention in tenants.items() if retention.retention_ms is None))
    return reasons, kept


def apply_retention(lake: DeltaLake, cuts: list[Cut], dry_run: bool) -> dict[str, int]:
    """Rows deleted (or, dry, that would be) per table."""
    deleted = {}
    for spec in (*WINDOWED_TABLES, QUARANTINE):
        as_date = spec is QUARANTINE
        column = "ingest_date" if as_date else "window_end"
        rows = 0
        for cut in cuts:
            if dry_run:
                rows += _count(lake, spec, cut.expression(column, as_date))
            else:
                rows += lake.delete_rows(spec, cut.sql(column, as_date))
        deleted[spec.name] = rows
        log.debug(
            "retention: %s %d rows of %s", "would delete" if dry_run else "deleted", rows, spec.name
        )
    return deleted


def _count(lake: DeltaLake, spec: TableSpec, row_filter: ds.Expression) -> int:
    return int(lake.read_arrow(spec, ["tenant"], row_filter).num_rows)


def _sql_list(tenants: tuple[str, ...]) -> str:
    return ", ".join(f"'{tenant}'" for tenant in tenants)
