"""Tenant config at scale: load, change detection, snapshot publish and executor reads.

    .venv/bin/python -m infra.dev.benchmarks.config_scale --tenants 1000 10000 100000

For each size it writes that many tenant files (fixed seed) into a temporary `conf/`, next to
the project's `conf/sources.yaml`, and prints one row per step:

- `load`: `load_registry` of the whole directory, and the driver's resident memory after it;
- `watch: first`: the watcher's first refresh (read everything, publish the first snapshot);
- `watch: idle`: a refresh when nothing changed (what the 1-second poll costs);
- `watch: touch`: a refresh after one file's mtime changed but not its content;
- `watch: 1 file`: a refresh after one tenant file changed (detect, reload, publish);
- `watch: 1 bad`: a refresh after one tenant file became invalid (refused, nothing published);
- `publish`: publishing the registry as a snapshot into an empty folder;
- `snapshot: first task`: in a fresh Python process, `registry_at` as an executor's first task;
- `snapshot: next task`: the same in that process for a new unpickled `ConfigSnapshots`, as
  every later Spark task does;
- `resolve: first` / `resolve: again`: mean cost per `resolve(tenant, source)` for 1,000
  distinct keys on first use, then for the same keys again.

With `--listed 10000 100000 1000000` it measures tenant lists instead: that many tenants in one
`tenant_lists/*.csv`, all naming one rule set of `rule_sets.yaml`, beside no tenant files:

- `load`: `load_registry`, with the resident memory it added; `load: allocated`: the same load
  under tracemalloc, the registry's own bytes per tenant (tracemalloc slows it, so it is timed
  apart); `yaml: allocated` is that figure for tenant files (`--yaml-baseline` of them);
- `watch: first`, `watch: idle`, `watch: +100 rows` (the list grew and is read again),
  `watch: 1 bad row` (refused, the last good config stays);
- `publish`, `snapshot: first task`, `snapshot: next task`, `resolve: ...` as above.

Files are dated an hour back, as tenant files that have been there a while are; only the files a
step changes are new. Timings are wall clock on a shared machine: compare rows of one run.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import TypeVar

from infra.dev.local_process import rss_mib
from tenants.conf_reader import load_registry
from tenants.config_store import ConfigSnapshots, ConfigWatcher
from tenants.registry import TenantRegistry
from tenants.tenant_lists import RULE_SETS_FILE, TENANT_LISTS_DIR

ROOT = Path(__file__).resolve().parents[3]
SEED = 20_240_601
SOURCES = ("web", "billing")
RESOLVE_SAMPLE = 1_000
ResultT = TypeVar("ResultT")


@dataclass(frozen=True)
class Took:
    """Wall-clock and CPU seconds of one step; CPU time is the steadier on a shared machine."""

    wall_s: float
    cpu_s: float

    def per(self, count: int) -> Took:
        return Took(self.wall_s / count, self.cpu_s / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tenants", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument(
        "--listed", type=int, nargs="+", help="measure tenant lists of these sizes instead"
    )
    parser.add_argument(
        "--yaml-baseline",
        type=int,
        default=10_000,
        help="with --listed: tenant files whose bytes per tenant are the baseline",
    )
    parser.add_argument("--read-snapshot", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read_snapshot:
        print(json.dumps(_read_snapshot_in_this_process(args.read_snapshot)))
        return
    print(f"{'tenants':>8}  {'step':<22} {'wall s':>10} {'CPU s':>10}  note")
    if args.listed:
        _in_a_workdir(functools.partial(_measure_yaml_bytes, args.yaml_baseline))
        for count in args.listed:
            _in_a_workdir(functools.partial(_measure_listed, count))
        return
    for count in args.tenants:
        _in_a_workdir(functools.partial(_measure, count))


def _in_a_workdir(measure: Callable[[Path], None]) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="tw-config-scale-"))
    try:
        measure(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _row(count: int, step: str, took: Took, note: str = "") -> None:
    print(f"{count:>8}  {step:<22} {took.wall_s:>10.6f} {took.cpu_s:>10.6f}  {note}", flush=True)


def _allocated(action: Callable[[], ResultT]) -> tuple[ResultT, int, Took]:
    """`action`'s result, the bytes it left allocated (tracemalloc) and how long it took."""
    gc.collect()
    tracemalloc.start()
    try:
        result, took = _timed(action)
        gc.collect()
        allocated, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, allocated, took


def _measure_yaml_bytes(count: int, workdir: Path) -> None:
    conf = workdir / "conf"
    _write_conf(conf, count, random.Random(SEED))
    registry, allocated, took = _allocated(lambda: load_registry(conf))
    note = (
        f"{allocated / count:,.0f} B per tenant file (tracemalloc), {len(registry.tenants)} tenants"
    )
    _row(count, "yaml: allocated", took, note)


def _measure_listed(count: int, workdir: Path) -> None:
    conf = workdir / "conf"
    tenant_ids = _write_listed_conf(conf, count)
    listed = conf / TENANT_LISTS_DIR / "customers.csv"
    gc.collect()
    rss_before = rss_mib(os.getpid())
    registry, took = _timed(lambda: load_registry(conf))
    rss_added = rss_mib(os.getpid()) - rss_before
    _row(count, "load", took, f"+{rss_added:.0f} MiB resident, {len(registry.tenants)} tenants")
    del registry
    _, allocated, took = _allocated(lambda: load_registry(conf))
    note = f"{allocated / 2**20:.0f} MiB, {allocated / count:.0f} B per tenant (tracemalloc)"
    _row(count, "load: allocated", took, note)

    watcher = ConfigWatcher(conf, ConfigSnapshots(str(workdir / "snapshots")))
    published, took = _timed(lambda: watcher.refresh(1_000))
    _row(count, "watch: first", took, "published" if published else "NOT published")
    _, took = _timed(lambda: watcher.refresh(1_001))
    _row(count, "watch: idle", took)
    with listed.open("a") as rows:
        rows.writelines(f"new-{number:03d},standard\n" for number in range(100))
    published, took = _timed(lambda: watcher.refresh(1_002))
    _row(count, "watch: +100 rows", took, "published" if published else "NOT published")
    assert published is not None and published.knows_tenant("new-099")
    with listed.open("a") as rows:
        rows.write("new-bad,no_such_rule_set\n")
    refused, took = _timed(lambda: watcher.refresh(1_003))
    _row(count, "watch: 1 bad row", took, "refused" if refused is None else "published (wrong)")

    snapshots = ConfigSnapshots(str(workdir / "published"))
    _, took = _timed(lambda: snapshots.publish(published, effective_from_ms=0))
    size = sum(p.stat().st_size for p in (workdir / "published").iterdir())
    _row(
        count, "publish", took, f"snapshot file {size / 2**20:.1f} MiB, {size / count:.1f} B/tenant"
    )
    _read_in_a_fresh_process(count, snapshots)
    assert tenant_ids


def _write_listed_conf(conf: Path, count: int) -> list[str]:
    (conf / TENANT_LISTS_DIR).mkdir(parents=True)
    shutil.copy(ROOT / "conf" / "sources.yaml", conf / "sources.yaml")
    (conf / RULE_SETS_FILE).write_text("rule_sets:\n  standard:\n    sources: [web, billing]\n")
    tenant_ids = [f"tenant-{number:07d}" for number in range(count)]
    listed = conf / TENANT_LISTS_DIR / "customers.csv"
    with listed.open("w") as rows:
        rows.write("tenant_id,rule_set\n")
        rows.writelines(f"{tenant},standard\n" for tenant in tenant_ids)
    an_hour_ago_ns = time.time_ns() - 3_600 * 10**9
    for path in (listed, conf / "sources.yaml", conf / RULE_SETS_FILE):
        os.utime(path, ns=(an_hour_ago_ns, an_hour_ago_ns))
    return tenant_ids


def _measure(count: int, workdir: Path) -> None:
    conf = workdir / "conf"
    tenant_ids = _write_conf(conf, count, random.Random(SEED))

    def row(step: str, took: Took, note: str = "") -> None:
        _row(count, step, took, note)

    registry, seconds = _timed(lambda: load_registry(conf))
    row(
        "load",
        seconds,
        f"driver RSS {rss_mib(os.getpid()):.0f} MiB, {len(registry.tenants)} tenants",
    )
    del registry

    watcher = ConfigWatcher(conf, ConfigSnapshots(str(workdir / "snapshots")))
    clock_ms = 1_000
    published, seconds = _timed(lambda: watcher.refresh(clock_ms))
    row("watch: first", seconds, "published" if published else "NOT published")
    _, seconds = _timed(lambda: watcher.refresh(clock_ms + 1))
    row("watch: idle", seconds)

    changed = conf / "tenants" / f"{tenant_ids[count // 2]}.yaml"
    os.utime(changed)
    published, seconds = _timed(lambda: watcher.refresh(clock_ms + 2))
    row("watch: touch", seconds, "published (wrong)" if published else "nothing to publish")

    changed.write_text(f"id: {tenant_ids[count // 2]}\nsources:\n  web: {{allowed_lateness: 7m}}\n")
    published, seconds = _timed(lambda: watcher.refresh(clock_ms + 3))
    row("watch: 1 file", seconds, "published" if published else "NOT published")
    assert published is not None
    route = published.resolve(tenant_ids[count // 2], "web")
    assert route is not None and route.rules.allowed_lateness_ms == 420_000

    bad = conf / "tenants" / f"{tenant_ids[count // 3]}.yaml"
    bad.write_text(f"id: {tenant_ids[count // 3]}\nsources:\n  web: {{allowed_lateness: 1y}}\n")
    refused, seconds = _timed(lambda: watcher.refresh(clock_ms + 4))
    row("watch: 1 bad", seconds, "refused" if refused is None else "published (wrong)")

    snapshots = ConfigSnapshots(str(workdir / "published"))
    _, seconds = _timed(lambda: snapshots.publish(published, effective_from_ms=0))
    size_mib = sum(p.stat().st_size for p in (workdir / "published").iterdir()) / 2**20
    row("publish", seconds, f"snapshot file {size_mib:.1f} MiB")
    _read_in_a_fresh_process(count, snapshots)


def _read_in_a_fresh_process(count: int, snapshots: ConfigSnapshots) -> None:
    def row(step: str, took: Took, note: str = "") -> None:
        _row(count, step, took, note)

    reader = subprocess.run(
        [
            sys.executable,
            "-m",
            "infra.dev.benchmarks.config_scale",
            "--read-snapshot",
            snapshots.root,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=1_800,
    )
    figures = json.loads(reader.stdout)
    row("snapshot: first task", Took(*figures["first_task"]), f"RSS {figures['rss_mib']:.0f} MiB")
    row("snapshot: next task", Took(*figures["next_task"]), "new unpickled ConfigSnapshots")
    for step in ("first", "again"):
        per_key = Took(*figures[f"resolve_{step}"])
        row(
            f"resolve: {step}",
            per_key,
            f"{per_key.wall_s * 1e6:.2f} µs per key, of {RESOLVE_SAMPLE}",
        )
    every_key = figures["every_key"]
    row(
        "resolve: every key",
        Took(*figures["route_every_key"]),
        f"{figures['route_bytes_per_key']:.0f} B per key kept (tracemalloc), {every_key} keys",
    )
    row("gc: full collection", Took(*figures["full_collection"]), f"after routing {every_key} keys")


def _read_snapshot_in_this_process(root: str) -> dict[str, object]:
    """What an executor's Python worker does: its first task, then every later one."""
    snapshots = ConfigSnapshots(root)
    registry, first_task = _timed(lambda: snapshots.registry_at(2**62))
    next_copy: ConfigSnapshots = pickle.loads(pickle.dumps(snapshots))
    _, next_task = _timed(lambda: next_copy.registry_at(2**62))
    tenant_ids = sorted(registry.tenants)[:: max(1, len(registry.tenants) // RESOLVE_SAMPLE)]
    keys = [(tenant, source) for tenant in tenant_ids[:RESOLVE_SAMPLE] for source in ("web",)]

    def resolve_all() -> int:
        return sum(registry.resolve(tenant, source) is not None for tenant, source in keys)

    found, resolve_first = _timed(resolve_all)
    _, resolve_again = _timed(resolve_all)
    assert found > 0
    rss = rss_mib(os.getpid())
    every_key, routes_allocated, routing_all = _allocated(lambda: _route_every_key(registry))
    # PySpark's worker runs a full collection after every task: what the routes cost it.
    _, collection = _timed(gc.collect)
    return {
        "first_task": astuple(first_task),
        "next_task": astuple(next_task),
        "resolve_first": astuple(resolve_first.per(len(keys))),
        "resolve_again": astuple(resolve_again.per(len(keys))),
        "rss_mib": rss,
        "every_key": every_key,
        "route_bytes_per_key": routes_allocated / every_key,
        "route_every_key": astuple(routing_all.per(every_key)),
        "full_collection": astuple(collection),
    }


def _route_every_key(registry: TenantRegistry) -> int:
    """Routes every configured key with key strings of its own, as a worker that has seen each
    key in some batch holds them; the number of keys."""
    keys = [(t.encode().decode(), s.encode().decode()) for t, s in registry.configured_keys()]
    return sum(registry.resolve(tenant, source) is not None for tenant, source in keys)


def _write_conf(conf: Path, count: int, rng: random.Random) -> list[str]:
    (conf / "tenants").mkdir(parents=True)
    shutil.copy(ROOT / "conf" / "sources.yaml", conf / "sources.yaml")
    an_hour_ago_ns = time.time_ns() - 3_600 * 10**9
    tenant_ids = [f"tenant-{number:06d}" for number in range(count)]
    for tenant in tenant_ids:
        path = conf / "tenants" / f"{tenant}.yaml"
        path.write_text(_tenant_yaml(tenant, rng))
        os.utime(path, ns=(an_hour_ago_ns, an_hour_ago_ns))
    os.utime(conf / "sources.yaml", ns=(an_hour_ago_ns, an_hour_ago_ns))
    return tenant_ids


def _tenant_yaml(tenant: str, rng: random.Random) -> str:
    sources = [name for name in SOURCES if rng.random() < 0.8] or ["web"]
    lines = [f"id: {tenant}", "sources:"]
    for name in sources:
        overrides = []
        if rng.random() < 0.3:
            overrides.append(f"allowed_lateness: {rng.randint(1, 10)}m")
        if rng.random() < 0.2:
            overrides.append(f"window: {{kind: tumbling, size: {rng.choice([1, 5, 15])}m}}")
        lines.append(f"  {name}: {{{', '.join(overrides)}}}")
    return "\n".join(lines) + "\n"


def _timed(action: Callable[[], ResultT]) -> tuple[ResultT, Took]:
    started_wall, started_cpu = time.perf_counter(), time.process_time()
    result = action()
    return result, Took(time.perf_counter() - started_wall, time.process_time() - started_cpu)


if __name__ == "__main__":
    main()
