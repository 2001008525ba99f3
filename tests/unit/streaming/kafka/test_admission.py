"""Admission (`streaming.kafka.admission`): quotas, fair shares and the order deferred records keep."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.kafka.admission import Ledger, admit, fair_shares
from tenants.models import Quota

NO_QUOTA: Callable[[str], Quota | None] = lambda tenant: None  # noqa: E731


def _quotas(**by_tenant: Quota) -> Callable[[str], Quota | None]:
    return by_tenant.get


def test_without_quota_or_budget_everything_is_windowed_and_nothing_is_remembered() -> None:
    decision = admit(Ledger(), ["a", "b", "a"], NO_QUOTA, None, now_ms=1_000, file="f")
    assert decision.window_now.tolist() == [True, True, True]
    assert decision.releases == ()
    assert decision.ledger.tenants == {}
    assert decision.ledger.counts.windowed == 3


def test_a_tenant_over_its_burst_is_deferred_in_order_and_released_as_tokens_refill() -> None:
    quota_of = _quotas(noisy=Quota(records_per_second=2, burst=3))
    tenants = ["noisy"] * 5 + ["quiet"] * 2
    first = admit(Ledger(), tenants, quota_of, None, now_ms=10_000, file="b1/0.parquet")
    # The burst's first three are windowed, the other two wait; quiet is never slowed.
    assert first.window_now.tolist() == [True, True, True, False, False, True, True]
    noisy = first.ledger.tenants["noisy"]
    assert (noisy.backlog, noisy.tokens, noisy.oldest_deferred_at_ms) == (2, 0.0, 10_000)
    assert "quiet" not in first.ledger.tenants

    # One second later: 2 tokens. Both deferred records go first, before the new one.
    second = admit(first.ledger, ["noisy"], quota_of, None, now_ms=11_000, file="b2/0.parquet")
    assert [(r.tenant, r.file, r.start, r.stop) for r in second.releases] == [
        ("noisy", "b1/0.parquet", 0, 2)
    ]
    assert second.window_now.tolist() == [False]
    assert second.ledger.tenants["noisy"].backlog == 1
    assert second.ledger.counts.released == 2
    assert second.ledger.counts.deferred == 1


def test_a_new_record_never_overtakes_a_deferred_one_of_its_tenant() -> None:
    quota_of = _quotas(t=Quota(records_per_second=1, burst=1))
    first = admit(Ledger(), ["t", "t"], quota_of, None, now_ms=0, file="b1/0.parquet")
    assert first.window_now.tolist() == [True, False]
    # 0.5 s later there is no whole token: the new record waits behind the deferred one.
    second = admit(first.ledger, ["t"], quota_of, None, now_ms=500, file="b2/0.parquet")
    assert second.releases == ()
    assert second.window_now.tolist() == [False]
    segments = second.ledger.tenants["t"].segments
    assert [(s.file, s.count) for s in segments] == [("b1/0.parquet", 1), ("b2/0.parquet", 1)]


def test_a_budget_is_shared_max_min_fairly() -> None:
    # quiet and medium want less than an equal share: they get all of it; noisy the rest.
    assert fair_shares({"quiet": 3, "noisy": 1_000, "medium": 40}, 100) == {
        "quiet": 3,
        "noisy": 57,
        "medium": 40,
    }
    assert fair_shares({"a": 10, "b": 10}, None) == {"a": 10, "b": 10}
    assert fair_shares({"a": 10, "b": 10}, 7) == {"a": 4, "b": 3}


def test_the_ledger_survives_its_json_form() -> None:
    quota_of = _quotas(t=Quota(records_per_second=1.5, burst=2))
    decision = admit(Ledger(), ["t"] * 5 + [""], quota_of, 4, now_ms=7, file="b/3.parquet")
    assert Ledger.from_json(decision.ledger.to_json()) == decision.ledger


@settings(max_examples=200)
@given(
    batches=st.lists(
        st.lists(st.sampled_from(["a", "b", "c", ""]), max_size=30), min_size=1, max_size=8
    ),
    budget=st.one_of(st.none(), st.integers(1, 20)),
    rate=st.integers(1, 20),
    burst=st.integers(1, 10),
)
def test_every_record_is_windowed_once_in_its_tenants_order(
    batches: list[list[str]], budget: int | None, rate: int, burst: int
) -> None:
    """Whatever the quotas and budget: each batch windows at most its budget, and each
    tenant's records come out exactly once, in the order they were read."""
    quota_of = _quotas(a=Quota(records_per_second=rate, burst=burst))
    files: dict[str, list[tuple[str, int]]] = {}
    windowed: list[tuple[str, int]] = []
    ledger = Ledger()
    number = 0
    drain: list[list[str]] = [[] for _ in range(200)]
    for batch_number, tenants in enumerate(batches + drain):
        records = [(tenant, number + index) for index, tenant in enumerate(tenants)]
        number += len(tenants)
        file = f"b{batch_number}"
        decision = admit(ledger, tenants, quota_of, budget, batch_number * 1_000, file)
        for release in decision.releases:
            own = [record for record in files[release.file] if record[0] == release.tenant]
            windowed += own[release.start : release.stop]
        windowed += [r for r, now in zip(records, decision.window_now, strict=True) if now]
        files[file] = [r for r, now in zip(records, decision.window_now, strict=True) if not now]
        counts = decision.ledger.counts
        if budget is not None:
            assert counts.windowed + counts.released <= budget
        ledger = decision.ledger
    assert ledger.backlog == 0
    every = [(tenant, index) for index, tenant in enumerate(t for b in batches for t in b)]
    assert sorted(windowed, key=lambda r: r[1]) == every
    for tenant in {"a", "b", "c", ""}:
        own = [index for name, index in windowed if name == tenant]
        assert own == sorted(own)
