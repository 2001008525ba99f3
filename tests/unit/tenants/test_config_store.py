"""Tenant config at scale: a change costs the changed file, and snapshots are read once.

Real files in `tmp_path`; reads are counted through the reader's injected `read_bytes`, which
still reads the file.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import time
from pathlib import Path

import pytest

from streaming.checkpoint.checkpoint_log import CheckpointLog
from tenants.conf_reader import ConfReader, load_registry
from tenants.config_store import (
    ConfigSnapshots,
    ConfigWatcher,
    registry_from_snapshot,
    snapshot_bytes,
)
from tenants.registry import ConfigError
from tests.support.sample_conf import SAMPLE_CONF

TENANTS = 40
AN_HOUR_NS = 3_600 * 10**9


class CountingReads:
    """`Path.read_bytes` that remembers which files it read."""

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def __call__(self, path: Path) -> bytes:
        self.paths.append(path)
        return path.read_bytes()


def age(path: Path, ago_ns: int = AN_HOUR_NS) -> None:
    # Tenant files that have been there a while; a file written just now is read again on each
    # scan until it is older than the filesystem's timestamp granularity allows to trust.
    then_ns = time.time_ns() - ago_ns
    os.utime(path, ns=(then_ns, then_ns))


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    conf = tmp_path / "conf"
    (conf / "tenants").mkdir(parents=True)
    shutil.copy(SAMPLE_CONF / "sources.yaml", conf / "sources.yaml")
    age(conf / "sources.yaml")
    for number in range(TENANTS):
        path = conf / "tenants" / f"t{number:03d}.yaml"
        path.write_text(f"id: t{number:03d}\nsources:\n  web: {{allowed_lateness: 1m}}\n")
        age(path)
    return conf


def tenant_file(conf: Path, number: int) -> Path:
    return conf / "tenants" / f"t{number:03d}.yaml"


def test_a_one_file_change_reads_and_validates_only_that_file(conf: Path) -> None:
    reads = CountingReads()
    reader = ConfReader(conf, read_bytes=reads)
    before = reader.load()
    assert len(reads.paths) == TENANTS + 1  # every tenant file and sources.yaml, once

    reads.paths.clear()
    assert reader.load() is before
    assert reads.paths == []  # nothing changed: stat only

    changed = tenant_file(conf, 7)
    changed.write_text("id: t007\nsources:\n  web: {allowed_lateness: 9m}\n")
    after = reader.load()
    assert reads.paths == [changed]
    assert reader.last_changed == (changed,)
    route = after.resolve("t007", "web")
    assert route is not None and route.rules.allowed_lateness_ms == 9 * 60_000
    # The other tenants are the very objects validated before: not validated again.
    assert all(after.tenants[t] is before.tenants[t] for t in before.tenants if t != "t007")
    assert after.fingerprint != before.fingerprint
    assert after.fingerprint == load_registry(conf).fingerprint


def test_fingerprint_follows_content_not_a_touch(conf: Path) -> None:
    reads = CountingReads()
    reader = ConfReader(conf, read_bytes=reads)
    first = reader.load()
    touched = tenant_file(conf, 3)

    reads.paths.clear()
    age(touched, ago_ns=AN_HOUR_NS // 2)  # a new mtime, the same content
    after_touch = reader.load()
    assert reads.paths == [touched]  # its stat changed, so it is read and its digest compared
    assert after_touch.fingerprint == first.fingerprint
    assert after_touch is first  # nothing validated again, nothing to publish
    assert reader.last_changed == ()

    # The same size, with the mtime set back to the old one: still a change of content.
    stat = touched.stat()
    touched.write_text(touched.read_text().replace("1m", "2m"))
    os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert touched.stat().st_size == stat.st_size
    after_edit = reader.load()
    assert after_edit.fingerprint != first.fingerprint
    route = after_edit.resolve("t003", "web")
    assert route is not None and route.rules.allowed_lateness_ms == 2 * 60_000


def test_a_file_written_moments_ago_is_read_on_each_scan_until_its_stat_can_be_trusted(
    conf: Path,
) -> None:
    # Written within the filesystem's timestamp granularity, a second write of the same size
    # could leave the stat as it was: so a recent file's content is compared on every scan.
    recent = tenant_file(conf, 5)
    recent.write_text("id: t005\nsources:\n  web: {allowed_lateness: 3m}\n")
    reads = CountingReads()
    reader = ConfReader(conf, read_bytes=reads)
    first = reader.load()
    reads.paths.clear()
    assert reader.load() is first
    assert reads.paths == [recent]

    age(recent)
    reader.load()
    reads.paths.clear()
    reader.load()
    assert reads.paths == []


def test_a_duplicate_id_in_a_changed_file_is_refused_naming_both_files(
    conf: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    snapshots = ConfigSnapshots(str(tmp_path / "snapshots"))
    watcher = ConfigWatcher(conf, snapshots)
    good = watcher.refresh(now_ms=1_000)
    assert good is not None

    duplicate = tenant_file(conf, 30)
    duplicate.write_text("id: t004\nsources: [billing]\n")
    with caplog.at_level(logging.ERROR, logger="tenants.config_store"):
        assert watcher.refresh(now_ms=2_000) is None
        assert watcher.refresh(now_ms=3_000) is None  # still refused, logged once
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1
    assert (
        f"{duplicate}: id: tenant 't004' is already defined in {tenant_file(conf, 4)}"
        in (refusals[0])
    )
    # The stream keeps the last good config.
    assert snapshots.registry_at(10_000).fingerprint == good.fingerprint
    with pytest.raises(ConfigError, match="already defined in"):
        ConfReader(conf).load()

    duplicate.write_text("id: t030\nsources: [billing]\n")
    fixed = watcher.refresh(now_ms=4_000)
    assert fixed is not None
    assert snapshots.registry_at(10_000).resolve("t030", "billing") is not None


def test_an_unknown_source_in_a_changed_file_is_refused_naming_the_file(conf: Path) -> None:
    reader = ConfReader(conf)
    reader.load()
    path = tenant_file(conf, 9)
    path.write_text("id: t009\nsources: [mobile]\n")
    with pytest.raises(ConfigError) as refused:
        reader.load()
    assert f"{path}: sources.mobile: unknown source" in str(refused.value)
    with pytest.raises(ConfigError):
        reader.load()  # nothing changed since: the same refusal


def test_a_removed_tenant_file_removes_the_tenant(conf: Path, tmp_path: Path) -> None:
    snapshots = ConfigSnapshots(str(tmp_path / "snapshots"))
    watcher = ConfigWatcher(conf, snapshots)
    before = watcher.refresh(now_ms=1_000)
    assert before is not None and before.resolve("t012", "web") is not None

    tenant_file(conf, 12).unlink()
    after = watcher.refresh(now_ms=2_000)
    assert after is not None
    assert "t012" not in after.tenants
    assert len(after.tenants) == TENANTS - 1
    assert after.fingerprint == load_registry(conf).fingerprint
    in_force = snapshots.registry_at(2_000)
    assert in_force.resolve("t012", "web") is None
    assert not in_force.knows_tenant("t012")
    # A batch stamped before the change still sees the tenant, replayed or not.
    assert snapshots.registry_at(1_999).resolve("t012", "web") is not None


def test_an_executor_task_reads_a_snapshot_once_per_process(conf: Path, tmp_path: Path) -> None:
    snapshots = ConfigSnapshots(str(tmp_path / "snapshots"))
    first = load_registry(conf)
    assert snapshots.publish(first, effective_from_ms=100)
    assert not snapshots.publish(first, effective_from_ms=150)  # unchanged: not again
    tenant_file(conf, 1).write_text("id: t001\nsources: [web, billing]\n")
    second = load_registry(conf)
    assert snapshots.publish(second, effective_from_ms=200)

    # What each Spark task gets: an unpickled copy.
    task_copy: ConfigSnapshots = pickle.loads(pickle.dumps(snapshots))
    assert task_copy.registry_at(150) is snapshots.registry_at(150)
    assert task_copy.registry_at(199).fingerprint == first.fingerprint
    assert task_copy.registry_at(200).fingerprint == second.fingerprint
    assert task_copy.registry_at(200).resolve("t001", "billing") is not None
    assert task_copy.registry_at(199).resolve("t001", "billing") is None
    with pytest.raises(LookupError):
        task_copy.registry_at(99)

    # Rules resolved from a snapshot are those resolved from the files.
    from_snapshot = snapshots.registry_at(200)
    for tenant in second.tenants:
        assert from_snapshot.resolve(tenant, "web") == second.resolve(tenant, "web")
    assert from_snapshot.resolve("t001", "web") is from_snapshot.resolve("t001", "web")


def test_a_damaged_tenant_in_a_snapshot_is_named_when_it_is_used(conf: Path) -> None:
    snapshot = json.loads(snapshot_bytes(load_registry(conf)))
    snapshot["tenants"]["t001"]["sources"]["web"]["emit"] = "often"
    damaged = registry_from_snapshot(json.dumps(snapshot).encode(), "snapshots/1-f.json")
    assert damaged.resolve("t002", "web") is not None  # the others are unaffected
    with pytest.raises(ConfigError, match=r"snapshots/1-f.json: tenants.t001.sources.web.emit"):
        damaged.resolve("t001", "web")


@pytest.mark.parametrize("conf_dir", [SAMPLE_CONF, SAMPLE_CONF.parent / "docs" / "examples"])
def test_a_snapshot_reads_back_the_rules_of_every_route(conf_dir: Path) -> None:
    registry = load_registry(conf_dir)
    read_back = registry_from_snapshot(snapshot_bytes(registry), "snapshot.json")
    routes = [
        (tenant.id, source) for tenant in registry.tenants.values() for source in tenant.sources
    ]
    assert routes
    assert read_back.fingerprint == registry.fingerprint
    assert read_back.sources == registry.sources
    for tenant, source in routes:
        assert read_back.resolve(tenant, source) == registry.resolve(tenant, source)


def write_offset_log_entry(checkpoint: Path, batch_id: int, batch_timestamp_ms: int) -> None:
    """An `offsets/<batch>` entry as Spark writes it: version, batch metadata, source offsets."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": batch_timestamp_ms, "conf": {}}
    (checkpoint / "offsets" / str(batch_id)).write_text(f"v1\n{json.dumps(metadata)}\n{{}}\n")


def test_snapshots_no_retained_batch_needs_are_deleted_when_a_new_one_is_published(
    conf: Path, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    snapshots = ConfigSnapshots(str(checkpoint / "tenant_config"))
    watcher = ConfigWatcher(
        conf, snapshots, needed_from_ms=CheckpointLog(str(checkpoint)).oldest_batch_timestamp_ms
    )
    # A fresh checkpoint (no offset log yet) keeps everything.
    assert watcher.refresh(now_ms=1_000) is not None
    tenant_file(conf, 1).unlink()
    assert watcher.refresh(now_ms=2_000) is not None
    assert len(list((checkpoint / "tenant_config").glob("*.json"))) == 2

    # Spark purged batches 0-2; the oldest it keeps ran at 2,500, under the second snapshot.
    write_offset_log_entry(checkpoint, 3, batch_timestamp_ms=2_500)
    write_offset_log_entry(checkpoint, 4, batch_timestamp_ms=3_500)
    tenant_file(conf, 2).unlink()
    assert watcher.refresh(now_ms=3_000) is not None

    kept = sorted(path.name.split("-")[0] for path in (checkpoint / "tenant_config").glob("*.json"))
    assert kept == ["2000", "3000"]
    # Every batch Spark can still replay finds the config it ran with.
    assert snapshots.registry_at(2_500).knows_tenant("t002")
    assert not snapshots.registry_at(2_500).knows_tenant("t001")
    assert not snapshots.registry_at(3_500).knows_tenant("t002")
    with pytest.raises(LookupError):
        snapshots.registry_at(1_500)


def test_a_snapshot_answers_which_keys_are_configured_as_resolve_does(conf_dir: Path) -> None:
    registry = load_registry(conf_dir)
    snapshot = registry_from_snapshot(snapshot_bytes(registry), "test")
    candidates = [
        (tenant, source)
        for tenant in ("acme", "globex", "nobody")
        for source in ("web", "billing", "mobile")
    ]
    for loaded in (registry, snapshot):
        assert [loaded.configures(*key) for key in candidates] == [
            registry.resolve(*key) is not None for key in candidates
        ]
    assert sorted(snapshot.configured_keys()) == sorted(registry.configured_keys())
    assert len(list(snapshot.configured_keys())) == 6
