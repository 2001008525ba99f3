"""Deferral's files and planning (`streaming.kafka.deferral`, `streaming.kafka.deferral_planning`),
on a local folder and without a broker."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from streaming.kafka.admission import Ledger
from streaming.kafka.deferral import (
    Deferral,
    DeferralStore,
    TaskAdmission,
    admit_partition,
    batch_key,
)
from streaming.kafka.deferral_planning import DeferralPlanner
from streaming.kafka.offsets import OffsetPlanner
from streaming.kafka.options import AT_MS_KEY, KafkaSourceOptions
from streaming.kafka.reader import ARROW_SCHEMA
from tenants.conf_reader import load_registry
from tenants.config_store import ConfigSnapshots
from tenants.models import Quota
from tests.support.bucket_inputs import registry_with

OPTIONS = {"subscribe": "t", "kafka.bootstrap.servers": "127.0.0.1:9"}


def _deferral(tmp_path: Path, quota: Quota | None, budget: int | None = None) -> Deferral:
    return Deferral(
        store=DeferralStore(str(tmp_path / "lake"), (("AWS_SECRET_ACCESS_KEY", "s3cr3t"),), "s"),
        snapshots=ConfigSnapshots(str(tmp_path / "no-snapshots")),
        default_quota=quota,
        window_budget=budget,
        max_deferred_records=1_000,
    )


def _records(partition: int, tenants: list[str], first_offset: int = 0) -> pa.Table:
    """Kafka rows as the reader makes them: one per tenant given, offsets from `first_offset`."""
    count = len(tenants)
    values = [b'{"tenant": "%s", "n": %d}' % (t.encode(), i) for i, t in enumerate(tenants)]
    columns = {
        "key": [tenant.encode() for tenant in tenants],
        "value": values,
        "topic": ["t"] * count,
        "partition": [partition] * count,
        "offset": list(range(first_offset, first_offset + count)),
        "timestamp": [1_000_000] * count,
        "timestampType": [0] * count,
        "headers": [None] * count,
    }
    return pa.Table.from_pydict(columns, ARROW_SCHEMA)


def test_a_partition_windows_the_admitted_then_releases_the_deferred_in_offset_order(
    tmp_path: Path,
) -> None:
    deferral = _deferral(tmp_path, Quota(records_per_second=2, burst=2))
    first = _records(0, ["noisy"] * 5 + ["quiet"])
    windowed = admit_partition(first, 0, TaskAdmission(deferral, None, "b1", 10_000, None))
    assert windowed.column("offset").to_pylist() == [0, 1, 5]
    assert deferral.store.ledger("b1", 0).backlog == 3

    second = _records(0, ["noisy"], first_offset=6)
    windowed = admit_partition(second, 0, TaskAdmission(deferral, "b1", "b2", 11_000, None))
    # Two tokens a second: the two oldest deferred ones, in their order; the new one waits.
    assert windowed.column("offset").to_pylist() == [2, 3]
    assert windowed.schema == ARROW_SCHEMA
    assert windowed.column("value").to_pylist()[0] == first.column("value")[2].as_py()
    assert deferral.store.ledger("b2", 0).backlog == 2
    counts, backlog = deferral.store.batch_counts("b2")
    assert counts.released == 2
    assert backlog == {"noisy": 2}
    rows = deferral.store.tenants_waiting("b2", now_ms=14_000)
    assert rows == [
        {"tenant": "noisy", "deferred_records": 2, "oldest_deferred_age_s": 4.0, "over_quota": True}
    ]


def test_nothing_is_written_when_nothing_is_deferred_or_remembered(tmp_path: Path) -> None:
    deferral = _deferral(tmp_path, None)
    records = _records(3, ["a", "b", "a"])
    windowed = admit_partition(records, 3, TaskAdmission(deferral, None, "b1", 1, None))
    assert windowed.num_rows == 3
    assert not (tmp_path / "lake" / "_deferred" / "s" / "b1" / "3.ledger.json").exists()
    assert deferral.store.ledgers("b1") == {}


def test_a_store_never_shows_its_s3_keys() -> None:
    store = DeferralStore("s3://bucket/lake", (("AWS_SECRET_ACCESS_KEY", "s3cr3t"),), "s")
    assert "s3cr3t" not in repr(store)


def test_a_batch_key_depends_on_every_offset_and_the_planning_time() -> None:
    assert batch_key({"0": 5}) is None  # written before deferral existed
    keys = {
        batch_key({"0": 5, AT_MS_KEY: 1}),
        batch_key({"0": 5, AT_MS_KEY: 2}),
        batch_key({"0": 6, AT_MS_KEY: 1}),
    }
    assert len(keys) == 3
    assert batch_key({AT_MS_KEY: 1, "0": 5}) == batch_key({"0": 5, AT_MS_KEY: 1})


def test_unneeded_folders_go_only_once_old_and_unreferenced(tmp_path: Path) -> None:
    deferral = _deferral(tmp_path, Quota(records_per_second=1, burst=1))
    admit_partition(_records(0, ["t"] * 3), 0, TaskAdmission(deferral, None, "b1", 0, None))
    admit_partition(_records(0, [], 3), 0, TaskAdmission(deferral, "b1", "b2", 1_000, None))
    admit_partition(_records(0, ["u"]), 1, TaskAdmission(deferral, None, "old", 0, None))
    base = tmp_path / "lake" / "_deferred" / "s"
    long_ago = time.time() - 3_600
    for folder in ("b1", "old"):
        os.utime(base / folder, (long_ago, long_ago))
    # b2's ledger still names b1's file; `old` is needed by nobody.
    assert deferral.store.remove_unneeded("b2") == 1
    assert sorted(path.name for path in base.iterdir()) == ["b1", "b2"]


class _FixedBroker(OffsetPlanner):
    def __init__(self, latest: Mapping[str, int]) -> None:
        super().__init__(KafkaSourceOptions.from_options(OPTIONS))
        self.latest = dict(latest)

    def next_end(self, start: Mapping[str, int], max_rows: int | None) -> dict[str, int]:
        return dict(self.latest)


def _planner(deferral: Deferral) -> DeferralPlanner:
    return DeferralPlanner(deferral, KafkaSourceOptions.from_options(OPTIONS))


def test_planning_runs_a_batch_for_new_records_or_waiting_ones_and_otherwise_none(
    tmp_path: Path,
) -> None:
    deferral = _deferral(tmp_path, Quota(records_per_second=1, burst=1))
    planner = _planner(deferral)
    start: dict[str, Any] = {"0": 3, "1": 7, AT_MS_KEY: 1_000}
    assert planner.next_end(_FixedBroker({"0": 3, "1": 7}), start, None) == start

    end = planner.next_end(_FixedBroker({"0": 5, "1": 7}), start, None)
    assert end["0"] == 5 and end[AT_MS_KEY] > 1_000

    # Records wait in partition 1's deferral: a batch even though Kafka has nothing new.
    admit_partition(
        _records(1, ["t"] * 2), 1, TaskAdmission(deferral, None, str(batch_key(start)), 0, None)
    )
    planner = _planner(deferral)
    end = planner.next_end(_FixedBroker({"0": 3, "1": 7}), start, None)
    assert kafka_part(end) == {"0": 3, "1": 7} and end[AT_MS_KEY] > 1_000
    tasks = planner.tasks(start, end)
    assert [(task.partition, task.start_offset, task.end_offset) for task in tasks] == [(1, 7, 7)]
    assert tasks[0].admission is not None and tasks[0].admission.start_batch == batch_key(start)


def test_a_partition_full_of_deferred_records_reads_no_further(tmp_path: Path) -> None:
    deferral = _deferral(tmp_path, Quota(records_per_second=1, burst=1))
    deferral = Deferral(
        deferral.store, deferral.snapshots, deferral.default_quota, None, max_deferred_records=2
    )
    start: dict[str, Any] = {"0": 0, "1": 0, AT_MS_KEY: 1}
    admit_partition(
        _records(0, ["t"] * 4), 0, TaskAdmission(deferral, None, str(batch_key(start)), 0, None)
    )
    end = _planner(deferral).next_end(_FixedBroker({"0": 50, "1": 50}), start, None)
    assert kafka_part(end) == {"0": 0, "1": 50}


def test_the_window_budget_is_shared_max_min_fairly_between_partitions(tmp_path: Path) -> None:
    planner = _planner(_deferral(tmp_path, None, budget=100))
    start: dict[str, Any] = {"0": 0, "1": 0, "2": 0, AT_MS_KEY: 1}
    end: dict[str, Any] = {"0": 10_000, "1": 5, "2": 60, AT_MS_KEY: 2}
    budgets = {
        task.partition: task.admission.budget
        for task in planner.tasks(start, end)
        if task.admission is not None
    }
    # The quiet partition gets all it has, whatever the burst beside it.
    assert budgets == {0: 48, 1: 5, 2: 47}


def kafka_part(offset: Mapping[str, int]) -> dict[str, int]:
    return {key: value for key, value in offset.items() if key != AT_MS_KEY}


def test_an_empty_ledger_reads_back_empty(tmp_path: Path) -> None:
    assert _deferral(tmp_path, None).store.ledger("nothing", 0) == Ledger()


def test_a_tenant_s_own_quota_holds_it_back_though_the_stream_has_no_default_or_budget(
    tmp_path: Path,
) -> None:
    snapshots = ConfigSnapshots(str(tmp_path / "snapshots"))
    snapshots.publish(registry_with(tmp_path, ["calm"]), effective_from_ms=0)
    conf = tmp_path / "conf"  # where `registry_with` wrote it
    deferral = replace(_deferral(tmp_path, None), snapshots=snapshots)
    records = _records(0, ["noisy"] * 4 + ["calm"])
    # No tenant has a quota: every record is windowed as read, nothing is remembered.
    assert admit_partition(records, 0, TaskAdmission(deferral, None, "b1", 10_000, None)).equals(
        records
    )
    assert deferral.store.ledgers("b1") == {}

    (conf / "tenants" / "noisy.yaml").write_text(
        "id: noisy\nsources: [web]\nquota: {records_per_second: 2, burst: 2}\n"
    )
    snapshots.publish(load_registry(conf), effective_from_ms=20_000)
    windowed = admit_partition(records, 0, TaskAdmission(deferral, None, "b2", 20_000, None))
    assert windowed.column("offset").to_pylist() == [0, 1, 4]
    assert deferral.store.ledger("b2", 0).backlog == 2
