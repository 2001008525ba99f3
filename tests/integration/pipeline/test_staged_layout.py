"""Staged, then settled (contract §5), on the real query and real Delta tables.

- a micro-batch adds a few staged files per table, however many tenants it holds;
- compaction moves every row to its tenant's partition in one commit per table;
- at every version of `events` each row is visible exactly once;
- a tenant's query reads its own settled files plus only the staged files that may hold its rows;
- a lake from before the staged layout is read as it is, refused by the stream, and migrated.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from infra.cli.main import main
from infra.dev.benchmarks.sample_lake import write_tenants_conf
from storage.lake.delta_lake import DeltaLake, LakeLayoutError
from storage.lake.snapshot_reader import read_snapshot
from storage.lake.tables import EVENTS, LAKE_TABLES, STAGED, STAGED_TABLES, TableSpec
from storage.query.scoped_sql import TenantSql
from tests.support.pipeline_harness import Pipeline, record
from tests.support.timestamps import T0_MS

pytestmark = pytest.mark.integration

TENANTS = [f"t{number:03d}" for number in range(120)]
RECORDS_PER_TENANT = 6
BATCH_SIZE = 240  # every batch holds records of (nearly) every tenant
WRITE_TASKS = 4  # the test session's shuffle partitions
EVENT_KEY = ["topic", "partition", "offset", "window_id"]


@pytest.fixture(scope="module")
def many_tenants_conf(conf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tenants_conf(
        tmp_path_factory.mktemp("conf"), TENANTS, ("web",), sources_from=conf_dir
    )


@pytest.fixture(scope="module")
def staged(
    kafka: Any, spark: Any, many_tenants_conf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Pipeline:
    """Three batches of 120 tenants' records, run without any compaction."""
    pipeline = Pipeline.create(
        kafka,
        tmp_path_factory.mktemp("staged"),
        many_tenants_conf,
        partitions=2,
        max_offsets_per_trigger=BATCH_SIZE,
        environ={"TW_STREAM__COMPACT_INTERVAL": "1d", "TW_STREAM__MERGE_INTERVAL": "1d"},
    )
    rng = random.Random(17)
    records = [
        record(tenant, "web", T0_MS + rng.randrange(0, 240_000))
        for _ in range(RECORDS_PER_TENANT)
        for tenant in TENANTS
    ]
    rng.shuffle(records)
    pipeline.produce(records)
    pipeline.run_available_now(spark, settle=False)
    return pipeline


def _commits(table_path: str) -> list[list[dict[str, Any]]]:
    """Every commit of a local table's log: its actions, in version order."""
    log_dir = Path(table_path) / "_delta_log"
    return [
        [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted(log_dir.glob("*.json"))
    ]


def _added(commit: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [action["add"] for action in commit if "add" in action]


def _batch_commits(commits: list[list[dict[str, Any]]], stream: str) -> list[list[dict[str, Any]]]:
    return [
        commit
        for commit in commits
        if any(action.get("txn", {}).get("appId") == stream for action in commit)
    ]


def test_each_batch_adds_at_most_one_staged_file_per_write_task(staged: Pipeline) -> None:
    lake = staged.lake
    for spec in STAGED_TABLES:
        batches = _batch_commits(_commits(lake.table_uri(spec)), staged.stream_name)
        if spec is EVENTS:
            assert len(batches) >= 3
        for commit in batches:
            added = _added(commit)
            assert 0 < len(added) <= WRITE_TASKS, (spec.name, len(added))
            assert all(add["partitionValues"]["layout_tenant"] == STAGED for add in added)
    # ... while every batch held records of about a hundred tenants.
    events = staged.table("events")
    per_batch = events.groupby("batch_id")["tenant"].nunique()
    assert per_batch.min() >= 80, per_batch.to_dict()


def test_a_tenants_query_sees_staged_rows_and_reads_only_files_that_may_hold_them(
    staged: Pipeline, spark: Any
) -> None:
    tenant = "t007"
    scoped = TenantSql.open(spark, staged.lake, tenant)
    rows = scoped.query("SELECT count(*) AS n FROM events").collect()
    events = staged.table("events")
    assert rows[0]["n"] == (events["tenant"] == tenant).sum() > 0
    # Staged files hold many tenants: the query reads those whose `tenant` statistics include
    # it, and nothing else.
    actions = pa.table(DeltaTable(staged.lake.table_uri(EVENTS)).get_add_actions(flatten=True))
    frame = actions.to_pandas()
    may_hold = frame[(frame["min.tenant"] <= tenant) & (frame["max.tenant"] >= tenant)]
    read = {path for path in scoped.readable_files if "/events/" in path}
    assert {Path(path).name for path in read} == {Path(path).name for path in may_hold["path"]}


def test_compaction_settles_every_row_in_its_tenants_partition_without_changing_any(
    staged: Pipeline, spark: Any
) -> None:
    lake = staged.lake
    before = {spec.name: _rows(lake, spec) for spec in STAGED_TABLES}

    staged.run_available_now(spark)  # nothing new to read; settles at its end

    for spec in STAGED_TABLES:
        table = lake.open(spec)
        frame = pa.table(table.get_add_actions(flatten=True)).to_pandas()
        assert STAGED not in set(frame["partition.layout_tenant"])
        # One settled file per partition, holding that partition's tenant only.
        layout_tenant = frame["partition.layout_tenant"]
        assert (layout_tenant == frame["min.tenant"]).all(), spec.name
        assert (layout_tenant == frame["max.tenant"]).all(), spec.name
        partitions = frame[[f"partition.{name}" for name in spec.partition_by]]
        assert not partitions.duplicated().any()
        pd.testing.assert_frame_equal(_rows(lake, spec), before[spec.name], obj=spec.name)
    # The commit that settled them removed exactly the staged files and changed no data.
    last = _commits(lake.table_uri(EVENTS))[-1]
    assert all(action["remove"]["dataChange"] is False for action in last if "remove" in action)
    assert any(
        action.get("txn", {}).get("appId") == f"{staged.stream_name}/compaction" for action in last
    )


def test_every_version_of_events_holds_each_row_exactly_once(staged: Pipeline) -> None:
    # Runs after compaction (module order): the history has batches and a compaction.
    table = staged.lake.open(EVENTS)
    latest = table.version()
    previous: Counter[tuple[Any, ...]] | None = None
    settled_versions = 0
    for version in range(latest + 1):
        table.load_as_version(version)
        rows = read_snapshot(table, EVENTS.schema, None, columns=EVENT_KEY).to_pylist()
        keys = Counter(tuple(row[c] for c in EVENT_KEY) for row in rows)
        assert max(keys.values(), default=1) == 1, f"a row twice at version {version}"
        if previous is not None:
            # Batches only add rows; a compaction moves them: never fewer rows, never other ones.
            assert set(previous) <= set(keys), f"a row vanished at version {version}"
            if keys == previous:
                settled_versions += 1
        previous = keys
    assert previous is not None and len(previous) == len(staged.table("events")) > 0
    assert settled_versions >= 1


def test_a_lake_from_before_staging_is_read_refused_by_the_stream_and_migrated(
    staged: Pipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old_root = str(tmp_path / "old-lake")
    old = DeltaLake(old_root)
    for spec in LAKE_TABLES:
        _write_old_layout(staged.lake, old, spec, staged.stream_name)

    # Read as it is: the partition columns come from each table's own metadata.
    assert _rows(old, EVENTS).equals(_rows(staged.lake, EVENTS))
    with pytest.raises(LakeLayoutError, match="migrate-layout"):
        old.ensure_tables()

    assert main(["migrate-layout", "--lake-root", old_root]) == 0
    out = capsys.readouterr().out
    assert "events: rewritten in the staged layout" in out
    old.ensure_tables()  # now accepted
    for spec in STAGED_TABLES:
        table = old.open(spec)
        assert tuple(table.metadata().partition_columns) == spec.partition_by
        # The stream resumes where it stopped: its transaction ids survive the rewrite.
        assert table.transaction_version(staged.stream_name) == staged.lake.committed_batch(
            spec, staged.stream_name
        )
        pd.testing.assert_frame_equal(_rows(old, spec), _rows(staged.lake, spec), obj=spec.name)
    assert main(["migrate-layout", "--lake-root", old_root]) == 0
    assert "nothing to do" in capsys.readouterr().out


def _rows(lake: DeltaLake, spec: TableSpec) -> pd.DataFrame:
    """The table's rows as a multiset (sorted, as text so maps and lists compare)."""
    frame = lake.read_arrow(spec).to_pandas().astype(str)
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


def _write_old_layout(source: DeltaLake, target: DeltaLake, spec: TableSpec, stream: str) -> None:
    """`spec`'s rows of `source` as the release before staging wrote them: partitioned by the
    row's own tenant, source (and window date), with the stream's transaction id."""
    from deltalake import CommitProperties, Transaction

    rows = source.read_arrow(spec)
    partition_by = list(spec.settles_by or spec.partition_by)
    committed = source.committed_batch(spec, stream)
    transactions = [] if committed is None else [Transaction(app_id=stream, version=committed)]
    write_deltalake(
        target.table_uri(spec),
        rows,
        partition_by=partition_by or None,
        commit_properties=CommitProperties(app_transactions=transactions),
    )
