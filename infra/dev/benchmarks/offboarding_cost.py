"""What offboarding costs: a bucket woken with no records, and the driver's configured-key diff.

    .venv/bin/python -m infra.dev.benchmarks.offboarding_cost --tenants 100000 --buckets 64

With `--tenants` tenants of one source each, read from a published snapshot as executors read
it, it prints per step the median of `--repeat` runs (wall and CPU seconds):

- `bucket wake: config unchanged`: one bucket's share of keys (tenants / buckets), woken by its
  timeout with no records, config fingerprint as last checked: what every bucket pays each
  `config_recheck_interval`;
- `bucket wake: config changed`: the same bucket after a config change that removed one of its
  keys: every key is resolved once (first use of the new snapshot in the process), one closed;
- `bucket wake: changed, warm`: the same with the snapshot's tenants already validated in the
  process (the other buckets of a process after its first);
- `driver: configured-key diff`: the sink's diff of two snapshots' keys after one tenant file
  was added (on the driver, once per config change).

Timings are wall clock on a shared machine: compare rows of one run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import pandas as pd

from streaming.state.bucket_processor import _EMPTY_BATCH_COLUMNS, _process_bucket
from streaming.state.bucket_state import BucketState
from streaming.state.configured_status import newly_configured_keys
from streaming.state.union_rows import UnionRows
from streaming.windowing.key_state import KeyState, RecordInput
from streaming.windowing.key_windows import advance
from tenants.config_store import registry_from_snapshot, snapshot_bytes
from tenants.models import SourceConfig, TenantConfig
from tenants.registry import TenantRegistry

T0_MS = 1_767_225_600_000
SOURCE = SourceConfig.model_validate(
    {
        "event_time": {"field": "ts", "format": "epoch_ms"},
        "window": {"kind": "tumbling", "size": "1m"},
        "out_of_orderness": "10s",
        "allowed_lateness": "1m",
    }
)


def _registry(tenant_ids: list[str], fingerprint: str) -> TenantRegistry:
    """A registry as executors get it: read back from a snapshot, tenants validated lazily."""
    built = TenantRegistry.build(
        {"web": SOURCE},
        {t: TenantConfig.model_validate({"id": t, "sources": ["web"]}) for t in tenant_ids},
        fingerprint,
    )
    return registry_from_snapshot(snapshot_bytes(built), fingerprint)


def _bucket_blob(keys: list[str], registry: TenantRegistry) -> bytes:
    bucket = BucketState()
    rules = registry.resolve(keys[0], "web")
    assert rules is not None
    for index, tenant in enumerate(keys):
        state = KeyState()
        advance(state, [RecordInput(T0_MS + index % 50_000)], rules.rules, T0_MS)
        bucket.get((tenant, "web")).key_state = state
    bucket.checked_fingerprint = registry.fingerprint
    return bucket.to_bytes()


def _wake(blob: bytes, registry: TenantRegistry) -> int:
    keys = BucketState.from_bytes(blob)
    out = UnionRows(pd.DataFrame(columns=_EMPTY_BATCH_COLUMNS))
    _process_bucket(out.batch, keys, registry, T0_MS + 5_000, out)
    keys.to_bytes()
    rows: int = out.table().num_rows
    return rows


def _timed(step: Callable[[], object], repeat: int) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tenants", type=int, default=100_000)
    parser.add_argument("--buckets", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tenant_ids = [f"t{n:06d}" for n in range(args.tenants)]
    share = tenant_ids[:: args.buckets]  # one bucket's keys
    before = _registry(tenant_ids, "before")
    blob = _bucket_blob(share, before)
    removed = share[len(share) // 2]
    rows: list[tuple[str, tuple[float, float]]] = []

    rows.append(("bucket wake: config unchanged", _timed(lambda: _wake(blob, before), args.repeat)))
    remaining = [t for t in tenant_ids if t != removed]
    # A registry object whose tenants are validated on first use, as in a process that has not
    # read the new snapshot yet; the snapshot's parse is not timed (`config_scale` has it).
    cold = _registry(remaining, "after")
    rows.append(("bucket wake: config changed", _timed(lambda: _wake(blob, cold), 1)))
    rows.append(("bucket wake: changed, warm", _timed(lambda: _wake(blob, cold), args.repeat)))
    previous, added = _registry(tenant_ids, "b"), _registry([*tenant_ids, "newco"], "added")
    rows.append(
        (
            "driver: configured-key diff",
            _timed(lambda: newly_configured_keys(previous, added), 1),
        )
    )
    print(f"{args.tenants:,} tenants, {args.buckets} buckets: {len(share):,} keys in the bucket")
    print(f"{'step':<32} {'wall s':>8} {'cpu s':>8}")
    for name, (wall_s, cpu_s) in rows:
        print(f"{name:<32} {wall_s:>8.4f} {cpu_s:>8.4f}")


if __name__ == "__main__":
    main()
