"""The stream's committed offsets are mirrored to its Kafka consumer group, so Kafka's own lag
tools see what `status` sees; the checkpoint stays the only truth, and a failed mirror fails
no batch. Mirrors are `kafka.mirror_interval_ms` apart; what they hold back reaches the group
when the stream goes idle or stops."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient

from streaming.app import StreamApp
from streaming.checkpoint.checkpoint_log import COMMITS_DIR, CheckpointLog
from streaming.observe.batch_progress import BatchProgress
from streaming.observe.stream_status import backlog_records, broker_end_offsets
from tests.support.pipeline_harness import Pipeline, record
from tests.support.timestamps import T0_MS


def group_offsets(bootstrap_servers: str, group: str, topic: str) -> dict[int, int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=10_000)
    try:
        committed = admin.list_group_offsets({group: None})[group]
    finally:
        admin.close()
    return {tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == topic}


@pytest.mark.integration
def test_the_group_holds_the_checkpoints_offsets_and_the_same_lag(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    pipeline = Pipeline.create(kafka, tmp_path, conf_dir, partitions=2, max_offsets_per_trigger=4)
    pipeline.produce([record("acme", "web", T0_MS + n * 1000) for n in range(9)])
    pipeline.run_available_now(spark)
    settings = pipeline.settings
    checkpoint = CheckpointLog(settings.stream.checkpoint_dir)
    committed = checkpoint.latest_batch(COMMITS_DIR)
    assert committed is not None and committed >= 2  # several batches, each mirrored
    expected = checkpoint.offsets(committed, pipeline.topic)
    # The listener mirrors after Spark reports the batch: give its thread a moment.
    deadline = time.monotonic() + 20
    mirrored = group_offsets(kafka.bootstrap_servers, settings.stream.name, pipeline.topic)
    while mirrored != expected and time.monotonic() < deadline:
        time.sleep(0.2)
        mirrored = group_offsets(kafka.bootstrap_servers, settings.stream.name, pipeline.topic)
    assert mirrored == expected and sum(expected.values()) == 9

    pipeline.produce([record("acme", "web", T0_MS + 20_000 + n) for n in range(3)])
    end = broker_end_offsets(settings.kafka, pipeline.topic)
    group_lag = sum(end[partition] - offset for partition, offset in mirrored.items())
    assert group_lag == backlog_records(settings) == 3


@pytest.mark.integration
def test_mirrors_are_an_interval_apart_and_an_idle_stream_catches_up(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    pipeline = Pipeline.create(
        kafka,
        tmp_path,
        conf_dir,
        max_offsets_per_trigger=1,
        trigger_interval="200ms",
        environ={"TW_KAFKA__MIRROR_INTERVAL_MS": "3000"},
    )
    pipeline.produce([record("acme", "web", T0_MS + n * 1000) for n in range(8)])
    settings = pipeline.settings
    checkpoint = CheckpointLog(settings.stream.checkpoint_dir)
    summaries: list[BatchProgress] = []
    reported_at: list[float] = []

    def on_batch(summary: BatchProgress) -> None:
        summaries.append(summary)
        reported_at.append(time.monotonic())

    stream = StreamApp(settings, pipeline.lake, on_batch=on_batch).start(spark)
    try:
        deadline = time.monotonic() + 120
        while sum(summary.rows.get("events", 0) for summary in summaries) < 8:
            assert time.monotonic() < deadline, "the stream did not read the 8 records"
            assert stream.query.exception() is None, stream.query.exception()
            time.sleep(0.2)
        reading_s = reported_at[-1] - reported_at[0]
        mirrored_batches = [s.batch_id for s in summaries if s.offsets_mirrored]
        held_batches = [s.batch_id for s in summaries if s.offsets_mirrored is None]
        # The first batch is mirrored at once, the others at most one an interval.
        assert summaries[0].offsets_mirrored is True
        assert 1 <= len(mirrored_batches) <= 2 + reading_s // 3
        assert held_batches, "every batch mirrored: no interval between mirrors"
        # Idle now, with no stop: the offsets held back still reach the group.
        committed = checkpoint.latest_batch(COMMITS_DIR)
        assert committed is not None
        expected = checkpoint.offsets(committed, pipeline.topic)
        assert sum(expected.values()) == 8
        deadline = time.monotonic() + 30
        mirrored = group_offsets(kafka.bootstrap_servers, settings.stream.name, pipeline.topic)
        while mirrored != expected and time.monotonic() < deadline:
            time.sleep(0.5)
            mirrored = group_offsets(kafka.bootstrap_servers, settings.stream.name, pipeline.topic)
        assert mirrored == expected, "an idle stream's group kept offsets it had held back"
    finally:
        stream.stop()
