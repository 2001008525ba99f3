"""A bucket of many keys gives each key exactly what processing that key alone would (no Spark).

The stateful stage runs one call per hash bucket; these tests drive that call's logic directly
with a pandas batch in the routed schema, interleaving many keys' records across partitions.
"""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd

from streaming.bucket_state import BucketState
from streaming.keyed_state import _Output, _process_bucket, _sorted_batch
from streaming.windowing import KeyState, RecordInput, advance
from tenants.registry import TenantRegistry, load_registry

ROOT = Path(__file__).resolve().parents[1]
T0_MS = 1_767_225_600_000


def _registry_with(tmp_path: Path, tenants: list[str]) -> TenantRegistry:
    conf = tmp_path / "conf"
    (conf / "tenants").mkdir(parents=True)
    (conf / "sources.yaml").write_text((ROOT / "conf" / "sources.yaml").read_text())
    for tenant in tenants:
        (conf / "tenants" / f"{tenant}.yaml").write_text(f"id: {tenant}\nsources: [web]\n")
    return load_registry(conf)


def _routed(rows: list[tuple[str | None, int, int, int]]) -> pd.DataFrame:
    """Routed records: (tenant or None for a malformed one, partition, offset, event time)."""
    return pd.DataFrame(
        {
            "tenant": [tenant for tenant, _, _, _ in rows],
            "source": ["web" if tenant else None for tenant, _, _, _ in rows],
            "key": [b"k"] * len(rows),
            "value": [b"{}"] * len(rows),
            "topic": "events",
            "partition": [partition for _, partition, _, _ in rows],
            "offset": [offset for _, _, offset, _ in rows],
            "kafka_timestamp_ms": T0_MS,
            "event_time_ms": pd.array([t if tenant else None for tenant, _, _, t in rows], "Int64"),
            "event_id": None,
            "metric_inputs_json": None,
            "reason": [None if tenant else "malformed_json" for tenant, _, _, _ in rows],
            "error": [None if tenant else "truncated" for tenant, _, _, _ in rows],
        }
    )


def _run_bucket(
    batch: pd.DataFrame, keys: BucketState, registry: TenantRegistry, now_ms: int
) -> pd.DataFrame:
    out = _Output(_sorted_batch([batch]))
    _process_bucket(out.batch, keys, registry, now_ms, out)
    return out.frame()


def test_many_keys_in_one_bucket_match_each_key_processed_alone(tmp_path: Path) -> None:
    tenants = [f"t{n:03d}" for n in range(200)]
    registry = _registry_with(tmp_path, tenants)
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
        outputs.append(_run_bucket(_routed(rows), keys, registry, T0_MS + index * 10_000))

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


def test_an_unknown_key_is_quarantined_and_keeps_no_state(tmp_path: Path) -> None:
    registry = _registry_with(tmp_path, ["acme"])
    keys = BucketState()
    out = _run_bucket(
        _routed([("acme", 0, 0, T0_MS), ("gone", 0, 1, T0_MS)]), keys, registry, T0_MS
    )
    rejected = out[out["kind"] == "quarantine"]
    assert list(rejected["tenant"]) == ["gone"]
    assert list(rejected["reason"]) == ["unknown_source"]
    assert keys.keys() == {("acme", "web")}


def test_an_idle_key_closes_its_windows_while_its_bucket_neighbour_sends(tmp_path: Path) -> None:
    registry = _registry_with(tmp_path, ["quiet", "busy"])  # web: idle_timeout 2m, lateness 1m
    keys = BucketState()
    _run_bucket(
        _routed([("quiet", 0, 0, T0_MS + 5_000), ("busy", 0, 1, T0_MS)]), keys, registry, T0_MS
    )
    assert keys.get(("quiet", "web")).key_state.windows

    later_ms = T0_MS + 10 * 60_000  # far past idle_timeout + window end + allowed lateness
    out = _run_bucket(_routed([("busy", 0, 2, later_ms)]), keys, registry, later_ms)

    quiet = out[(out["tenant"] == "quiet") & (out["kind"] == "windows")]
    assert list(quiet["is_final"]) == [True]
    assert not keys.get(("quiet", "web")).key_state.windows
    # busy opened a window in this batch: the bucket is due again when busy has idled that long.
    assert keys.next_idle_deadline_ms() == later_ms + 120_000


def test_an_idle_key_whose_config_is_gone_keeps_its_state_and_stops_waking_its_bucket(
    tmp_path: Path,
) -> None:
    before = _registry_with(tmp_path / "before", ["quiet"])  # web: idle_timeout 2m
    keys = BucketState()
    _run_bucket(_routed([("quiet", 0, 0, T0_MS + 5_000)]), keys, before, T0_MS)
    assert keys.next_idle_deadline_ms() == T0_MS + 120_000

    after = _registry_with(tmp_path / "after", ["other"])  # quiet's file was removed
    out = _run_bucket(_routed([]), keys, after, T0_MS + 10 * 60_000)

    assert out.empty
    assert keys.get(("quiet", "web")).key_state.windows, "its state is kept"
    assert keys.next_idle_deadline_ms() is None
