"""Settling that follows the data (`storage.upkeep.compaction`), on the real query and real Delta
tables: compaction runs after every batch and only merges (the age limit is a day away), so

- a key with enough new rows settles them in its partition at once;
- every other row waits in a run: a staged file per write task, no longer one per batch;
- at every version each row is visible exactly once, and a tenant's query sees its waiting rows;
- the end of an `--available-now` run settles the runs too;
- staged files an outside OPTIMIZE merged (names without a write task) settle through Spark's
  shuffle, each key in one file.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from infra.dev.benchmarks.sample_lake import write_tenants_conf
from storage.lake.file_names import run_oldest_ms, write_task_of_staged_file
from storage.lake.snapshot_reader import read_snapshot
from storage.lake.tables import EVENTS, LAYOUT_PREFIX, STAGED, STAGED_TABLES
from storage.query.scoped_sql import TenantSql
from tests.support.pipeline_harness import Pipeline, record
from tests.support.table_snapshots import snapshot
from tests.support.timestamps import T0_MS

pytestmark = pytest.mark.integration

BIG = "big"
SMALL = [f"s{number:03d}" for number in range(60)]
BATCHES = 4
BATCH_SIZE = 100  # 40 of the big tenant's records and one of each small tenant's
SETTLE_ROWS = 20
WRITE_TASKS = 4  # the test session's shuffle partitions
EVENT_KEY = ["topic", "partition", "offset", "window_id"]


@pytest.fixture(scope="module")
def merged(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Pipeline:
    conf = write_tenants_conf(
        tmp_path_factory.mktemp("conf"), [BIG, *SMALL], ("web",), sources_from=conf_dir
    )
    pipeline = Pipeline.create(
        kafka,
        tmp_path_factory.mktemp("merged"),
        conf,
        partitions=1,
        max_offsets_per_trigger=BATCH_SIZE,
        environ={
            "TW_STREAM__COMPACT_INTERVAL": "1d",
            "TW_STREAM__MERGE_INTERVAL": "1ms",
            "TW_STREAM__SETTLE_ROWS": str(SETTLE_ROWS),
        },
    )
    rng = random.Random(23)
    for batch in range(BATCHES):
        records = [record(BIG, "web", T0_MS + batch * 60_000 + n * 100) for n in range(40)]
        records += [record(tenant, "web", T0_MS + batch * 60_000) for tenant in SMALL]
        rng.shuffle(records)
        pipeline.produce(records)
    pipeline.run_available_now(spark, settle=False)
    return pipeline


def _files(pipeline: Pipeline, spec: Any = EVENTS) -> pd.DataFrame:
    table = pipeline.lake.open(spec)
    return pa.table(table.get_add_actions(flatten=True)).to_pandas()


def test_every_batch_was_merged_into_runs_and_the_big_tenant_settled_at_once(
    merged: Pipeline,
) -> None:
    events = merged.table("events")
    assert events["batch_id"].nunique() == BATCHES
    files = _files(merged)
    staged = files[files["partition.layout_tenant"] == STAGED]
    names = staged["path"].map(lambda path: path.rsplit("/", 1)[-1])
    # No batch's own staged file is left: each compaction merged it into a run.
    assert names.str.startswith("run-").all(), list(names)
    assert 0 < len(staged) <= BATCHES * WRITE_TASKS
    assert staged["path"].map(run_oldest_ms).notna().all()
    # The big tenant's rows all settled as they came; no small tenant's did.
    settled = files[files["partition.layout_tenant"] != STAGED]
    assert set(settled["partition.layout_tenant"]) == {BIG}
    assert (settled["min.tenant"] == BIG).all() and (settled["max.tenant"] == BIG).all()
    assert settled["num_records"].sum() == (events["tenant"] == BIG).sum() == 40 * BATCHES


def test_every_version_of_events_holds_each_record_exactly_once(merged: Pipeline) -> None:
    table = merged.lake.open(EVENTS)
    previous: Counter[tuple[Any, ...]] | None = None
    for version in range(table.version() + 1):
        table.load_as_version(version)
        rows = read_snapshot(table, EVENTS.schema, None, columns=EVENT_KEY).to_pylist()
        keys = Counter(tuple(row[c] for c in EVENT_KEY) for row in rows)
        assert max(keys.values(), default=1) == 1, f"a row twice at version {version}"
        if previous is not None:
            assert set(previous) <= set(keys), f"a row vanished at version {version}"
        previous = keys
    assert previous is not None
    assert sorted(offset for _, _, offset, _ in previous) == list(range(BATCH_SIZE * BATCHES))


def test_a_small_tenants_query_sees_its_rows_waiting_in_the_runs(
    merged: Pipeline, spark: Any
) -> None:
    scoped = TenantSql.open(spark, merged.lake, "s007")
    rows = scoped.query("SELECT count(*) AS n FROM events").collect()
    assert rows[0]["n"] == BATCHES


def test_the_end_of_a_run_settles_the_runs_and_changes_no_row(merged: Pipeline, spark: Any) -> None:
    # Runs after the others (module order).
    before = _rows(merged)

    merged.run_available_now(spark)  # nothing new to read; settles everything at its end

    for spec in STAGED_TABLES:
        files = _files(merged, spec)
        assert STAGED not in set(files["partition.layout_tenant"]), spec.name
        assert (files["partition.layout_tenant"] == files["min.tenant"]).all(), spec.name
        assert (files["partition.layout_tenant"] == files["max.tenant"]).all(), spec.name
    assert_frames_equal(_rows(merged), before)
    # A small tenant waited in runs of several compactions and still gets one file.
    files = _files(merged)
    assert (files["partition.layout_tenant"] == "s007").sum() == 1


def test_staged_files_an_outside_optimize_merged_settle_through_the_shuffle_once_each(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    tenants = SMALL[:6]
    conf = write_tenants_conf(tmp_path / "conf", tenants, ("web",), sources_from=conf_dir)
    pipeline = Pipeline.create(
        kafka,
        tmp_path,
        conf,
        max_offsets_per_trigger=len(tenants),
        environ={"TW_STREAM__COMPACT_INTERVAL": "1d", "TW_STREAM__MERGE_INTERVAL": "1d"},
    )
    pipeline.produce(
        record(tenant, "web", T0_MS + batch * 60_000) for batch in range(3) for tenant in tenants
    )
    pipeline.run_available_now(spark, settle=False)
    # As a user's own OPTIMIZE would, across the staged files of every batch and write task:
    # their names no longer say which write task wrote them.
    pipeline.lake.open(EVENTS).optimize.compact()
    staged = _files(pipeline).query("`partition.layout_tenant` == @STAGED")["path"]
    assert len(staged) == 1 and write_task_of_staged_file(staged.iloc[0]) is None

    pipeline.run_available_now(spark)  # nothing new to read; settles everything at its end

    files = _files(pipeline)
    assert sorted(files["partition.layout_tenant"]) == sorted(tenants)  # one file a tenant
    assert (files["partition.layout_tenant"] == files["min.tenant"]).all()
    events = pipeline.table("events")
    assert sorted(events["offset"]) == list(range(3 * len(tenants)))


def _rows(pipeline: Pipeline) -> dict[str, pd.DataFrame]:
    """The tables' rows, wherever they are laid out."""
    tables = {}
    for name, frame in snapshot(pipeline).items():
        rows = frame.drop(columns=[c for c in frame.columns if c.startswith(LAYOUT_PREFIX)])
        tables[name] = rows.sort_values(list(rows.columns)).reset_index(drop=True)
    return tables


def assert_frames_equal(actual: dict[str, pd.DataFrame], expected: dict[str, pd.DataFrame]) -> None:
    assert actual.keys() == expected.keys()
    for name, frame in actual.items():
        pd.testing.assert_frame_equal(frame, expected[name], obj=name)
