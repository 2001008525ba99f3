"""The stream's committed offsets are mirrored to its Kafka consumer group, so Kafka's own lag
tools see what `status` sees; the checkpoint stays the only truth, and a failed mirror fails
no batch."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient

from streaming.checkpoint.checkpoint_log import COMMITS_DIR, CheckpointLog
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
