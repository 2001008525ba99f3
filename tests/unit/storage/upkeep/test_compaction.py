"""When a compaction settles everything and when it only merges (`SettlePolicy`): the age limit
holds at the next compaction, and the choice depends on committed files and the batch's time."""

from __future__ import annotations

import pytest

from storage.lake.delta_lake import LakeFile
from storage.upkeep.settle_policy import SETTLE_EVERYTHING, SettlePolicy
from tenants.settings import StreamSettings

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
NOW_MS = 1_795_000_000_000


def _staged(*ages_ms: int | None) -> list[LakeFile]:
    return [
        LakeFile(
            f"layout_tenant=_staged/f{index}.parquet",
            1,
            {},
            None if age is None else NOW_MS - age,
        )
        for index, age in enumerate(ages_ms)
    ]


def test_the_defaults_merge_every_ten_minutes_and_settle_at_six_hours() -> None:
    stream = StreamSettings()
    policy = SettlePolicy.of(
        stream.compact_interval_ms, stream.merge_interval_ms, stream.settle_rows
    )
    assert policy.pass_interval_ms == 10 * MINUTE_MS
    assert not policy.settles_all(_staged(MINUTE_MS, 5 * HOUR_MS), NOW_MS)
    # Ten minutes on, the oldest row would be past six hours: everything settles now.
    assert policy.settles_all(_staged(MINUTE_MS, 5 * HOUR_MS + 50 * MINUTE_MS), NOW_MS)


@pytest.mark.parametrize("age_limit_ms", [0, 5_000, 10 * MINUTE_MS])
def test_an_age_limit_no_longer_than_the_merge_interval_settles_everything_each_time(
    age_limit_ms: int,
) -> None:
    policy = SettlePolicy.of(age_limit_ms, 10 * MINUTE_MS, 5_000)
    assert policy.pass_interval_ms == age_limit_ms
    assert policy.settles_all(_staged(0), NOW_MS)
    # A file written during the very batch the compaction runs after is younger than `now`.
    assert policy.settles_all(_staged(-2_000), NOW_MS)


def test_the_last_compaction_of_a_run_and_files_of_unknown_age_settle_everything() -> None:
    policy = SettlePolicy.of(4 * HOUR_MS, 10 * MINUTE_MS, 5_000)
    assert policy.settles_all(_staged(MINUTE_MS), None)
    assert policy.settles_all(_staged(MINUTE_MS, None), NOW_MS)
    assert SETTLE_EVERYTHING.settles_all(_staged(0), NOW_MS)


@pytest.mark.parametrize("pass_offset_ms", [0, 1, 7 * MINUTE_MS, 10 * MINUTE_MS - 1])
def test_no_row_waits_past_the_age_limit_when_compaction_runs_every_interval(
    pass_offset_ms: int,
) -> None:
    """A row staged at t0, compactions every merge interval: the compaction that settles it
    runs no later than t0 + age limit."""
    policy = SettlePolicy.of(HOUR_MS, 10 * MINUTE_MS, 5_000)
    staged_at = NOW_MS
    now = staged_at + pass_offset_ms
    while not policy.settles_all([LakeFile("f", 1, {}, staged_at)], now):
        now += policy.pass_interval_ms
    assert now - staged_at <= HOUR_MS
    assert now - staged_at > HOUR_MS - 2 * policy.pass_interval_ms


def _run_file(oldest_ms: int) -> LakeFile:
    name = f"run-events-e1-c{'0' * 16}-a{oldest_ms}-t00000.parquet"
    return LakeFile(f"layout_tenant=_staged/{name}", 1, {}, oldest_ms)


def test_a_batch_file_staged_before_the_interval_began_is_owed_and_one_since_is_not() -> None:
    """An instance that died before its interval's compaction committed left the files of the
    interval before: the next instance owes that compaction, not one for this interval's."""
    policy = SettlePolicy.of(HOUR_MS, 10 * MINUTE_MS, 5_000)
    began_ms = NOW_MS - NOW_MS % (10 * MINUTE_MS)
    since = LakeFile("layout_tenant=_staged/b.parquet", 1, {}, began_ms)
    before = LakeFile("layout_tenant=_staged/a.parquet", 1, {}, began_ms - 1)
    assert not policy.owes([since], NOW_MS)
    assert policy.owes([since, before], NOW_MS)
    assert not policy.owes([], NOW_MS)


def test_a_run_is_owed_only_once_the_age_limit_settles_everything() -> None:
    """A merge leaves runs for later; they are owed when their oldest row is due to settle."""
    policy = SettlePolicy.of(HOUR_MS, 10 * MINUTE_MS, 5_000)
    assert not policy.owes([_run_file(NOW_MS - 20 * MINUTE_MS)], NOW_MS)
    assert policy.owes([_run_file(NOW_MS - 55 * MINUTE_MS)], NOW_MS)
    # Where every compaction settles everything, any run from before the interval is owed.
    assert SettlePolicy.of(HOUR_MS, HOUR_MS, 5_000).owes([_run_file(NOW_MS - HOUR_MS)], NOW_MS)


def test_with_a_compaction_after_every_batch_any_older_staged_file_is_owed() -> None:
    assert SETTLE_EVERYTHING.owes(_staged(1), NOW_MS)
    assert not SETTLE_EVERYTHING.owes(_staged(0), NOW_MS)
