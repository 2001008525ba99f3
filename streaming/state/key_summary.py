"""Where the keys stand, for the metrics: open windows and the tenants whose watermarks trail most.

Every state bucket sums up its keys each time it runs (`summarise_bucket`): how many keys and
open windows it holds, and its tenants with the oldest watermarks. The driver keeps the latest
summary per bucket, so what it holds is bounded by `stream.state_buckets`, never by the tenants,
and `merge` turns them into the exported gauges: totals, the top N tenants, and `_other`.

A tenant's watermark is its slowest key's; its watermark delay (the newest event time minus W)
its largest key's. Tenants are ranked by watermark, oldest first: that is the order of how far
their results trail the clock (`time() - watermark`). Ranking by the delay would rank them by
their sources' `out_of_orderness`, which bounds it (contract §2: W = newest - out_of_orderness, or
later once idle).

A tenant's keys may sit in different buckets; each bucket lists its own top N tenants, so a
tenant in the overall top N is in the list of the bucket that holds its slowest key, with its
exact watermark; its delay counts the buckets that listed it (a lower bound). `_other`
stands for the tenants left out: their oldest watermark (never before the Nth tenant's) and their
largest delay, both bounds (a listed tenant's other key can be a bucket's remainder).

Pure: pyarrow, no Spark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

OTHER_TENANTS = "_other"
"""The label of what the tenants outside the top N add up to."""


@dataclass(frozen=True)
class TenantWatermark:
    tenant: str
    watermark_ms: int
    """Its slowest key's watermark."""
    delay_ms: int
    """Its largest newest-event-time-minus-watermark."""


@dataclass(frozen=True)
class BucketSummary:
    """One bucket's keys after a run."""

    processing_time_ms: int
    """The batch that wrote it: a bucket's newer summary replaces its older one."""
    keys: int
    open_windows: int
    slowest: tuple[TenantWatermark, ...]
    """Its tenants with the oldest watermarks, oldest first."""
    rest_watermark_ms: int | None = None
    """The oldest watermark among its other tenants, if any."""
    rest_delay_ms: int | None = None
    """The largest delay among its other tenants."""


@dataclass(frozen=True)
class KeyGauges:
    """Every bucket's summary merged: what the metrics export."""

    keys: int
    open_windows: int
    slowest: dict[str, TenantWatermark]
    """The top N tenants by oldest watermark, and `OTHER_TENANTS` for the rest, if any."""


def summarise_bucket(
    keys: pa.Table, processing_time_ms: int, top_tenants: int | None
) -> BucketSummary:
    """A bucket's keys (columns `tenant`, `watermark_ms`, `max_event_time_ms`, `open_windows`:
    `BucketState.summary_rows`) summed up; `top_tenants` None lists every tenant."""
    open_windows = int(pc.sum(keys["open_windows"]).as_py() or 0)
    per_tenant = (
        pa.table(
            {
                "tenant": keys["tenant"],
                "watermark_ms": keys["watermark_ms"],
                "delay_ms": pc.subtract(keys["max_event_time_ms"], keys["watermark_ms"]),
            }
        )
        # A key without a watermark yet (configured, no record) trails nothing.
        .filter(pc.is_valid(keys["watermark_ms"]))
        .group_by("tenant")
        .aggregate([("watermark_ms", "min"), ("delay_ms", "max")])
        .sort_by([("watermark_ms_min", "ascending"), ("tenant", "ascending")])
    )
    listed = per_tenant if top_tenants is None else per_tenant.slice(0, top_tenants)
    rest = per_tenant.slice(listed.num_rows)
    return BucketSummary(
        processing_time_ms=processing_time_ms,
        keys=keys.num_rows,
        open_windows=open_windows,
        slowest=tuple(
            TenantWatermark(row["tenant"], row["watermark_ms_min"], row["delay_ms_max"])
            for row in listed.to_pylist()
        ),
        rest_watermark_ms=pc.min(rest["watermark_ms_min"]).as_py() if rest.num_rows else None,
        rest_delay_ms=pc.max(rest["delay_ms_max"]).as_py() if rest.num_rows else None,
    )


def merge(summaries: Iterable[BucketSummary], top_tenants: int | None) -> KeyGauges:
    """The buckets' latest summaries as gauges: the `top_tenants` tenants (None: all) with the
    oldest watermarks, and `_other` for the rest."""
    keys = open_windows = 0
    tenants: dict[str, TenantWatermark] = {}
    rests: list[TenantWatermark] = []
    for summary in summaries:
        keys += summary.keys
        open_windows += summary.open_windows
        for found in summary.slowest:
            held = tenants.get(found.tenant)
            tenants[found.tenant] = (
                found
                if held is None
                else TenantWatermark(
                    found.tenant,
                    min(held.watermark_ms, found.watermark_ms),
                    max(held.delay_ms, found.delay_ms),
                )
            )
        if summary.rest_watermark_ms is not None and summary.rest_delay_ms is not None:
            rests.append(
                TenantWatermark(OTHER_TENANTS, summary.rest_watermark_ms, summary.rest_delay_ms)
            )
    ranked = sorted(tenants.values(), key=lambda t: (t.watermark_ms, t.tenant))
    if top_tenants is None:
        return KeyGauges(keys, open_windows, {t.tenant: t for t in ranked})
    listed = {t.tenant: t for t in ranked[:top_tenants]}
    left_out = ranked[top_tenants:] + rests
    if left_out:
        oldest = min(t.watermark_ms for t in left_out)
        if listed:
            # Never before the last listed tenant: an older remainder is a listed tenant's key.
            oldest = max(oldest, ranked[len(listed) - 1].watermark_ms)
        listed[OTHER_TENANTS] = TenantWatermark(
            OTHER_TENANTS, oldest, max(t.delay_ms for t in left_out)
        )
    return KeyGauges(keys, open_windows, listed)


def top_with_remainder(values: Mapping[str, int], top: int) -> dict[str, int]:
    """The `top` largest counts by name (ties: the first name), and `OTHER_TENANTS` for the
    sum of the rest; no `_other` when nothing is left."""
    ranked = sorted(values.items(), key=lambda item: (-item[1], item[0]))
    kept = dict(ranked[:top])
    if rest := [value for _, value in ranked[top:]]:
        kept[OTHER_TENANTS] = sum(rest)
    return kept
