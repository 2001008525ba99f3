"""A listener whose events cross as JSON gets what PySpark's own bridge gives, event for event."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

from streaming.observe.batch_progress import NO_OFFSETS
from streaming.observe.json_listener import JsonEventListener

pytestmark = pytest.mark.integration

EVENTS_WAIT_S = 30.0


class _Events:
    def __init__(self) -> None:
        self.started: list[QueryStartedEvent] = []
        self.progress: list[QueryProgressEvent] = []
        self.terminated: list[QueryTerminatedEvent] = []
        self._changed = threading.Condition()

    def onQueryStarted(self, event: QueryStartedEvent) -> None:  # noqa: N802
        self.started.append(event)

    def onQueryProgress(self, event: QueryProgressEvent) -> None:  # noqa: N802
        self.progress.append(event)

    def onQueryIdle(self, event: QueryIdleEvent) -> None:  # noqa: N802
        return None

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:  # noqa: N802
        with self._changed:
            self.terminated.append(event)
            self._changed.notify_all()

    def wait_terminated(self, query_id: str, timeout_s: float) -> bool:
        """True once the query `query_id` has ended; another query's end on the session is not it."""
        with self._changed:
            return self._changed.wait_for(
                lambda: any(str(event.id) == query_id for event in self.terminated), timeout_s
            )


class _ThroughPySpark(_Events, StreamingQueryListener):
    pass


class _ThroughJson(_Events, JsonEventListener):
    pass


def _offset(text: str) -> object:
    # The same offsets in two spellings: PySpark's bridge writes a missing one as "None" and the
    # JSON form as "null" (`NO_OFFSETS`, which the listener reads both ways), and the JSON
    # form's with spaces after separators.
    return None if text in NO_OFFSETS else json.loads(text)


def _progress_fields(event: QueryProgressEvent) -> dict[str, Any]:
    progress = event.progress
    return {
        "id": progress.id,
        "name": progress.name,
        "batchId": progress.batchId,
        "numInputRows": progress.numInputRows,
        "durationMs": progress.durationMs,
        "sources": [
            (source.description, _offset(source.startOffset), _offset(source.endOffset))
            for source in progress.sources
        ],
        "sink": progress.sink.description,
        "json": json.loads(progress.json),
    }


def test_a_json_listener_gets_each_event_as_pyspark_s_bridge_does(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for number, rows in enumerate((3, 5)):
        (source / f"part-{number}.json").write_text(
            "".join(f'{{"tenant": "t{row}", "value": {row}}}\n' for row in range(rows))
        )
        # The file source takes files oldest first: one batch each, in this order.
        os.utime(source / f"part-{number}.json", (1_000_000 + number, 1_000_000 + number))
    bridged, carried = _ThroughPySpark(), _ThroughJson()
    spark.streams.addListener(bridged)
    spark.streams.addListener(carried)
    try:
        query = (
            spark.readStream.schema("tenant string, value long")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
            .writeStream.format("noop")
            .queryName("json-listener")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(60)
        assert carried.wait_terminated(query.id, EVENTS_WAIT_S)
        assert bridged.wait_terminated(query.id, EVENTS_WAIT_S)
    finally:
        spark.streams.removeListener(bridged)
        spark.streams.removeListener(carried)

    # Other tests' queries may share the session: only this one's events count.
    def ours(events: _Events) -> list[QueryProgressEvent]:
        return [event for event in events.progress if str(event.progress.id) == query.id]

    assert [event.progress.numInputRows for event in ours(carried)] == [3, 5]
    assert [_progress_fields(event) for event in ours(carried)] == [
        _progress_fields(event) for event in ours(bridged)
    ]
    started = [event for event in carried.started if str(event.id) == query.id]
    assert [(event.name, str(event.runId)) for event in started] == [("json-listener", query.runId)]
    terminated = [event for event in carried.terminated if str(event.id) == query.id]
    assert [(str(event.runId), event.exception) for event in terminated] == [(query.runId, None)]


def test_a_json_listener_that_is_removed_gets_no_more_events(
    spark: SparkSession, tmp_path: Path
) -> None:
    carried = _ThroughJson()
    spark.streams.addListener(carried)
    spark.streams.removeListener(carried)
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 10)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        deadline = time.monotonic() + EVENTS_WAIT_S
        while not query.recentProgress and time.monotonic() < deadline:
            time.sleep(0.1)
        assert query.recentProgress
    finally:
        query.stop()
    assert not [event for event in carried.progress if str(event.progress.id) == query.id]
