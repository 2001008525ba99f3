"""Retention: who is cut where (pure), and the same rows by SQL and by Arrow filter (a real Delta
table). `retain` on a lake the stream wrote: tests/integration/lake/test_retention.py."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable, write_deltalake

from storage.upkeep.retention import Cut, TenantRetention, plan_cuts

DAY_MS = 86_400_000
NOW_MS = 1_780_000_000_000


def test_tenants_sharing_the_default_share_one_cut() -> None:
    tenants = {f"t{n}": TenantRetention(30 * DAY_MS, NOW_MS, 60_000) for n in range(1000)}
    cuts = plan_cuts(tenants, TenantRetention(30 * DAY_MS), NOW_MS)
    assert cuts == [Cut(NOW_MS - 30 * DAY_MS, except_tenants=())]


def test_own_retention_and_a_lagging_watermark_get_cuts_of_their_own() -> None:
    tenants = {
        "steady": TenantRetention(30 * DAY_MS, NOW_MS, 60_000),
        "keeps-long": TenantRetention(400 * DAY_MS, NOW_MS),
        # Backfilling: its watermark is 40 days behind; its windows up to W - lateness closed.
        "backfill": TenantRetention(30 * DAY_MS, NOW_MS - 40 * DAY_MS, 60_000),
        "forever": TenantRetention(None),
    }
    cuts = plan_cuts(tenants, TenantRetention(30 * DAY_MS), NOW_MS)
    assert cuts == [
        Cut(NOW_MS - 30 * DAY_MS, except_tenants=("backfill", "forever", "keeps-long")),
        Cut(_hour(NOW_MS - 400 * DAY_MS), tenants=("keeps-long",)),
        Cut(_hour(NOW_MS - 40 * DAY_MS - 60_000), tenants=("backfill",)),
    ]


def test_tenants_with_the_same_own_cutoff_share_a_delete() -> None:
    tenants = {
        **{f"long{n}": TenantRetention(400 * DAY_MS, NOW_MS) for n in range(3)},
        # Watermarks minutes apart: the same hour, one delete.
        **{f"lag{n}": TenantRetention(30 * DAY_MS, NOW_MS - 40 * DAY_MS + n) for n in range(3)},
    }
    cuts = plan_cuts(tenants, TenantRetention(30 * DAY_MS), NOW_MS)
    assert [len(cut.tenants) for cut in cuts[1:]] == [3, 3]
    assert all(cut.cutoff_ms % 3_600_000 == 0 for cut in cuts[1:])


def _hour(ms: int) -> int:
    return ms - ms % 3_600_000


def test_without_a_default_only_tenants_with_a_retention_are_cut() -> None:
    tenants = {"a": TenantRetention(None), "b": TenantRetention(7 * DAY_MS)}
    assert plan_cuts(tenants, TenantRetention(None), NOW_MS) == [
        Cut(_hour(NOW_MS - 7 * DAY_MS), tenants=("b",))
    ]


@pytest.mark.parametrize(
    "cut",
    [
        Cut(NOW_MS - 30 * DAY_MS, except_tenants=("b",)),
        Cut(NOW_MS - 30 * DAY_MS, except_tenants=()),
        Cut(NOW_MS - 10 * DAY_MS, tenants=("b", "c")),
    ],
)
def test_the_delete_and_the_dry_run_select_the_same_rows(cut: Cut, tmp_path: Path) -> None:
    ends = [NOW_MS - days * DAY_MS for days in (45, 31, 29, 12, 9, 1)]
    rows = pa.table(
        {
            "tenant": pa.array(["a", "b", "c", None, "a", "b"], pa.string()),
            "window_end": pa.array([end * 1000 for end in ends], pa.timestamp("us", tz="UTC")),
            "ingest_date": pa.array(
                [datetime.fromtimestamp(end / 1000, tz=UTC).date() for end in ends], pa.date32()
            ),
        }
    )
    for column, as_date in (("window_end", False), ("ingest_date", True)):
        path = str(tmp_path / column)
        write_deltalake(path, rows)
        expected = ds.dataset(rows).to_table(filter=~cut.expression(column, as_date))
        DeltaTable(path).delete(predicate=cut.sql(column, as_date))
        kept = DeltaTable(path).to_pyarrow_table().cast(rows.schema)
        key = [("window_end", "ascending")]
        assert kept.sort_by(key).equals(expected.sort_by(key)), (column, cut)
        assert 0 < kept.num_rows < rows.num_rows or not cut.tenants


def test_explain_cuts_says_which_tenants_are_held_back_to_their_watermark() -> None:
    from storage.upkeep.retention import explain_cuts

    tenants = {
        "steady": TenantRetention(30 * DAY_MS, NOW_MS, 60_000, "web"),
        "acme": TenantRetention(30 * DAY_MS, NOW_MS - 330 * DAY_MS, 300_000, "billing"),
        "keeps-long": TenantRetention(400 * DAY_MS, NOW_MS, 0, "web"),
        "forever": TenantRetention(None),
    }
    cuts = plan_cuts(tenants, TenantRetention(30 * DAY_MS), NOW_MS)
    reasons, kept = explain_cuts(cuts, tenants, NOW_MS)
    assert kept == ("forever",)
    by_tenants = {reason.tenants: reason for reason in reasons}
    shared = by_tenants[("steady",)]
    assert shared.cut.except_tenants is not None
    assert (shared.retention_ms, shared.held_back) == (30 * DAY_MS, ())
    acme = by_tenants[("acme",)]
    assert acme.held_back == ("acme",) and acme.slowest is tenants["acme"]
    assert acme.cut.cutoff_ms <= NOW_MS - 330 * DAY_MS - 300_000
    long = by_tenants[("keeps-long",)]
    assert (long.retention_ms, long.held_back) == (400 * DAY_MS, ())
