"""The metrics' view of the keys: per-bucket summaries merge into the same totals and top
tenants as a look at every key at once would give."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.state.bucket_processor import LatestSummaries, run_bucket
from streaming.state.key_summary import (
    OTHER_TENANTS,
    BucketSummary,
    TenantWatermark,
    merge,
    summarise_bucket,
    top_with_remainder,
)
from tests.support.bucket_inputs import registry_with, routed_records
from tests.support.timestamps import T0_MS

# A key: (tenant, bucket, watermark ms or None before its first record, delay ms, windows).
Key = tuple[str, int, int | None, int, int]
keys_strategy = st.lists(
    st.tuples(
        st.sampled_from([f"t{n}" for n in range(12)]),
        st.integers(0, 5),
        st.one_of(st.none(), st.integers(0, 40)),
        st.integers(0, 50),
        st.integers(0, 4),
    ),
    max_size=60,
)


def _bucket_keys(keys: list[Key]) -> pa.Table:
    """Keys in `bucket_state`'s columns; a key's windows are stand-in list entries."""
    return pa.table(
        {
            "tenant": [key[0] for key in keys],
            "watermark_ms": [key[2] for key in keys],
            "max_event_time_ms": [None if key[2] is None else key[2] + key[3] for key in keys],
            "open_windows": [key[4] for key in keys],
        },
        schema=pa.schema(
            [
                ("tenant", pa.string()),
                ("watermark_ms", pa.int64()),
                ("max_event_time_ms", pa.int64()),
                ("open_windows", pa.int32()),
            ]
        ),
    )


@settings(max_examples=300)
@given(keys=keys_strategy, top=st.one_of(st.none(), st.integers(0, 5)))
def test_merged_bucket_summaries_equal_a_look_at_every_key(
    keys: list[Key], top: int | None
) -> None:
    buckets = sorted({key[1] for key in keys})
    summaries = [
        summarise_bucket(_bucket_keys([key for key in keys if key[1] == bucket]), T0_MS, top)
        for bucket in buckets
    ]
    gauges = merge(summaries, top)

    assert gauges.keys == len(keys)
    assert gauges.open_windows == sum(key[4] for key in keys)
    tenants: dict[str, TenantWatermark] = {}
    for tenant, _, watermark_ms, delay_ms, _ in keys:
        if watermark_ms is None:
            continue
        held = tenants.get(tenant, TenantWatermark(tenant, watermark_ms, delay_ms))
        tenants[tenant] = TenantWatermark(
            tenant, min(held.watermark_ms, watermark_ms), max(held.delay_ms, delay_ms)
        )
    ranked = sorted(tenants.values(), key=lambda t: (t.watermark_ms, t.tenant))
    if top is None:
        assert gauges.slowest == tenants
        return
    exported = dict(gauges.slowest)
    other = exported.pop(OTHER_TENANTS, None)
    listed = {t.tenant: t for t in ranked[:top]}
    assert exported.keys() == listed.keys()
    for tenant, got in exported.items():
        assert got.watermark_ms == listed[tenant].watermark_ms
        # Its delay counts the keys in the buckets that listed it: never more than the truth.
        assert got.delay_ms <= listed[tenant].delay_ms
    rest = ranked[top:]
    if not rest:
        assert other is None
        return
    # Bounds: never later than the rest's oldest watermark nor earlier than the last listed.
    assert other is not None
    assert other.watermark_ms <= min(t.watermark_ms for t in rest)
    if top:
        assert other.watermark_ms >= ranked[top - 1].watermark_ms
    assert other.delay_ms >= max(t.delay_ms for t in rest)
    assert other.delay_ms <= max(t.delay_ms for t in ranked)


def test_a_bucket_run_reports_what_its_status_rows_say(tmp_path: Path) -> None:
    registry = registry_with(tmp_path, ["acme", "globex"])
    batch = routed_records(
        [
            ("acme", 0, 0, T0_MS),
            ("acme", 0, 1, T0_MS + 61_000),
            ("globex", 1, 0, T0_MS + 5_000),
            (None, 1, 1, 0),
        ]
    )
    run = run_bucket(None, batch, registry, T0_MS + 70_000)
    summary = summarise_bucket(run.keys, T0_MS + 70_000, None)

    rows = run.rows.to_pandas()
    status = rows[rows["kind"] == "tenant_status"].set_index("tenant")
    assert summary.keys == len(status) == 2
    assert summary.open_windows == status["open_windows"].sum() > 0
    delays = status["max_event_time_ms"] - status["watermark_ms"]
    assert {t.tenant: (t.watermark_ms, t.delay_ms) for t in summary.slowest} == {
        tenant: (status.loc[tenant, "watermark_ms"], delays[tenant]) for tenant in status.index
    }
    assert summary.rest_watermark_ms is None
    # No key left: the bucket says so, and the driver drops what it counted of it.
    assert summarise_bucket(run.keys.slice(0, 0), T0_MS, None).keys == 0


def test_a_bucket_s_newer_summary_replaces_its_older_one() -> None:
    def summary(at_ms: int, keys: int) -> BucketSummary:
        return BucketSummary(at_ms, keys, 0, ())

    held = {1: summary(2_000, 5), 2: summary(2_000, 7)}
    merged = LatestSummaries().addInPlace(held, {1: summary(3_000, 6), 2: summary(1_000, 0)})
    assert merged == {1: summary(3_000, 6), 2: summary(2_000, 7)}
    assert held == {1: summary(2_000, 5), 2: summary(2_000, 7)}  # read by the metrics meanwhile


def test_top_with_remainder_sums_the_rest() -> None:
    backlog = {"a": 5, "b": 9, "c": 1, "d": 5}
    assert top_with_remainder(backlog, 2) == {"b": 9, "a": 5, OTHER_TENANTS: 6}
    assert top_with_remainder(backlog, 4) == backlog
    assert top_with_remainder({}, 3) == {}
