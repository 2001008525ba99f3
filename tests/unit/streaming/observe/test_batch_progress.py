"""Each batch's progress as the stream reports it: Kafka lag, a restarted batch, the last-batch
file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.listener import StreamingQueryProgress

from streaming.observe.batch_progress import BatchOutcome, LastBatchFile, batch_progress, kafka_lag
from tests.support.sample_values import progress_of


def test_kafka_lag_is_latest_minus_end_per_partition() -> None:
    assert kafka_lag('{"0": 10, "1": 7}', '{"0": 4, "1": 7}') == {0: 6, 1: 0}
    assert kafka_lag('{"t": {"0": 10}}', '{"t": {"0": 3}}') == {0: 7}
    # A source that does not report the broker's offsets has no lag to show.
    assert kafka_lag(None, '{"0": 4}') == {}


@pytest.mark.parametrize(
    "missing",
    # A JVM null as classic PySpark (`str(None)`) and Spark Connect ("null") hand it over, an
    # empty offset, and offsets that are not a source's offsets at all.
    [None, "None", "null", "", "  ", "not json", "[1, 2]", '{"0": "x"}'],
)
def test_a_missing_or_unreadable_offset_means_the_lag_is_unknown(missing: str | None) -> None:
    assert kafka_lag(missing, '{"0": 4}') == {}
    assert kafka_lag('{"0": 10}', missing) == {}


def _spark_progress(batch_id: int, latest_offset: object, start_offset: object) -> Any:
    """A progress event as PySpark builds it from Spark's JSON (trimmed from a real re-run)."""
    source = {
        "description": "PythonMicroBatchStreamWithTriggerAvailableNow@cda98af",
        "startOffset": start_offset,
        "endOffset": {"0": 40},
        "latestOffset": latest_offset,
        "numInputRows": 20,
        "inputRowsPerSecond": 0.0,
        "processedRowsPerSecond": 7.8,
    }
    return StreamingQueryProgress.fromJson(
        {
            "id": "1f9397db-e63e-43cf-9c5d-b5554cbba822",
            "runId": "dc069fec-e977-49bf-ba72-303a44c31c95",
            "name": "s",
            "timestamp": "2026-11-24T21:40:40.582Z",
            "batchId": batch_id,
            "batchDuration": 2565,
            "numInputRows": 20,
            "inputRowsPerSecond": 0.0,
            "processedRowsPerSecond": 7.8,
            # A re-run batch has no `latestOffset` or `walCommit` duration.
            "durationMs": {"addBatch": 2319, "getBatch": 0, "triggerExecution": 2565},
            "stateOperators": [],
            "sources": [source],
            "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
        }
    )


@pytest.mark.parametrize("latest_offset", [None, "None"])
def test_the_first_batch_after_a_restart_is_reported_with_its_lag_unknown(
    latest_offset: str | None,
) -> None:
    # Spark re-runs the batch planned before the crash without asking the broker: no latest
    # offset (null in Spark's JSON, the text "None" through classic PySpark).
    progress = _spark_progress(1, latest_offset, start_offset={"0": 20})
    outcome = BatchOutcome(batch_id=1, rows={"events": 20})
    summary = batch_progress("s", outcome, progress)
    assert (summary.batch_id, summary.records_read, summary.duration_ms) == (1, 20, 2565)
    assert summary.max_kafka_lag is None
    # The first batch of a stream has no start offset; the lag is known.
    first = batch_progress("s", outcome, _spark_progress(0, {"0": 45}, start_offset=None))
    assert first.max_kafka_lag == 5


def test_the_last_batch_file_is_replaced_whole(tmp_path: Path) -> None:
    file = LastBatchFile(str(tmp_path / "checkpoint"))
    assert file.read() is None
    for batch_id in range(3):
        file.write(progress_of(batch_id, records_read=10))
    last = file.read()
    assert last is not None and last.batch_id == 2
    assert os.listdir(tmp_path / "checkpoint" / "progress") == ["last_batch.json"]
