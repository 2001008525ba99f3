"""`tenant-windows status`, the per-batch progress lines and the quarantine log lines.

The pure parts (checkpoint offsets, lag, latest row per key, the last-batch file) have unit
tests (tests/unit/streaming/observe/, tests/unit/streaming/checkpoint/test_checkpoint_log.py);
one real run here checks that what status, the progress lines and the quarantine lines say
balances with the tables, the topic and the checkpoint.
"""

from __future__ import annotations

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

import pytest

from infra.dev.load_generator import LoadSpec
from streaming.app import StreamApp
from streaming.checkpoint.checkpoint_log import COMMITS_DIR, CheckpointLog
from streaming.observe.stream_status import (
    DEFERRED,
    KAFKA_LAG,
    KEYS,
    LAST_BATCH,
    NO_DATA_YET,
    NOTIFICATIONS,
    WRITER_LEASE,
    gather_status,
)
from tenants.conf_reader import load_registry
from tests.support.datasets import sample_records
from tests.support.paths import ROOT
from tests.support.pipeline_harness import Pipeline
from tests.support.quarantine_log_lines import (
    EXAMPLE_PREFIX,
    QUARANTINE_LOGGER,
    example_coordinates,
    parse_summary,
)

RECORDS = 300
BATCH_SIZE = 100
PRODUCED_AFTER_RUN = 7


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
    pipeline.produce_samples(sample_records(registry, spec))
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
            *pipeline.cli_flags(),
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
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{probe.getsockname()[1]}"
    command = [
        sys.executable, "-m", "infra.cli", "status", "--format", "json",
        *pipeline.cli_flags(
            bootstrap_servers=down, checkpoint_dir=str(tmp_path / "not-the-streams-checkpoint")
        ),
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
