"""Tenant lists: many tenants from one CSV, each naming a rule set defined once.

Real files in `tmp_path`; reads are counted through the reader's injected `read_bytes`.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import shutil
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.cli.main import main
from tenants.conf_reader import ConfReader, load_registry, load_tenant
from tenants.config_store import (
    ConfigSnapshots,
    ConfigWatcher,
    registry_from_snapshot,
    snapshot_bytes,
)
from tenants.offboard_config import offboard_tenant
from tenants.registry import ConfigError, TenantRegistry
from tenants.tenant_lists import TenantDirectory
from tests.support.sample_conf import SAMPLE_CONF

AN_HOUR_NS = 3_600 * 10**9
RULE_SETS = """\
rule_sets:
  standard:
    sources: [web, billing]
  slow_web:
    sources:
      web: {window: {kind: tumbling, size: 5m}}
    quota: {records_per_second: 10, burst: 100}
"""


class CountingReads:
    """`Path.read_bytes` that remembers which files it read."""

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def __call__(self, path: Path) -> bytes:
        self.paths.append(path)
        return path.read_bytes()


def age(path: Path) -> None:
    then_ns = time.time_ns() - AN_HOUR_NS
    os.utime(path, ns=(then_ns, then_ns))


def write_list(conf: Path, name: str, text: str) -> Path:
    path = conf / "tenant_lists" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    age(path)
    return path


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    """The sample sources, one tenant file (acme) and a list of three tenants."""
    conf = tmp_path / "conf"
    (conf / "tenants").mkdir(parents=True)
    shutil.copy(SAMPLE_CONF / "sources.yaml", conf / "sources.yaml")
    shutil.copy(SAMPLE_CONF / "tenants" / "acme.yaml", conf / "tenants" / "acme.yaml")
    (conf / "rule_sets.yaml").write_text(RULE_SETS)
    for path in (conf / "sources.yaml", conf / "tenants" / "acme.yaml", conf / "rule_sets.yaml"):
        age(path)
    write_list(conf, "customers.csv", "tenant_id,rule_set\nu1,standard\nu2,standard\nu3,slow_web\n")
    return conf


def refusal(conf: Path) -> str:
    with pytest.raises(ConfigError) as refused:
        load_registry(conf)
    return str(refused.value)


def test_listed_tenants_route_with_their_rule_set_and_share_one_object(conf: Path) -> None:
    registry = load_registry(conf)
    assert sorted(registry.tenants) == ["acme", "u1", "u2", "u3"]
    assert registry.knows_tenant("u1") and not registry.knows_tenant("u4")
    u1, u2 = registry.resolve("u1", "web"), registry.resolve("u2", "web")
    acme = registry.resolve("acme", "web")
    assert u1 is not None and u2 is not None and acme is not None
    # Unchanged rules are the source's own, as for a tenant file that overrides nothing.
    assert u1.rules is u2.rules is acme.rules and u1.rules_id == acme.rules_id
    slow = registry.resolve("u3", "web")
    assert slow is not None and slow.rules.window.size_ms == 300_000  # type: ignore[union-attr]
    assert registry.resolve("u3", "billing") is None  # slow_web sends web only
    assert registry.quota_of("u3") is not None and registry.quota_of("u1") is None
    assert registry.sets_any_quota
    # Configs built on demand share the rule set's frozen parts.
    assert registry.tenants["u1"].sources is registry.tenants["u2"].sources
    assert registry.tenants["u1"].id == "u1"
    assert load_tenant(conf, "u3") == registry.tenants["u3"]


def test_one_listed_tenant_is_read_from_its_row_without_reading_the_rest(conf: Path) -> None:
    # Another tenant's broken file or row would stop a whole-directory read; one listed
    # tenant's lookup reads its own row (and the rule sets) only.
    (conf / "tenants" / "broken.yaml").write_text("id: [not, an, id]\n")
    write_list(conf, "more.csv", "tenant_id,rule_set\nv1,slow_web\r\nbad row,x,y\nv10,standard")
    v1 = load_tenant(conf, "v1")
    assert v1 is not None and v1.id == "v1" and v1.quota is not None
    v10 = load_tenant(conf, "v10")
    assert v10 is not None and v10.quota is None and set(v10.sources) == {"web", "billing"}
    with pytest.raises(ConfigError, match=r"broken\.yaml"):
        load_tenant(conf, "nobody")  # unknown: only the whole directory can say so


@pytest.mark.parametrize(
    ("rows", "refused"),
    [
        ('"v1",slow_web\n', None),  # quoted: the whole list's reading finds it
        (" v1 , slow_web\n", None),  # padded
        ("v1,slow_web\nv1,standard\n", "listed twice"),
        ("v1,fast_web\n", "unknown rule set 'fast_web'"),
        ("v1,slow_web,extra\n", "has 3 fields"),
    ],
)
def test_a_listed_tenant_in_a_row_that_is_not_plain_is_decided_as_the_registry_decides(
    conf: Path, rows: str, refused: str | None
) -> None:
    write_list(conf, "more.csv", "tenant_id,rule_set\nv10,standard\n" + rows)
    if refused is None:
        assert load_tenant(conf, "v1") == load_registry(conf).tenants["v1"]
        return
    with pytest.raises(ConfigError, match=refused):
        load_tenant(conf, "v1")


def test_a_tenant_in_two_lists_is_refused_by_its_lookup_too(conf: Path) -> None:
    write_list(conf, "more.csv", "tenant_id,rule_set\nu2,slow_web\n")
    with pytest.raises(ConfigError, match="also listed in"):
        load_tenant(conf, "u2")


def test_tenants_of_one_rule_set_share_its_rules_when_they_change_them(conf: Path) -> None:
    write_list(conf, "more.csv", "tenant_id,rule_set\nv1,slow_web\nv2,slow_web\n")
    registry = load_registry(conf)
    first, second = registry.resolve("v1", "web"), registry.resolve("v2", "web")
    assert first is not None and second is not None
    assert first.rules is second.rules and first.rules_id == second.rules_id


def test_routing_many_keys_leaves_the_cycle_collector_nothing_per_key(conf: Path) -> None:
    """PySpark's worker runs a full collection after every task, and it walks every object the
    route memo keeps per key: at 100,000 keys that was 65-90 ms a collection."""
    keys = 5_000
    tenants = [f"m{n:05d}" for n in range(keys)]
    write_list(
        conf, "many.csv", "tenant_id,rule_set\n" + "".join(f"{t},slow_web\n" for t in tenants)
    )
    registry = load_registry(conf)
    gc.collect()
    gc.freeze()  # what existed before routing is not this test's
    try:
        routes = [registry.resolve(tenant, "web") for tenant in tenants]
        gc.collect()
        walked = len(gc.get_objects())
    finally:
        gc.unfreeze()
    assert walked < keys / 10
    # Every key still routes with its rule set's rules, and with none but its own sources.
    assert all(route is not None and route.rules.window.size_ms == 300_000 for route in routes)
    assert registry.resolve(tenants[0], "billing") is None


def test_a_tenant_both_listed_and_in_a_file_is_refused_naming_both(conf: Path) -> None:
    write_list(conf, "customers.csv", "tenant_id,rule_set\nu1,standard\nacme,standard\n")
    message = refusal(conf)
    assert f"{conf / 'tenants' / 'acme.yaml'}: id: tenant 'acme' is also listed in" in message
    assert f"{conf / 'tenant_lists' / 'customers.csv'} (line 3)" in message
    assert "remove it from one of them" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("id,profile\nu1,standard\n", "line 1: the first line must be the header"),
        ("tenant_id,rule_set\nu1,standard\nU2,standard\n", "line 3: tenant_id: 'U2' must match"),
        ("tenant_id,rule_set\nu1,standard,extra\n", "line 2: has 3 fields"),
        ("tenant_id,rule_set\nu1,Standard!\n", "line 2: rule_set: 'Standard!' must match"),
        (
            "tenant_id,rule_set\nu1,standard\nu2,standard\nu1,slow_web\n",
            "line 4: tenant_id: tenant 'u1' is listed twice (first on line 2)",
        ),
        (
            "tenant_id,rule_set\nu1,standrad\n",
            "line 2: rule_set: unknown rule set 'standrad'; did you mean `standard`?",
        ),
        ("tenant_id,rule_set\nu1,gold\n", "line 2: rule_set: unknown rule set 'gold'; "),
    ],
)
def test_a_bad_list_is_refused_with_file_line_field_and_problem(
    conf: Path, text: str, expected: str
) -> None:
    write_list(conf, "customers.csv", text)
    assert f"{conf / 'tenant_lists' / 'customers.csv'}: {expected}" in refusal(conf)


def test_a_list_as_exports_write_it_is_read(conf: Path) -> None:
    # A byte order mark, CRLF line ends, quoted and padded fields, a blank line.
    text = '\ufefftenant_id,rule_set\r\n"u1", standard\r\n\r\nu2,"slow_web"\r\n'
    (conf / "tenant_lists" / "customers.csv").write_bytes(text.encode())
    registry = load_registry(conf)
    assert sorted(registry.tenants) == ["acme", "u1", "u2"]
    assert registry.quota_of("u2") is not None


def test_a_tenant_in_two_lists_is_refused_naming_both_lines(conf: Path) -> None:
    write_list(conf, "more.csv", "tenant_id,rule_set\nv1,standard\nu2,slow_web\n")
    message = refusal(conf)
    assert (
        f"{conf / 'tenant_lists' / 'more.csv'}: line 3: tenant_id: tenant 'u2' is also" in message
    )
    assert f"{conf / 'tenant_lists' / 'customers.csv'} (line 3)" in message


def test_a_rule_set_naming_an_unknown_source_is_refused(conf: Path) -> None:
    (conf / "rule_sets.yaml").write_text("rule_sets:\n  standard:\n    sources: [web, mobile]\n")
    assert f"{conf / 'rule_sets.yaml'}: rule_sets.standard.sources.mobile: unknown source" in (
        refusal(conf)
    )
    (conf / "rule_sets.yaml").write_text(
        "rule_sets:\n  standard:\n    sources: {web: {windw: 1}}\n"
    )
    assert "rule_sets.standard.sources.web.windw: Extra inputs are not permitted; did you mean" in (
        refusal(conf)
    )


def test_a_list_is_read_again_only_when_its_stat_changes(conf: Path) -> None:
    reads = CountingReads()
    reader = ConfReader(conf, read_bytes=reads)
    first = reader.load()
    assert len(first.tenants) == 4
    reads.paths.clear()
    assert reader.load() is first  # nothing changed: nothing read, the same registry
    assert reads.paths == []
    # A tenant file changes: the list is not read again.
    acme = conf / "tenants" / "acme.yaml"
    acme.write_text(acme.read_text() + "\n")
    age(acme)
    reader.load()
    assert reads.paths == [acme]
    # New tenants appended to the list: only the list is read.
    reads.paths.clear()
    listed = conf / "tenant_lists" / "customers.csv"
    listed.write_text(listed.read_text() + "u4,standard\n")
    age(listed)
    grown = reader.load()
    assert reads.paths == [listed]
    assert grown.knows_tenant("u4") and grown.fingerprint != first.fingerprint
    assert reader.last_changed == (listed,)


def test_a_watcher_publishes_new_list_tenants_and_keeps_the_last_good_list(
    conf: Path, tmp_path: Path
) -> None:
    snapshots = ConfigSnapshots(str(tmp_path / "tenant_config"))
    watcher = ConfigWatcher(conf, snapshots)
    watcher.publish_at_start(now_ms=1_000)
    listed = conf / "tenant_lists" / "customers.csv"
    listed.write_text(listed.read_text() + "u4,standard\n")
    assert watcher.refresh(now_ms=2_000) is not None
    assert snapshots.registry_at(2_000).knows_tenant("u4")
    assert not snapshots.registry_at(1_500).knows_tenant("u4")
    listed.write_text(listed.read_text() + "u5,no_such_rules\n")
    assert watcher.refresh(now_ms=3_000) is None  # refused: the last good config stays
    in_force = snapshots.registry_at(3_000)
    assert in_force.knows_tenant("u4") and not in_force.knows_tenant("u5")


def test_a_snapshot_stores_each_rule_set_once_and_reads_back_every_route(conf: Path) -> None:
    write_list(
        conf, "many.csv", "tenant_id,rule_set\n" + "".join(f"m{n},standard\n" for n in range(500))
    )
    registry = load_registry(conf)
    data = snapshot_bytes(registry)
    snapshot = json.loads(data)
    assert list(snapshot["tenants"]) == ["acme"]
    assert sorted(snapshot["rule_sets"]) == ["slow_web", "standard"]
    assert len(snapshot["tenant_lists"]["standard"]) == 502
    # A listed tenant costs its id in the snapshot, a few bytes more than the id itself.
    assert len(data) < 2_000 + 14 * 502
    read_back = registry_from_snapshot(data, "snapshot.json")
    assert isinstance(read_back.tenants, TenantDirectory)
    assert read_back.fingerprint == registry.fingerprint
    assert sorted(read_back.tenants) == sorted(registry.tenants)
    for tenant, source in registry.configured_keys():
        assert read_back.resolve(tenant, source) == registry.resolve(tenant, source)
    assert set(read_back.configured_keys()) == set(registry.configured_keys())
    assert read_back.quota_of("u3") == registry.quota_of("u3")


def test_validate_counts_listed_tenants_and_offboard_says_to_delete_the_row(
    conf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tenants", "validate", "--conf", str(conf)]) == 0
    printed = capsys.readouterr().out
    assert "4 tenants (3 from tenant lists, 2 rule sets), 2 sources, 7 routes: OK" in printed
    with pytest.raises(ConfigError, match=r"customers.csv: line 3: tenant_id: tenant 'u2' is list"):
        offboard_tenant(conf, "u2")
    write_list(conf, "customers.csv", "tenant_id,rule_set\nu1,gold\n")
    assert main(["tenants", "validate", "--conf", str(conf)]) == 2
    assert "customers.csv: line 2: rule_set: unknown rule set 'gold'" in capsys.readouterr().err


LISTED = 100_000
# The million-tenant target is a registry of at most 300 MB loaded in at most 15 s: per tenant,
# 300 bytes and 15 us. Memory is measured by allocation (tracemalloc), which a busy machine
# does not change; time as CPU time, which it changes less than wall time.
BYTES_PER_TENANT = 300
CPU_US_PER_TENANT = 15


def _allocated_by(build: Callable[[], object]) -> tuple[int, object]:
    gc.collect()
    tracemalloc.start()
    try:
        built = build()
        gc.collect()
        allocated, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return allocated, built


def _cpu_s_of(build: Callable[[], object]) -> float:
    started = time.process_time()
    build()
    return time.process_time() - started


def test_a_list_of_100000_tenants_stays_within_the_million_tenant_budget(conf: Path) -> None:
    write_list(
        conf,
        "customers.csv",
        "tenant_id,rule_set\n" + "".join(f"c{n:07d},standard\n" for n in range(LISTED)),
    )
    allocated, registry = _allocated_by(lambda: load_registry(conf))
    assert isinstance(registry, TenantRegistry) and len(registry.tenants) == LISTED + 1
    load_cpu_s = _cpu_s_of(lambda: load_registry(conf))
    data = snapshot_bytes(registry)
    read_allocated, read_back = _allocated_by(lambda: registry_from_snapshot(data, "s.json"))
    read_cpu_s = _cpu_s_of(lambda: registry_from_snapshot(data, "s.json"))
    print(
        f"{LISTED:,} listed tenants: registry {allocated / LISTED:.0f} B/tenant, loaded in "
        f"{load_cpu_s:.2f} s CPU; snapshot {len(data) / LISTED:.1f} B/tenant, read back as "
        f"{read_allocated / LISTED:.0f} B/tenant in {read_cpu_s:.2f} s CPU"
    )
    assert allocated / LISTED <= BYTES_PER_TENANT
    assert read_allocated / LISTED <= BYTES_PER_TENANT
    assert load_cpu_s / LISTED * 1e6 <= CPU_US_PER_TENANT
    assert read_cpu_s / LISTED * 1e6 <= CPU_US_PER_TENANT
    assert len(data) / LISTED <= 20  # an id and its quotes, not a tenant's config
    assert isinstance(read_back, TenantRegistry)
    route = read_back.resolve(f"c{LISTED - 1:07d}", "web")
    assert route is not None and route == registry.resolve(f"c{LISTED - 1:07d}", "web")


def test_tenant_files_with_the_same_rules_share_one_validated_rule_set(conf: Path) -> None:
    body = "sources:\n  web: {allowed_lateness: 3m}\n  billing: {}\nquota: {records_per_second: 5, burst: 9}\n"
    for tenant in ("f1", "f2"):
        (conf / "tenants" / f"{tenant}.yaml").write_text(f"id: {tenant}\n{body}")
    (conf / "tenants" / "f3.yaml").write_text("id: f3\nsources:\n  web: {allowed_lateness: 4m}\n")
    registry = load_registry(conf)
    f1, f2, f3 = (registry.tenants[tenant] for tenant in ("f1", "f2", "f3"))
    assert f1.sources is f2.sources and f1.quota is f2.quota and f1.id == "f1"
    assert f3.sources is not f1.sources
    first, second = registry.resolve("f1", "web"), registry.resolve("f2", "web")
    assert first is not None and second is not None and first.rules == second.rules
    assert first.rules.allowed_lateness_ms == 180_000
    # A file that repeats another's rules with a bad id is still refused for its id.
    (conf / "tenants" / "f4.yaml").write_text(f"id: F4\n{body}")
    assert f"{conf / 'tenants' / 'f4.yaml'}: id: String should match pattern" in refusal(conf)


def _new_keys_by_sets(previous: TenantRegistry, current: TenantRegistry) -> set[tuple[str, str]]:
    return set(current.configured_keys()) - set(previous.configured_keys())


def test_keys_added_since_a_registry_are_what_a_diff_of_all_keys_gives(conf: Path) -> None:
    reader = ConfReader(conf)
    registries = [reader.load()]
    listed = conf / "tenant_lists" / "customers.csv"

    def change(path: Path, text: str) -> None:
        path.write_text(text)
        registries.append(reader.load())

    # A tenant moves to a rule set with another source; a new one joins; one leaves.
    change(listed, "tenant_id,rule_set\nu1,standard\nu3,standard\nu4,slow_web\n")
    # A rule set gains a source, for every tenant that names it.
    change(
        conf / "rule_sets.yaml",
        RULE_SETS.replace("      web: {window:", "      billing: {}\n      web: {window:"),
    )
    # A listed tenant gets a file of its own, with fewer sources; a file tenant moves to a list.
    (conf / "tenants" / "acme.yaml").unlink()
    (conf / "tenants" / "u1.yaml").write_text("id: u1\nsources: [web]\n")
    change(listed, "tenant_id,rule_set\nacme,slow_web\nu3,standard\nu4,slow_web\n")
    assert [len(registry.tenants) for registry in registries] == [4, 4, 4, 4]
    # Executors compare snapshots: those registries read their tenants from JSON.
    snapshots = [registry_from_snapshot(snapshot_bytes(r), "s.json") for r in registries]
    for history in (registries, snapshots):
        assert set(history[0].keys_added_since(None)) == set(history[0].configured_keys())
        for previous, current in itertools.pairwise(history):
            added = list(current.keys_added_since(previous))
            assert len(added) == len(set(added))
            assert set(added) == _new_keys_by_sets(previous, current)
            assert set(previous.keys_added_since(current)) == _new_keys_by_sets(current, previous)
    assert set(registries[2].keys_added_since(registries[1])) == {("u4", "billing")}
