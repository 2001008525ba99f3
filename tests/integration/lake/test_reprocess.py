"""`tenants reprocess T`: T's windows recomputed with T's current rules from the records the
lake holds. Unchanged rules change nothing; new rules give what a fresh stream with them gives;
nobody else's rows move; a run interrupted between its commits is finished by the next."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from infra.dev.load_generator import LoadSpec
from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import ALL_TABLES
from streaming.app import StreamApp
from streaming.repair.plan_journal import ReprocessReport, reprocess_app_id
from streaming.repair.replay import NO_TIME
from streaming.repair.reprocess import ReprocessError, reprocess_tenant
from tenants.conf_reader import load_registry
from tests.support.datasets import sample_records
from tests.support.fault_hooks import cli_command
from tests.support.paths import ROOT
from tests.support.pipeline_harness import Pipeline
from tests.support.sample_conf import copy_conf
from tests.support.stream_process import wait_or_kill
from tests.support.table_snapshots import assert_every_record_landed_once, assert_same_tables
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


RECORDS = 1_200
TENANT = "acme"
# acme's web windows: 5 minutes instead of the source's 1, and a longer lateness.
NEW_RULES = """id: acme
sources:
  web:
    window: {kind: tumbling, size: 5m}
    allowed_lateness: 4m
  billing: {}
"""


def _stream(kafka: Any, spark: Any, conf: Path, workdir: Path, rules: str | None) -> Pipeline:
    """The sample records through a stream of their own, with acme's rules replaced if given."""
    conf_copy = copy_conf(conf, workdir)
    if rules is not None:
        (conf_copy / "tenants" / "acme.yaml").write_text(rules)
    pipeline = Pipeline.create(
        kafka, workdir, conf_copy, partitions=2, max_offsets_per_trigger=RECORDS // 4
    )
    # 20 s of event time per key and record: about an hour of windows per key.
    spec = LoadSpec(count=RECORDS, step_ms=20_000, late_share=0.05, malformed_share=0.02, seed=3)
    registry = load_registry(conf_copy)
    pipeline.produce_samples(sample_records(registry, spec))
    pipeline.run_available_now(spark)
    return pipeline


def _rows(
    pipeline: Pipeline, table: str, tenant: str | None = None, exclude: str | None = None
) -> pd.DataFrame:
    """A table's rows in one order, every column as text: equal frames hold the same rows."""
    frame = pipeline.table(table)
    if tenant is not None:
        frame = frame[frame["tenant"] == tenant]
    if exclude is not None:
        frame = frame[frame["tenant"] != exclude]
    text = frame.astype(str)
    return text.sort_values(list(text.columns)).reset_index(drop=True)


def _everyone_else(pipeline: Pipeline) -> dict[str, pd.DataFrame]:
    return {spec.name: _rows(pipeline, spec.name, exclude=TENANT) for spec in ALL_TABLES}


def _reprocess(pipeline: Pipeline, spark: Any, dry_run: bool = False) -> ReprocessReport:
    settings = pipeline.settings
    return reprocess_tenant(
        spark, settings, DeltaLake.from_settings(settings.lake), TENANT, 0, NO_TIME, dry_run
    )


@pytest.fixture(scope="module")
def fresh_with_new_rules(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Pipeline:
    """What a stream with acme's new rules from the start writes."""
    return _stream(kafka, spark, conf_dir, tmp_path_factory.mktemp("fresh"), NEW_RULES)


def test_unchanged_rules_change_nothing(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    pipeline = _stream(kafka, spark, conf_dir, tmp_path, None)
    before = {spec.name: _rows(pipeline, spec.name) for spec in ALL_TABLES}
    versions = {spec.name: pipeline.lake.open(spec).version() for spec in ALL_TABLES}

    report = _reprocess(pipeline, spark)

    assert report.run is None, report
    # The replay covered acme's history up to its open windows, and matched it row for row.
    assert report.rows_compared > RECORDS // 10, report
    # Data tables untouched: only the lease's fence commits were added.
    for spec in ALL_TABLES:
        assert _rows(pipeline, spec.name).equals(before[spec.name]), spec.name
        assert pipeline.lake.open(spec).version() <= versions[spec.name] + 1


def test_new_rules_give_what_a_fresh_stream_gives(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path, fresh_with_new_rules: Pipeline
) -> None:
    pipeline = _stream(kafka, spark, conf_dir, tmp_path, None)
    others = _everyone_else(pipeline)
    too_late_before = _rows(pipeline, "late_events", TENANT)
    (pipeline.conf_dir / "tenants" / "acme.yaml").write_text(NEW_RULES)

    dry = _reprocess(pipeline, spark, dry_run=True)
    assert dry.run is None and any(t.rows_added for t in dry.tables), dry
    report = _reprocess(pipeline, spark)

    assert report.run == 1, report
    assert_same_tables(_everyone_else(pipeline), others, what="{}")
    _assert_acme_matches(pipeline, fresh_with_new_rules, report)
    # Records too late for a minute's lateness are in time for four: they left late_events.
    moved = _in_scope(too_late_before, report)
    assert len(moved[moved["source"] == "web"]) > 0
    assert len(_in_scope(_rows(pipeline, "late_events", TENANT), report)) < len(moved)


def _assert_acme_matches(pipeline: Pipeline, fresh: Pipeline, report: ReprocessReport) -> None:
    """acme's rows in every windowed table equal the fresh stream's, up to each key's horizon
    (its oldest open window: the same in both, as both read the same records)."""
    for table in ("windows", "events", "late_events"):
        # Each stream has a topic of its own, produced a little later: the records, their
        # partitions and offsets are the same.
        ours, theirs = (
            _in_scope(_rows(p, table, TENANT), report).drop(
                columns=["topic", "kafka_timestamp"], errors="ignore"
            )
            for p in (pipeline, fresh)
        )
        assert len(ours) > 0 or table == "late_events", table
        pd.testing.assert_frame_equal(ours, theirs, obj=table)
    finals = _in_scope(_rows(pipeline, "windows", TENANT), report)
    web_final = finals[(finals["source"] == "web") & (finals["is_final"] == "True")]
    # 5-minute windows now: every final web window in scope starts on a 5-minute boundary.
    starts = pd.to_datetime(web_final["window_start"])
    assert len(starts) > 0 and (starts.dt.minute % 5 == 0).all()


def _in_scope(frame: pd.DataFrame, report: ReprocessReport) -> pd.DataFrame:
    horizon = frame["source"].map(
        lambda source: pd.Timestamp(report.horizons_ms[source], unit="ms", tz="UTC")
    )
    kept = frame[pd.to_datetime(frame["window_end"]) <= horizon]
    return kept.reset_index(drop=True)


@pytest.mark.parametrize(
    "killed_after_tables",
    [
        0,  # the plan is written, no table committed
        1,  # one table committed, the others not
    ],
)
def test_a_run_killed_before_or_between_its_commits_is_finished_by_the_next(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    tmp_path: Path,
    fresh_with_new_rules: Pipeline,
    killed_after_tables: int,
) -> None:
    pipeline = _stream(kafka, spark, conf_dir, tmp_path, None)
    others = _everyone_else(pipeline)
    (pipeline.conf_dir / "tenants" / "acme.yaml").write_text(NEW_RULES)
    settings = pipeline.settings
    command = cli_command(
        [
            "tenants", "reprocess", TENANT,
            "--conf", str(pipeline.conf_dir),
            "--lake-root", settings.lake.root,
            "--stream-name", settings.stream.name,
        ],
        fault=["--crash-at", f"before_reprocess_commit@{killed_after_tables}"],
    )  # fmt: skip
    with (tmp_path / "killed.log").open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=pipeline.process_environ(),
            start_new_session=True,  # the hook kills this process group only
        )
        assert wait_or_kill(process, 300) == -signal.SIGKILL, (tmp_path / "killed.log").read_text()
    committed = [
        spec.name
        for spec in ALL_TABLES
        if pipeline.lake.committed_batch(spec, reprocess_app_id(settings.stream.name, TENANT))
    ]
    assert len(committed) == killed_after_tables, committed

    # Its lease is held by a dead process on this host: the next run takes over at once.
    resumed = _reprocess(pipeline, spark)
    assert resumed.resumed and resumed.run == 1, resumed
    again = _reprocess(pipeline, spark)
    assert again.run is None, again  # finished: replaying again changes nothing
    assert_same_tables(_everyone_else(pipeline), others, what="{}")
    _assert_acme_matches(pipeline, fresh_with_new_rules, resumed)


def test_an_unconfigured_tenant_is_refused(kafka: Any, spark: Any, tmp_path: Path) -> None:
    settings = Pipeline.create(kafka, tmp_path, Path("conf")).settings
    with pytest.raises(ReprocessError, match="not configured"):
        reprocess_tenant(
            spark, settings, DeltaLake.from_settings(settings.lake), "nobody", 0, NO_TIME, True
        )


def _halves(registry_conf: Path) -> tuple[list[Any], list[Any]]:
    """The same records for every stream: an hour of event time, then a later one."""
    registry = load_registry(registry_conf)
    first = LoadSpec(count=RECORDS // 2, step_ms=20_000, late_share=0.05, seed=5)
    later = first.model_copy(update={"start_ms": first.start_ms + 7_200_000, "seed": 6})
    return list(sample_records(registry, first)), list(sample_records(registry, later))


def test_a_reprocess_beside_the_running_stream_loses_and_duplicates_nothing(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fresh_dir = tmp_path_factory.mktemp("fresh-one-partition")
    copy_conf(conf_dir, fresh_dir)
    (fresh_dir / "conf" / "tenants" / "acme.yaml").write_text(NEW_RULES)
    fresh = Pipeline.create(kafka, fresh_dir, fresh_dir / "conf")
    first, later = _halves(conf_dir)
    fresh.produce_samples([*first, *later])
    fresh.run_available_now(spark)

    workdir = tmp_path_factory.mktemp("beside")
    copy_conf(conf_dir, workdir)
    pipeline = Pipeline.create(
        kafka,
        workdir,
        workdir / "conf",
        trigger_interval="500ms",
        environ={"TW_STREAM__COMPACT_INTERVAL": "1s"},
    )
    pipeline.produce_samples(first)
    stream = StreamApp(pipeline.settings, pipeline.lake).start(spark)
    try:
        _wait_until_settled(pipeline, len(first))
        (pipeline.conf_dir / "tenants" / "acme.yaml").write_text(NEW_RULES)
        pipeline.produce_samples(later)  # windowed by the stream while the reprocess runs
        report = _reprocess_until_settled(pipeline, spark)
        _wait_until_settled(pipeline, len(first) + len(later))
        assert stream.query.exception() is None, stream.query.exception()
    finally:
        stream.stop()

    assert report.run == 1, report
    assert_every_record_landed_once(pipeline)
    for table, unstable in (
        ("events", ["batch_id", "pane_index"]),
        ("late_events", ["batch_id", "key"]),
    ):
        # One partition: each record is classified the same however the batches fell.
        ours, theirs = (
            _in_scope(_rows(p, table, TENANT), report).drop(
                columns=["topic", "kafka_timestamp", *unstable], errors="ignore"
            )
            for p in (pipeline, fresh)
        )
        assert len(ours) > 0 or table == "late_events", table
        pd.testing.assert_frame_equal(ours, theirs, obj=table)
    finals = [
        _in_scope(_rows(p, "windows", TENANT), report).query(
            "is_final == 'True' and source == 'web'"
        )
        for p in (pipeline, fresh)
    ]
    assert len(finals[0]) > 0
    pd.testing.assert_frame_equal(
        finals[0][["window_id", "count"]].reset_index(drop=True),
        finals[1][["window_id", "count"]].reset_index(drop=True),
    )


def _wait_until_settled(pipeline: Pipeline, records: int, timeout_s: float = 120) -> None:
    """Until every produced record has a row and no row waits in a staged file."""

    def settled() -> bool:
        landed = sum(
            len(set(zip(f["partition"], f["offset"], strict=True)))
            for f in (pipeline.table(t) for t in ("events", "late_events", "quarantine"))
        )
        staged = any(pipeline.lake.staged_files(spec) for spec in ALL_TABLES if spec.staged)
        return landed >= records and not staged

    wait_until(settled, timeout_s, f"the stream to settle {records} records")


def _reprocess_until_settled(pipeline: Pipeline, spark: Any) -> ReprocessReport:
    """Reprocess, again while the stream's newest rows in range wait for compaction."""
    for _ in range(60):
        try:
            return _reprocess(pipeline, spark)
        except ReprocessError as error:
            assert "not settled yet" in str(error), error
            time.sleep(1)
    raise AssertionError("compaction never settled the rows in range")
