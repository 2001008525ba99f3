"""The lake on a persistent S3 server (SeaweedFS on 127.0.0.1): a crash, and a storage outage.

moto (test_s3_lake.py here) keeps objects in memory; SeaweedFS keeps them on disk, so it can
be stopped and started again on the same data, as a real store goes down and comes back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pydantic import SecretStr

from infra.dev.load_generator import LoadSpec, SampleRecord
from infra.dev.seaweedfs import LocalSeaweedFS
from storage.lake.tables import ALL_TABLES, EVENTS, STAGED_TABLES
from streaming.fault_points import FaultPoint
from tenants.conf_reader import load_registry
from tests.support.datasets import clean_run, sample_records
from tests.support.pipeline_harness import Pipeline
from tests.support.s3_endpoint import s3_environ
from tests.support.stream_process import (
    crash_and_recover,
    run_process,
    start_process,
    wait_for_commit_log,
    wait_or_kill,
)
from tests.support.table_snapshots import (
    assert_every_record_landed_once,
    assert_same_tables,
    table_versions,
)

pytestmark = pytest.mark.integration

BUCKET = "lake"
ACCESS_KEY = "AKIASEAWEEDTEST"
SECRET_KEY = "s3cr3t-seaweed-never-in-logs-91c2"
BATCH_SIZE = 150
RECORDS = 450  # three batches
# A lake outage must end the query well within a minute, Spark start-up included.
FAIL_FAST_S = 45.0


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSeaweedFS]:
    server = LocalSeaweedFS(
        tmp_path_factory.mktemp("seaweedfs") / "data", BUCKET, ACCESS_KEY, SecretStr(SECRET_KEY)
    )
    with server:
        yield server


@pytest.fixture(scope="module")
def samples(conf_dir: Path) -> list[SampleRecord]:
    registry = load_registry(conf_dir)
    spec = LoadSpec(count=RECORDS, late_share=0.1, malformed_share=0.05, jitter=30_000, seed=5)
    return list(sample_records(registry, spec))


def s3_pipeline(
    kafka: Any,
    workdir: Path,
    conf_dir: Path,
    server: LocalSeaweedFS,
    prefix: str,
    extra_environ: dict[str, str] | None = None,
    **options: Any,
) -> Pipeline:
    environ = {
        **s3_environ(server.endpoint_url, ACCESS_KEY, SECRET_KEY),
        **(extra_environ or {}),
    }
    workdir.mkdir(parents=True, exist_ok=True)
    return Pipeline.create(
        kafka,
        workdir,
        conf_dir,
        partitions=2,
        max_offsets_per_trigger=BATCH_SIZE,
        lake_root=f"s3://{BUCKET}/{prefix}",
        environ=environ,
        **options,
    )


def committed_batches(pipeline: Pipeline) -> dict[str, int | None]:
    lake = pipeline.lake
    return {spec.name: lake.committed_batch(spec, pipeline.stream_name) for spec in ALL_TABLES}


def test_crashes_between_a_batchs_and_a_compactions_table_commits_on_seaweedfs_recover(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    seaweed: LocalSeaweedFS,
    samples: list[SampleRecord],
    tmp_path: Path,
) -> None:
    """Killed between batch 1's table commits, then (the restart) between the commits of the
    compaction after it: the last restart ends with the tables of a run without a crash."""
    every_batch = {"TW_STREAM__COMPACT_INTERVAL": "0s"}
    crashed = s3_pipeline(kafka, tmp_path / "crashed", conf_dir, seaweed, "crash", every_batch)
    crashed.produce_samples(samples)
    # The reference: the same topic, a local lake, no crash.
    clean = clean_run(
        kafka, spark, conf_dir, tmp_path / "clean", crashed.topic, BATCH_SIZE, environ=every_batch
    )

    def the_crash_left_batch_1_in_some_tables_only(pipeline: Pipeline) -> None:
        held = committed_batches(pipeline)
        assert 1 in held.values(), held
        assert any(batch is None or batch < 1 for batch in held.values()), held

    def the_crash_left_a_table_settled_and_the_next_staged(pipeline: Pipeline) -> None:
        lake = pipeline.lake
        staged = {spec.name: len(lake.staged_files(spec)) for spec in STAGED_TABLES}
        assert staged[EVENTS.name] == 0 and sum(staged.values()) > 0, staged

    between_tables = f"{FaultPoint.BETWEEN_TABLE_COMMITS}@1"
    after_compaction = f"{FaultPoint.AFTER_COMPACTION_COMMIT}@1"
    recovered = crash_and_recover(
        crashed,
        spark,
        [between_tables, after_compaction],
        before_restart={
            between_tables: the_crash_left_batch_1_in_some_tables_only,
            after_compaction: the_crash_left_a_table_settled_and_the_next_staged,
        },
    )

    # Layout columns included: each row settled where the clean run settled it.
    assert_same_tables(recovered, clean)
    assert_every_record_landed_once(crashed)
    assert all(not crashed.lake.staged_files(spec) for spec in STAGED_TABLES)


def _newest_batch(checkpoint_log: Path) -> int:
    return max(int(entry.name) for entry in checkpoint_log.iterdir() if entry.name.isdigit())


def test_a_lake_outage_fails_the_stream_fast_without_a_commit_and_a_restart_continues_exactly(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    seaweed: LocalSeaweedFS,
    samples: list[SampleRecord],
    tmp_path: Path,
) -> None:
    pipeline = s3_pipeline(kafka, tmp_path, conf_dir, seaweed, "outage", trigger_interval="500ms")
    first, rest = samples[: 2 * BATCH_SIZE], samples[2 * BATCH_SIZE :]
    pipeline.produce_samples(first)

    running_log = tmp_path / "running.log"
    while_down_log = tmp_path / "restart-while-down.log"
    try:
        with running_log.open("wb") as log:
            process = start_process(pipeline, log, available_now=False)
            wait_for_commit_log(pipeline, 1, process, deadline_s=180)
            # Only batches without records run from here on, and they commit nothing.
            before = table_versions(pipeline), committed_batches(pipeline)
            seaweed.stop()
            stopped = time.monotonic()
            pipeline.produce_samples(rest)
            code = wait_or_kill(process, timeout_s=120)
            failed_after_s = time.monotonic() - stopped
        print(f"the running stream failed {failed_after_s:.1f}s after the lake stopped")
        running = running_log.read_text(errors="replace")
        assert code == 1, f"exit code {code}:\n{running[-3000:]}"
        assert failed_after_s < FAIL_FAST_S, (
            f"failed after {failed_after_s:.0f}s:\n{running[-3000:]}"
        )
        assert "the stream failed" in running, running[-3000:]
        unreachable = f"the lake {pipeline.lake.root} is unreachable at {seaweed.endpoint_url}"
        assert unreachable in running, running[-3000:]

        # A restart while the lake is still down fails fast as well.
        started = time.monotonic()
        code = run_process(pipeline, while_down_log, timeout_s=120)
        restart_failed_after_s = time.monotonic() - started
        print(f"a start while the lake was down failed after {restart_failed_after_s:.1f}s")
        while_down = while_down_log.read_text(errors="replace")
        assert code == 1, while_down[-3000:]
        assert restart_failed_after_s < FAIL_FAST_S, while_down[-3000:]
        assert unreachable in while_down and "Traceback" not in while_down, while_down[-3000:]
    finally:
        if not seaweed.is_running:
            seaweed.start()  # the same directory and ports

    # Nothing was committed while the lake was down: every table is where the stop left it,
    # and Spark logged the failed batch's offsets but not its commit, so it is replayed.
    assert (table_versions(pipeline), committed_batches(pipeline)) == before
    checkpoint = pipeline.workdir / "checkpoint"
    assert _newest_batch(checkpoint / "commits") == _newest_batch(checkpoint / "offsets") - 1
    for output in (running, while_down, seaweed.log_path.read_text(errors="replace")):
        assert SECRET_KEY not in output

    pipeline.run_available_now(spark)

    assert_every_record_landed_once(pipeline)
    windows = pipeline.table("windows")
    assert not windows.duplicated(["tenant", "source", "window_start", "pane_index"]).any()
    assert len(pd.concat([pipeline.table(n) for n in ("events", "late_events", "quarantine")])) == (
        RECORDS
    )
