"""`tenant-windows status`, the per-batch progress lines and the quarantine log lines.

The pure parts (checkpoint offsets, lag, latest row per key, the last-batch file) have unit
tests; one real run then checks that what status, the progress lines and the quarantine lines
say balances with the tables, the topic and the checkpoint.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.streaming.listener import StreamingQueryProgress

from infra.progress_bar import ProgressBar
from infra.cli.status_view import render_json, render_table
from infra.dev.load_generator import LoadSpec, generate
from streaming.app import StreamApp
from streaming.checkpoint.checkpoint_log import COMMITS_DIR, CheckpointLog, parse_offsets_file
from streaming.observe.batch_progress import (
    BatchOutcome,
    BatchProgress,
    LastBatchFile,
    batch_progress,
    kafka_lag,
)
from streaming.observe.stream_status import (
    DEFERRED,
    KAFKA_LAG,
    KEYS,
    LAST_BATCH,
    NO_DATA_YET,
    NOTIFICATIONS,
    WRITER_LEASE,
    StatusSection,
    gather_status,
    latest_per_key,
)
from tenants.registry import load_registry
from tests.harness import Pipeline
from tests.log_lines import (
    EXAMPLE_PREFIX,
    QUARANTINE_LOGGER,
    example_coordinates,
    parse_summary,
)

ROOT = Path(__file__).resolve().parents[1]
RECORDS = 300
BATCH_SIZE = 100
PRODUCED_AFTER_RUN = 7

# -- pure parts ---------------------------------------------------------------------------------

OFFSETS_HEADER = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1795438247905,"conf":{}}\n'


def test_checkpoint_offsets_are_read_in_both_sources_formats() -> None:
    ours = OFFSETS_HEADER + '{"0": 1334, "1": 0, "10": 7}\n'
    sparks = OFFSETS_HEADER + '{"events": {"0": 5, "1": 6}}\n'
    assert parse_offsets_file(ours, "events") == {0: 1334, 1: 0, 10: 7}
    assert parse_offsets_file(sparks, "events") == {0: 5, 1: 6}


def test_a_file_that_is_not_an_offset_log_entry_is_refused() -> None:
    with pytest.raises(ValueError, match="not a Spark offset log entry"):
        parse_offsets_file('v2\n{}\n{"0": 1}\n', "events")


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


def test_latest_per_key_takes_each_keys_row_of_its_highest_batch() -> None:
    rows = pa.table(
        {
            "tenant": ["a", "a", "b", "a", "b"],
            "source": ["web", "web", "web", "billing", "web"],
            "watermark": [3, 1, 20, 100, 10],
            "max_event_time": [4, 2, 21, 101, 11],
            "open_windows": [1, 2, 3, 4, 5],
            "on_time_records": [30, 10, 200, 1, 100],
            "late_records": [0, 0, 0, 0, 0],
            "too_late_records": [0, 0, 0, 0, 0],
            "quarantined_records": [0, 0, 0, 0, 0],
            "lifecycle": ["active", "configured", "offboarded", None, "active"],
            "batch_id": [3, 1, 7, 0, 5],
        }
    )
    latest = latest_per_key(rows).to_pylist()
    assert [
        (r["tenant"], r["source"], r["batch_id"], r["watermark"], r["lifecycle"]) for r in latest
    ] == [
        ("a", "billing", 0, 100, None),
        ("a", "web", 3, 3, "active"),
        ("b", "web", 7, 20, "offboarded"),
    ]


def test_the_last_batch_file_is_replaced_whole(tmp_path: Path) -> None:
    file = LastBatchFile(str(tmp_path / "checkpoint"))
    assert file.read() is None
    for batch_id in range(3):
        file.write(_progress(batch_id, records_read=10))
    last = file.read()
    assert last is not None and last.batch_id == 2
    assert os.listdir(tmp_path / "checkpoint" / "progress") == ["last_batch.json"]


def test_the_progress_bar_counts_records_read_against_the_backlog() -> None:
    out = io.StringIO()
    bar = ProgressBar(backlog_records=300, out=out)
    for batch_id in range(3):
        bar(_progress(batch_id, records_read=100))
    bar.close()
    last = out.getvalue().rsplit("\r", 1)[1]
    assert "100%" in last and "300/300" in last and "batch 2" in last


def test_the_table_format_shows_keys_without_data_under_the_same_columns() -> None:
    section = StatusSection(
        title=KEYS,
        rows=[
            {"tenant": "acme", "source": "web", "watermark": "2026-01-01T00:00:00", "late": 3},
            {"tenant": "initech", "source": "web", "watermark": NO_DATA_YET},
        ],
    )
    header, acme, initech = render_table([section]).splitlines()[1:4]
    assert header.split() == ["tenant", "source", "watermark", "late"]
    assert acme.split() == ["acme", "web", "2026-01-01T00:00:00", "3"]
    assert initech.split() == ["initech", "web", "no", "data", "yet"]
    assert json.loads(render_json([section]))[KEYS]["rows"][1]["watermark"] == NO_DATA_YET


def _progress(batch_id: int, records_read: int) -> BatchProgress:
    return BatchProgress(
        stream="s",
        batch_id=batch_id,
        finished_at="2026-11-23T00:00:00Z",
        records_read=records_read,
        rows={"events": records_read},
        duration_ms=5,
        max_kafka_lag=1,
    )


# -- one real run ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Pipeline, list[logging.LogRecord]]:
    """acme and globex only (initech has no data), some records malformed, three batches;
    then more records that the stream has not read."""
    registry = load_registry(conf_dir)
    spec = LoadSpec(tenants=("acme", "globex"), count=RECORDS, malformed_share=0.05, seed=11)
    pipeline = Pipeline.create(
        kafka,
        tmp_path_factory.mktemp("status"),
        conf_dir,
        partitions=2,
        max_offsets_per_trigger=BATCH_SIZE,
    )
    pipeline.produce_samples(generate(spec, {n: s.event_time for n, s in registry.sources.items()}))
    records: list[logging.LogRecord] = []
    handler = _Collect(records)
    progress_log = logging.getLogger("tenant_windows.progress")
    level = progress_log.level
    progress_log.setLevel(logging.INFO)  # the CLI logs INFO; pytest's root logger WARNING
    logging.getLogger().addHandler(handler)
    try:
        pipeline.run_available_now(spark)
    finally:
        logging.getLogger().removeHandler(handler)
        progress_log.setLevel(level)
    pipeline.produce(
        [{"tenant": "acme", "source": "web", "ts": "2026-01-01T01:00:00Z"}] * PRODUCED_AFTER_RUN
    )
    return pipeline, records


class _Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.INFO)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.integration
def test_one_progress_line_per_batch_balances_with_the_topic_and_tables(
    finished_run: tuple[Pipeline, list[logging.LogRecord]],
) -> None:
    pipeline, records = finished_run
    lines = [json.loads(r.getMessage()) for r in records if r.name == "tenant_windows.progress"]
    committed = CheckpointLog(pipeline.settings.stream.checkpoint_dir).latest_batch(COMMITS_DIR)
    assert committed is not None
    assert [line["batch_id"] for line in lines] == list(range(committed + 1))
    assert sum(line["records_read"] for line in lines) == RECORDS
    for table in ("events", "windows", "late_events", "quarantine", "tenant_status"):
        assert sum(line["rows"].get(table, 0) for line in lines) == len(pipeline.table(table))
    assert all(line["duration_ms"] > 0 for line in lines)
    # The run read everything that was in the topic: no lag after the last batch.
    assert lines[-1]["max_kafka_lag"] == 0


@pytest.mark.integration
def test_quarantine_summaries_balance_with_the_table_and_examples_are_real_records(
    finished_run: tuple[Pipeline, list[logging.LogRecord]],
) -> None:
    pipeline, records = finished_run
    quarantine = pipeline.table("quarantine")
    assert len(quarantine) > 0, "the sample should quarantine some records"
    messages = [r.getMessage() for r in records if r.name == QUARANTINE_LOGGER]
    summaries = [summary for summary in map(parse_summary, messages) if summary is not None]
    examples = [message for message in messages if message.startswith(EXAMPLE_PREFIX)]
    assert len(summaries) + len(examples) == len(messages), messages
    # Every quarantined record is counted in exactly one summary (the last ones at the stop).
    by_reason: Counter[str] = Counter()
    for summary in summaries:
        by_reason.update(summary.by_reason)
    assert by_reason == Counter(quarantine["reason"])
    covered = [(summary.first_batch, summary.last_batch) for summary in summaries]
    assert all(earlier[1] < later[0] for earlier, later in itertools.pairwise(covered))
    settings = pipeline.settings.quarantine_log
    assert len(examples) <= settings.examples * len(summaries)
    expected = {f"{row.topic}/{row.partition}@{row.offset}" for row in quarantine.itertuples()}
    assert {example_coordinates(example) for example in examples} <= expected


@pytest.mark.integration
def test_status_shows_keys_lag_last_batch_and_lease(
    finished_run: tuple[Pipeline, list[logging.LogRecord]],
) -> None:
    pipeline, _ = finished_run
    sections = {section.title: section for section in gather_status(pipeline.settings)}

    status = pipeline.table("tenant_status")
    latest = status.loc[status.groupby(["tenant", "source"])["batch_id"].idxmax()]
    keys = {(row["tenant"], row["source"]): row for row in sections[KEYS].rows}
    for row in latest.itertuples():
        shown = keys[(row.tenant, row.source)]
        assert shown["batch_id"] == row.batch_id
        assert shown["open_windows"] == row.open_windows
        assert shown["on_time"] == row.on_time_records
        assert shown["too_late"] == row.too_late_records
        assert shown["lifecycle"] == row.lifecycle
        if row.lifecycle == "configured":
            assert shown["watermark"] == NO_DATA_YET and shown["trailing_s"] is None
        else:
            assert shown["trailing_s"] == (row.max_event_time - row.watermark).total_seconds()
    # Configured, but nothing produced for it.
    assert keys[("initech", "web")]["watermark"] == NO_DATA_YET
    assert keys[("initech", "billing")]["watermark"] == NO_DATA_YET

    lag = sections[KAFKA_LAG].rows
    assert sum(row["lag"] for row in lag) == PRODUCED_AFTER_RUN
    assert sum(row["committed_offset"] for row in lag) == RECORDS

    committed = CheckpointLog(pipeline.settings.stream.checkpoint_dir).latest_batch(COMMITS_DIR)
    (last,) = sections[LAST_BATCH].rows
    assert last["batch_id"] == committed
    assert last["rows.tenant_status"] == int((status["batch_id"] == committed).sum())

    (lease,) = sections[WRITER_LEASE].rows
    assert lease["state"] == "released"
    assert lease["pid"] == os.getpid()


@pytest.mark.integration
def test_the_status_command_reads_while_the_stream_holds_its_lease(
    finished_run: tuple[Pipeline, list[logging.LogRecord]],
) -> None:
    pipeline, _ = finished_run
    settings = pipeline.settings
    app = StreamApp(settings, pipeline.lake)
    epoch = app.claim()
    try:
        command = [
            sys.executable, "-m", "infra.cli", "status", "--format", "json",
            "--bootstrap-servers", settings.kafka.bootstrap_servers,
            "--topic", settings.kafka.topic,
            "--lake-root", settings.lake.root,
            "--checkpoint-dir", settings.stream.checkpoint_dir,
            "--stream-name", settings.stream.name,
            "--conf", str(settings.conf_dir),
        ]  # fmt: skip
        result = subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env=pipeline.process_environ(),
        )
        assert result.returncode == 0, result.stderr[-3000:]
        document = json.loads(result.stdout)
        (lease,) = document[WRITER_LEASE]["rows"]
        assert (lease["state"], lease["epoch"], lease["pid"]) == ("held", epoch, os.getpid())
        assert sum(row["lag"] for row in document[KAFKA_LAG]["rows"]) == PRODUCED_AFTER_RUN
        assert "log4j" not in result.stderr, "status started Spark"
        # Reading took nothing from the running instance: it still holds the stream.
        app.lease.renew()
    finally:
        app.stop()


@pytest.mark.integration
def test_status_as_a_new_user_meets_it_one_line_per_missing_part(
    finished_run: tuple[Pipeline, list[logging.LogRecord]], tmp_path: Path
) -> None:
    """The broker is down and status is given the lake but not the checkpoint: each section
    says why in one line, and nothing of kafka-python's retries reaches the screen (the broker
    is checked before a client is made, which used to retry for its whole 5 s budget)."""
    pipeline, _ = finished_run
    settings = pipeline.settings
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{probe.getsockname()[1]}"
    command = [
        sys.executable, "-m", "infra.cli", "status", "--format", "json",
        "--bootstrap-servers", down,
        "--topic", settings.kafka.topic,
        "--lake-root", settings.lake.root,
        "--checkpoint-dir", str(tmp_path / "not-the-streams-checkpoint"),
        "--stream-name", settings.stream.name,
        "--conf", str(settings.conf_dir),
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=pipeline.process_environ(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "kafka" not in result.stderr.lower(), result.stderr
    document = json.loads(result.stdout)
    assert document[KAFKA_LAG]["note"] == f"broker {down} unreachable (connection refused)"
    for title in (LAST_BATCH, DEFERRED):
        assert document[title]["note"].startswith("no checkpoint at "), document[title]
        assert "--checkpoint-dir" in document[title]["note"]
    # The project's sources and tenants configure no endpoint.
    assert document[NOTIFICATIONS]["note"] == "none configured"
    # What the lake alone can tell is still there.
    assert {(row["tenant"], row["source"]) for row in document[KEYS]["rows"]} >= {
        ("acme", "web"),
        ("globex", "billing"),
    }
