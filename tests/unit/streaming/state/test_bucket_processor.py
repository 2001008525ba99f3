"""A bucket of many keys gives each key exactly what processing that key alone would (no Spark).

The stateful stage runs one call per hash bucket; these tests drive that call's logic directly
with a pandas batch in the routed schema, interleaving many keys' records across partitions.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from streaming.records.parsing import Accepted, parse_value
from streaming.records.routing import route_frame
from streaming.state.bucket_processor import _process_bucket, sorted_batch, wake_up_after_ms
from streaming.state.bucket_state import BucketState
from streaming.state.union_rows import UnionRows
from streaming.windowing.key_state import KeyState, RecordInput
from streaming.windowing.key_windows import advance
from tenants.conf_reader import load_registry
from tenants.registry import TenantRegistry
from tests.support.bucket_inputs import json_layout_blob, registry_with, routed_records
from tests.support.sample_conf import SAMPLE_CONF
from tests.support.timestamps import T0_MS

# Integers and flags with nulls stay integers and flags, as the tests compare them.
NULLABLE_TYPES = {
    pa.int64(): pd.Int64Dtype(),
    pa.int32(): pd.Int32Dtype(),
    pa.bool_(): pd.BooleanDtype(),
}


def _run_bucket(
    batch: pd.DataFrame, keys: BucketState, registry: TenantRegistry, now_ms: int
) -> pd.DataFrame:
    out = UnionRows(sorted_batch([batch]))
    _process_bucket(out.batch, keys, registry, now_ms, out)
    return out.table().to_pandas(types_mapper=NULLABLE_TYPES.get)


def test_many_keys_in_one_bucket_match_each_key_processed_alone(tmp_path: Path) -> None:
    tenants = [f"t{n:03d}" for n in range(200)]
    registry = registry_with(tmp_path, tenants)
    rng = random.Random(5)
    # Two batches; each key's records spread over two partitions and shuffled across keys.
    batches: list[list[tuple[str | None, int, int, int]]] = [[], []]
    next_offset = [0, 0]
    for batch_rows in batches:
        for _ in range(3_000):
            tenant = rng.choice(tenants)
            partition = rng.randrange(2)
            batch_rows.append(
                (tenant, partition, next_offset[partition], T0_MS + rng.randrange(600_000))
            )
            next_offset[partition] += 1
        batch_rows.append((None, 0, next_offset[0], 0))
        next_offset[0] += 1
        rng.shuffle(batch_rows)

    keys = BucketState()
    outputs = []
    for index, rows in enumerate(batches):
        # The state goes through its bytes between batches, as in Spark's state store.
        keys = BucketState.from_bytes(keys.to_bytes())
        outputs.append(_run_bucket(routed_records(rows), keys, registry, T0_MS + index * 10_000))

    rules = registry.resolve("t000", "web")
    assert rules is not None
    for tenant in tenants:
        alone = KeyState()
        expected_events, expected_panes = [], []
        for index, rows in enumerate(batches):
            ordered = sorted((p, o, t) for name, p, o, t in rows if name == tenant)
            result = advance(
                alone, [RecordInput(t) for _, _, t in ordered], rules.rules, T0_MS + index * 10_000
            )
            expected_events += [
                (ordered[a.record_index][1], a.window_id, a.pane_index, a.timing.value)
                for a in result.assignments
            ]
            expected_panes += [
                (p.window_id, p.pane_index, p.count, p.is_final) for p in result.panes
            ]
        got = pd.concat(outputs)
        got = got[got["tenant"] == tenant]
        events = got[got["kind"] == "events"]
        panes = got[got["kind"] == "windows"]
        assert sorted(
            zip(
                events["offset"],
                events["window_id"],
                events["pane_index"],
                events["timing"],
                strict=True,
            )
        ) == sorted(expected_events), tenant
        assert sorted(
            zip(
                panes["window_id"],
                panes["pane_index"],
                panes["count"],
                panes["is_final"],
                strict=True,
            )
        ) == sorted(expected_panes), tenant
        assert keys.get((tenant, "web")).key_state == alone
    quarantined = pd.concat(outputs)
    assert (quarantined["kind"] == "quarantine").sum() == 2


def test_a_windows_metrics_are_those_of_its_records_fields_as_routed(tmp_path: Path) -> None:
    """Metric inputs cross from routing to the bucket packed; the panes' metrics are what the
    reference computes from the same records' parsed inputs, missing fields included."""
    registry = registry_with(tmp_path, ["acme", "globex"])
    rng = random.Random(11)
    values, rows = [], []
    for offset in range(400):
        tenant = rng.choice(["acme", "globex"])
        record: dict[str, object] = {
            "tenant": tenant,
            "source": "web",
            "ts": f"2026-01-01T00:{rng.randrange(3):02d}:{rng.randrange(60):02d}Z",
            "level": rng.choice(["ERROR", "INFO"]),
        }
        if rng.random() < 0.8:
            record["amount"] = rng.choice([rng.uniform(-1e6, 1e6), rng.randrange(1_000)])
        values.append(json.dumps(record).encode())
        rows.append((tenant, 0, offset, 0))
    routed = route_frame(
        routed_records(rows).assign(value=values), registry, max_record_bytes=10_000
    )
    now_ms = T0_MS + 10 * 60_000
    out = _run_bucket(routed, BucketState(), registry, now_ms)

    for tenant in ["acme", "globex"]:
        resolved = registry.resolve(tenant, "web")
        assert resolved is not None
        inputs = []
        for value in values:
            accepted = parse_value(value, registry, 10_000)
            if isinstance(accepted, Accepted) and accepted.tenant == tenant:
                inputs.append(RecordInput(accepted.event_time_ms, accepted.metric_inputs))
        expected = advance(KeyState(), inputs, resolved.rules, now_ms).panes
        panes = out[(out["kind"] == "windows") & (out["tenant"] == tenant)]
        got = {
            (window_id, pane_index): dict(metrics)
            for window_id, pane_index, metrics in zip(
                panes["window_id"], panes["pane_index"], panes["metrics"], strict=True
            )
        }
        assert expected and got == {
            (pane.window_id, pane.pane_index): pytest.approx(pane.metrics) for pane in expected
        }


def test_an_unknown_key_is_quarantined_and_keeps_no_state(tmp_path: Path) -> None:
    registry = registry_with(tmp_path, ["acme"])
    keys = BucketState()
    out = _run_bucket(
        routed_records([("acme", 0, 0, T0_MS), ("gone", 0, 1, T0_MS)]), keys, registry, T0_MS
    )
    rejected = out[out["kind"] == "quarantine"]
    assert list(rejected["tenant"]) == ["gone"]
    assert list(rejected["reason"]) == ["unknown_tenant"]
    assert keys.keys() == {("acme", "web")}


def test_an_idle_key_closes_its_windows_while_its_bucket_neighbour_sends(tmp_path: Path) -> None:
    registry = registry_with(tmp_path, ["quiet", "busy"])  # web: idle_timeout 2m, lateness 1m
    keys = BucketState()
    _run_bucket(
        routed_records([("quiet", 0, 0, T0_MS + 5_000), ("busy", 0, 1, T0_MS)]),
        keys,
        registry,
        T0_MS,
    )
    assert keys.get(("quiet", "web")).key_state.windows

    later_ms = T0_MS + 10 * 60_000  # far past idle_timeout + window end + allowed lateness
    out = _run_bucket(routed_records([("busy", 0, 2, later_ms)]), keys, registry, later_ms)

    quiet = out[(out["tenant"] == "quiet") & (out["kind"] == "windows")]
    assert list(quiet["is_final"]) == [True]
    assert not keys.get(("quiet", "web")).key_state.windows
    # busy opened a window in this batch: the bucket is due again when busy has idled that long.
    assert keys.next_idle_deadline_ms() == later_ms + 120_000


# Offboarding: a key whose config is gone gets a final pane per open window, then no state.


def _offboarding_history(keys: BucketState, registry: TenantRegistry) -> None:
    """acme/web: [0:00,1:00) sealed with an ON_TIME and a LATE pane, [1:00,2:00) and
    [2:00,3:00) still open; its idle deadline is set (web has idle_timeout 2m)."""
    _run_bucket(
        routed_records([("acme", 0, 0, T0_MS + 5_000), ("acme", 0, 1, T0_MS + 80_000)]),
        keys,
        registry,
        T0_MS,
    )
    _run_bucket(
        routed_records([("acme", 0, 2, T0_MS + 30_000), ("acme", 0, 3, T0_MS + 125_000)]),
        keys,
        registry,
        T0_MS + 5_000,
    )


def test_offboarding_closes_every_open_window_with_a_final_pane_and_drops_the_state(
    tmp_path: Path,
) -> None:
    before = registry_with(tmp_path / "before", ["acme", "globex"])
    keys = BucketState()
    _offboarding_history(keys, before)
    open_windows = keys.get(("acme", "web")).key_state.windows
    assert sorted(w.window_id for w in open_windows.values()) == [
        f"{T0_MS}-{T0_MS + 60_000}",
        f"{T0_MS + 60_000}-{T0_MS + 120_000}",
        f"{T0_MS + 120_000}-{T0_MS + 180_000}",
    ]
    keys = BucketState.from_bytes(keys.to_bytes())

    after = registry_with(tmp_path / "after", ["globex"])  # acme's file was removed
    out = _run_bucket(routed_records([]), keys, after, T0_MS + 6_000)

    panes = out[out["kind"] == "windows"].sort_values("window_start_ms")
    assert list(panes["window_start_ms"]) == [T0_MS, T0_MS + 60_000, T0_MS + 120_000]
    assert list(panes["is_final"]) == [True, True, True]
    # [0:00,1:00) had panes 0 (ON_TIME) and 1 (LATE): its final pane is 2, past its end: LATE.
    assert list(panes["pane_index"]) == [2, 0, 0]
    assert list(panes["timing"]) == ["LATE", "ON_TIME", "ON_TIME"]
    assert list(panes["count"]) == [2, 1, 1]  # web accumulates
    assert set(panes["watermark_ms"]) == {T0_MS + 115_000}  # W did not move
    status = out[out["kind"] == "tenant_status"]
    assert list(
        zip(status["tenant"], status["lifecycle"], status["open_windows"], strict=True)
    ) == [("acme", "offboarded", 0)]
    assert keys.keys() == set()
    assert keys.next_idle_deadline_ms() is None
    assert BucketState.from_bytes(keys.to_bytes()).checked_fingerprint == after.fingerprint


def test_a_discarding_final_only_window_closes_with_its_totals(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    (conf / "tenants").mkdir(parents=True)
    (conf / "sources.yaml").write_text((SAMPLE_CONF / "sources.yaml").read_text())
    (conf / "tenants" / "acme.yaml").write_text(
        "id: acme\nsources:\n  web: {emit: final_only, accumulation: discarding}\n"
    )
    keys = BucketState()
    _offboarding_history(keys, load_registry(conf))

    out = _run_bucket(
        routed_records([]), keys, registry_with(tmp_path / "after", []), T0_MS + 6_000
    )

    panes = out[out["kind"] == "windows"].sort_values("window_start_ms")
    assert list(panes["pane_index"]) == [0, 0, 0]
    assert list(panes["count"]) == [2, 1, 1]
    assert list(panes["timing"]) == ["LATE", "ON_TIME", "ON_TIME"]
    assert list(panes["is_final"]) == [True, True, True]


def test_records_after_offboarding_are_quarantined_as_unknown_tenant(tmp_path: Path) -> None:
    before = registry_with(tmp_path / "before", ["acme", "globex"])
    keys = BucketState()
    _offboarding_history(keys, before)
    after = registry_with(tmp_path / "after", ["globex"])
    _run_bucket(routed_records([]), keys, after, T0_MS + 6_000)

    values = [
        b'{"tenant": "acme", "source": "web", "ts": "2026-01-01T00:00:07Z"}',
        b'{"tenant": "globex", "source": "billing", "meta": {"event_ms": 1767225607000}}',
        b'{"tenant": "globex", "source": "web", "ts": "2026-01-01T00:00:07Z"}',
    ]
    routed = route_frame(
        routed_records([("acme", 0, 4, 0), ("globex", 0, 5, 0), ("globex", 0, 6, 0)]).assign(
            value=values
        ),
        after,
        max_record_bytes=10_000,
    )
    out = _run_bucket(routed, keys, after, T0_MS + 7_000)

    rejected = out[out["kind"] == "quarantine"].sort_values("offset")
    assert list(zip(rejected["tenant"], rejected["reason"], strict=True)) == [
        ("acme", "unknown_tenant"),
        ("globex", "unknown_source"),  # a known tenant's unknown source stays that
    ]
    assert keys.keys() == {("globex", "web")}


def test_a_tenant_onboarded_again_starts_fresh(tmp_path: Path) -> None:
    with_acme = registry_with(tmp_path / "with", ["acme"])
    keys = BucketState()
    _offboarding_history(keys, with_acme)
    _run_bucket(routed_records([]), keys, registry_with(tmp_path / "without", []), T0_MS + 6_000)

    out = _run_bucket(
        routed_records([("acme", 0, 9, T0_MS + 5_000)]), keys, with_acme, T0_MS + 9_000
    )

    events = out[out["kind"] == "events"]
    assert list(zip(events["window_id"], events["pane_index"], events["timing"], strict=True)) == [
        (f"{T0_MS}-{T0_MS + 60_000}", 0, "ON_TIME")  # too late before; a new key now
    ]
    status = out[out["kind"] == "tenant_status"]
    assert list(status["lifecycle"]) == ["active"]
    assert list(status["on_time_records"]) == [1]
    assert list(status["late_records"]) == [0]


def test_offboarding_one_key_of_200_leaves_the_others_output_unchanged(tmp_path: Path) -> None:
    tenants = [f"t{n:03d}" for n in range(200)]
    everyone = registry_with(tmp_path / "everyone", tenants)
    without_one = registry_with(tmp_path / "without", [t for t in tenants if t != "t042"])
    rng = random.Random(11)
    first = [
        (rng.choice(tenants), 0, offset, T0_MS + rng.randrange(90_000)) for offset in range(2_000)
    ]
    second = [
        (rng.choice(tenants), 0, offset, T0_MS + 60_000 + rng.randrange(90_000))
        for offset in range(2_000, 4_000)
    ]
    kept, changed = BucketState(), BucketState()
    for keys in (kept, changed):
        _run_bucket(routed_records(first), keys, everyone, T0_MS)
    open_before = sorted(changed.get(("t042", "web")).key_state.windows)
    assert open_before
    # In the changed bucket t042 is offboarded in the second batch; its records are quarantined
    # by routing, as the stream would.
    second_without = [row if row[0] != "t042" else ("t042", 0, row[2], row[3]) for row in second]
    routed = routed_records(second_without)
    routed.loc[routed["tenant"] == "t042", "reason"] = "unknown_tenant"
    kept_out = _run_bucket(routed_records(second), kept, everyone, T0_MS + 10_000)
    changed_out = _run_bucket(routed, changed, without_one, T0_MS + 10_000)

    def others(frame: pd.DataFrame) -> pd.DataFrame:
        rows = frame[(frame["tenant"] != "t042") & (frame["kind"] != "quarantine")]
        return rows.sort_values(
            ["kind", "tenant", "offset", "window_id", "pane_index"]
        ).reset_index(drop=True)

    assert not others(kept_out).empty
    pd.testing.assert_frame_equal(others(kept_out), others(changed_out))
    assert changed.keys() == kept.keys() - {("t042", "web")}
    for key in sorted(changed.keys()):
        assert changed.get(key).key_state == kept.get(key).key_state
    offboarded = changed_out[(changed_out["tenant"] == "t042") & (changed_out["kind"] == "windows")]
    assert sorted(offboarded["window_id"]) == open_before
    assert offboarded["is_final"].all()


def test_keys_are_not_checked_again_while_the_config_fingerprint_is_unchanged(
    tmp_path: Path,
) -> None:
    registry = registry_with(tmp_path, ["acme", "globex"])
    keys = BucketState()
    _offboarding_history(keys, registry)
    blob = BucketState.from_bytes(keys.to_bytes()).to_bytes()
    # A registry without acme that claims the fingerprint the bucket already checked: the bucket
    # does not look at its keys, so acme stays; this is what spares a resolve per key per batch.
    same_fingerprint = TenantRegistry.build(
        registry.sources,
        {"globex": registry.tenants["globex"]},
        fingerprint=registry.fingerprint,
    )
    woken = BucketState.from_bytes(blob)
    out = _run_bucket(routed_records([]), woken, same_fingerprint, T0_MS + 6_000)

    assert out.empty
    assert woken.keys() == {("acme", "web")}
    assert woken.to_bytes() == blob, "a bucket woken for nothing saves its state as it was"
    assert woken.to_bytes() is blob, "... without encoding its keys again"

    changed = TenantRegistry.build(
        registry.sources, {"globex": registry.tenants["globex"]}, fingerprint="changed"
    )
    out = _run_bucket(routed_records([]), woken, changed, T0_MS + 7_000)
    assert set(out["lifecycle"].dropna()) == {"offboarded"}
    assert woken.keys() == set()


def test_a_bucket_with_state_wakes_for_its_first_idle_deadline_or_the_config_recheck() -> None:
    now_ms = T0_MS
    assert wake_up_after_ms(None, now_ms, 60_000) == 60_000
    assert wake_up_after_ms(now_ms + 5_000, now_ms, 60_000) == 5_000
    assert wake_up_after_ms(now_ms + 90_000, now_ms, 60_000) == 60_000
    assert wake_up_after_ms(now_ms - 1, now_ms, 60_000) == 1  # overdue: as soon as possible


def test_a_bucket_of_the_json_layout_resumes_and_is_advanced_as_columns_afterwards(
    tmp_path: Path,
) -> None:
    """A checkpoint from before the columnar state: each key's state was a JSON string."""
    registry = registry_with(tmp_path, ["acme", "globex"])
    resolved = registry.resolve("acme", "web")
    assert resolved is not None
    batches = [
        [("acme", 0, 0, T0_MS + 5_000), ("globex", 0, 1, T0_MS + 7_000)],
        [("acme", 0, 2, T0_MS + 70_000), ("globex", 0, 3, T0_MS + 2_000)],
        [("acme", 0, 4, T0_MS + 200_000), ("globex", 0, 5, T0_MS + 190_000)],
    ]
    alone = {tenant: KeyState() for tenant in ("acme", "globex")}
    expected = []
    for number, rows in enumerate(batches):
        panes = []
        for tenant, state in alone.items():
            result = advance(
                state,
                [RecordInput(t) for name, _, _, t in rows if name == tenant],
                resolved.rules,
                T0_MS + number * 10_000,
            )
            panes += [
                (tenant, p.window_id, p.pane_index, p.count, p.is_final) for p in result.panes
            ]
        expected.append(sorted(panes))
        if number == 0:
            json_blob = json_layout_blob(
                list(alone), [json.dumps(state.to_json_dict()) for state in alone.values()]
            )

    assert expected[1] and expected[2], "both resumed batches fire panes"
    blob = json_blob
    for number, rows in enumerate(batches[1:], start=1):
        keys = BucketState.from_bytes(blob)
        out = _run_bucket(routed_records(rows), keys, registry, T0_MS + number * 10_000)
        panes = out[out["kind"] == "windows"]
        columns = ["tenant", "window_id", "pane_index", "count", "is_final"]
        got = panes[columns].itertuples(index=False, name=None)
        assert sorted(got) == expected[number]
        blob = keys.to_bytes()
    resumed = BucketState.from_bytes(blob)
    for tenant, state in alone.items():
        assert resumed.get((tenant, "web")).key_state == state
