"""The real pipeline end to end: real broker, real Spark streaming query, real Delta tables."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from infra.dev.load_generator import LoadSpec
from storage.lake.delta_lake import DeltaLake
from storage.lake.packed_rows import packed_table
from storage.lake.tables import ALL_TABLES
from storage.lake.writer_lease import WriterLease
from streaming.checkpoint.checkpoint_identity import (
    READABLE_STATE_LAYOUTS,
    StreamIdentity,
    claim_checkpoint,
)
from streaming.kafka.source import register as register_kafka_source
from streaming.pipeline.batch_sink import MicroBatchSink
from streaming.state.union_rows import PACKED_OUTPUT_SCHEMA, union_table
from tenants.conf_reader import load_registry
from tenants.settings import StreamSettings
from tests.support.datasets import sample_records
from tests.support.pipeline_harness import Pipeline, record
from tests.support.timestamps import T0_MS

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


def coordinates(frame: pd.DataFrame) -> set[tuple[int, int]]:
    return set(zip(frame["partition"].astype(int), frame["offset"].astype(int), strict=True))


def test_a_tenant_far_ahead_does_not_make_another_tenants_data_late(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    # Both tenants share one topic partition. acme runs an hour ahead and arrives first;
    # globex's records are in order apart from 5 s of jitter, inside its 10 s out-of-orderness.
    ahead = [record("acme", "web", T0_MS + HOUR_MS + i * 1_000) for i in range(240)]
    behind = [record("globex", "web", T0_MS + i * 1_000 - (i % 3) * 2_000) for i in range(120)]
    pipeline = Pipeline.create(kafka, tmp_path, conf_dir, max_offsets_per_trigger=120)
    pipeline.produce([*ahead, *behind])

    pipeline.run_available_now(spark)

    events = pipeline.table("events")
    globex = events[events["tenant"] == "globex"]
    assert len(globex) == len(behind)
    assert set(globex["timing"]) == {"ON_TIME"}
    assert pipeline.table("late_events").empty
    windows = pipeline.table("windows")
    globex_on_time = windows[(windows["tenant"] == "globex") & (windows["timing"] == "ON_TIME")]
    # 120 s of globex data fill two 1-minute windows; globex's own watermark closed the first.
    assert len(globex_on_time) >= 1

    # The same records through Spark's own watermark: one watermark for the whole query, pushed
    # an hour ahead by acme, so every globex record is dropped as late. (Spark drops late rows
    # by the watermark of two batches back, hence two batches of acme first.)
    builtin_counts = _spark_builtin_window_counts(spark, pipeline, 120)
    assert builtin_counts.get("acme", 0) == len(ahead)
    assert builtin_counts.get("globex", 0) == 0


def _spark_builtin_window_counts(spark: Any, pipeline: Pipeline, batch_size: int) -> dict[str, int]:
    register_kafka_source(spark)
    schema = StructType([StructField("tenant", StringType()), StructField("ts", StringType())])
    parsed = (
        spark.readStream.format("tw_kafka")
        .option("kafka.bootstrap.servers", pipeline.kafka.bootstrap_servers)
        .option("subscribe", pipeline.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(batch_size))
        .load()
        .select(F.from_json(F.col("value").cast("string"), schema).alias("r"))
        .select("r.tenant", F.to_timestamp("r.ts").alias("event_time"))
    )
    counts = (
        parsed.withWatermark("event_time", "10 seconds")
        .groupBy("tenant", F.window("event_time", "1 minute"))
        .agg(F.count("*").cast(LongType()).alias("n"))
    )
    rows: list[Any] = []
    query = (
        counts.writeStream.outputMode("update")
        .option("checkpointLocation", str(pipeline.workdir / "builtin-checkpoint"))
        .foreachBatch(lambda frame, _batch_id: rows.extend(frame.collect()))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(timeout=240)
    # Update mode re-emits a window's running count; keep the last count per window.
    latest: dict[tuple[str, Any], int] = {}
    for row in rows:
        latest[(row["tenant"], row["window"])] = row["n"]
    totals: Counter[str] = Counter()
    for (tenant, _window), count in latest.items():
        totals[tenant] += count
    return dict(totals)


def test_every_consumed_record_lands_in_exactly_one_table_and_counts_balance(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    registry = load_registry(conf_dir)
    spec = LoadSpec(count=3_000, late_share=0.05, malformed_share=0.05, jitter=20_000, seed=11)
    sample = list(sample_records(registry, spec))
    pipeline = Pipeline.create(
        kafka, tmp_path, conf_dir, partitions=3, max_offsets_per_trigger=1_000
    )
    pipeline.produce_samples(sample)

    pipeline.run_available_now(spark)

    events, late, quarantine = (pipeline.table(n) for n in ("events", "late_events", "quarantine"))
    # Tumbling windows: one events row per accepted record, one late row per too-late record.
    assert not events.duplicated(["partition", "offset"]).any()
    assert not late.duplicated(["partition", "offset"]).any()
    landed = [coordinates(events), coordinates(late), coordinates(quarantine)]
    assert sum(len(part) for part in landed) == len(sample)
    assert set.union(*landed) == pipeline.produced_coordinates()

    malformed = Counter(r.kind for r in sample if r.kind not in {"good", "late"})
    assert Counter(quarantine["reason"]) == malformed

    windows = pipeline.table("windows")
    assert not windows.duplicated(["tenant", "source", "window_start", "pane_index"]).any()
    finals = windows[windows["is_final"]]
    assert not finals.duplicated(["tenant", "source", "window_start"]).any()
    per_window = events.groupby(["tenant", "source", "window_start"]).size()
    for (tenant, source, start), group in windows.groupby(["tenant", "source", "window_start"]):
        if not group["is_final"].any():
            continue  # still open at the end of the input
        rules = registry.resolve(tenant, source)
        assert rules is not None
        emitted = group.sort_values("pane_index")["count"]
        total = emitted.iloc[-1] if rules.rules.accumulation == "accumulating" else emitted.sum()
        assert total == per_window[(tenant, source, start)], (tenant, source, start)


def test_the_sink_called_twice_for_one_batch_id_writes_once(spark: Any, tmp_path: Path) -> None:
    lake = DeltaLake(str(tmp_path / "lake"))
    lake.ensure_tables()
    rows = spark.createDataFrame(
        packed_table(
            union_table(
                {
                    "kind": ["events", "windows", "quarantine"],
                    "tenant": ["acme", "acme", None],
                    "source": ["web", "web", None],
                    "window_start_ms": [T0_MS, T0_MS, None],
                    "window_end_ms": [T0_MS + 60_000, T0_MS + 60_000, None],
                    "pane_index": [0, 0, None],
                    "timing": ["ON_TIME", "ON_TIME", None],
                    "is_final": [None, True, None],
                    "count": [None, 1, None],
                    "event_time_ms": [T0_MS + 5, None, None],
                    "partition": [0, None, 0],
                    "offset": [0, None, 1],
                    "kafka_timestamp_ms": [T0_MS, None, T0_MS],
                    "value": [b'{"tenant":"acme"}', None, b"{"],
                    "reason": [None, None, "malformed_json"],
                },
                3,
            )
        ).to_pandas(),
        PACKED_OUTPUT_SCHEMA,
    )
    epoch = WriterLease.for_stream(lake, StreamSettings(name="replay-test")).acquire()
    sink = MicroBatchSink(lake, app_id="replay-test", writer_epoch=epoch)

    def row_counts() -> dict[str, int]:
        return {spec.name: lake.open(spec).to_pyarrow_table().num_rows for spec in ALL_TABLES}

    sink(rows, 0)
    after_first = row_counts()
    sink(rows, 0)
    assert (
        row_counts()
        == after_first
        == {
            "events": 1,
            "windows": 1,
            "late_events": 0,
            "quarantine": 1,
            "tenant_status": 0,
        }
    )
    sink(rows, 1)  # a new batch id is written: the skip is by batch id, not by content
    assert row_counts()["events"] == 2


def test_a_batch_replayed_after_its_delta_commits_changes_nothing(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    pipeline = Pipeline.create(kafka, tmp_path, conf_dir, max_offsets_per_trigger=20)
    pipeline.produce([record("acme", "web", T0_MS + i * 20_000) for i in range(39)] + [b"not json"])
    pipeline.run_available_now(spark)
    before = {name: pipeline.table(name) for name in ("events", "windows", "quarantine")}
    versions = {spec.name: pipeline.lake.open(spec).version() for spec in ALL_TABLES}

    # As if the driver died after the Delta commits but before Spark's commit log entry.
    commits = pipeline.workdir / "checkpoint" / "commits"
    last_batch = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last_batch)).unlink()
    (commits / f".{last_batch}.crc").unlink(missing_ok=True)
    pipeline.run_available_now(spark)

    assert (commits / str(last_batch)).exists(), "Spark did not replay the batch"
    # The restarted instance fenced each table with its writer epoch; nothing else committed.
    assert {spec.name: pipeline.lake.open(spec).version() - 1 for spec in ALL_TABLES} == versions
    for name, frame in before.items():
        pd.testing.assert_frame_equal(
            _sorted(pipeline.table(name)), _sorted(frame), check_like=True
        )


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    keys = [
        c for c in ("tenant", "window_start", "pane_index", "partition", "offset") if c in frame
    ]
    return frame.sort_values(keys).reset_index(drop=True)


@pytest.mark.parametrize("state_layout", sorted(READABLE_STATE_LAYOUTS))
def test_restart_from_checkpoint_neither_duplicates_nor_loses(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path, state_layout: int
) -> None:
    """In each state layout a checkpoint may hold: a new one's, and the binary one of
    checkpoints written before it, which they keep for life."""
    pipeline = Pipeline.create(kafka, tmp_path, conf_dir, max_offsets_per_trigger=25)
    identity = StreamIdentity(
        stream_name=pipeline.settings.stream.name,
        topic=pipeline.settings.kafka.topic,
        lake_root=pipeline.settings.lake.root,
        state_layout=state_layout,
        state_buckets=pipeline.settings.stream.state_buckets,
        balanced_for_tasks=pipeline.settings.stream.shuffle_partitions,
    )
    claim_checkpoint(pipeline.settings.stream.checkpoint_dir, identity)
    first = [record("acme", "web", T0_MS + i * 10_000, event_id=f"a{i}") for i in range(60)]
    pipeline.produce(first)
    pipeline.run_available_now(spark)
    assert len(pipeline.table("events")) == len(first)

    second = [record("acme", "web", T0_MS + (60 + i) * 10_000, event_id=f"b{i}") for i in range(60)]
    pipeline.produce(second)
    pipeline.run_available_now(spark)

    events = pipeline.table("events")
    assert sorted(events["event_id"]) == sorted(r["event_id"] for r in first + second)
    windows = pipeline.table("windows")
    assert not windows.duplicated(["window_start", "pane_index"]).any()
    finals = windows[windows["is_final"]].set_index("window_start")["count"]
    assert (finals == 6).all()  # ten-second spacing: six records in every closed minute
    # Spark's record of the state's schema, which it holds a checkpoint to for life.
    schema = tmp_path / "checkpoint" / "state" / "0" / "0" / "_metadata" / "schema"
    blob_type = "string" if state_layout == 3 else "binary"
    assert f'"name":"keys_arrow","type":"{blob_type}"' in schema.read_text(errors="replace")
