"""Spark's streaming query events, carried to a Python listener as one JSON string each.

PySpark's own bridge rebuilds a progress event in Python from the JVM's objects, field by field
over py4j: dozens of round trips a batch, and each Java map among its fields ends its iteration
with a Java exception that PySpark's error conversion inspects with a dozen `is_instance_of`
checks, each a class lookup that failed through every jar on the driver's class path. At 500
records/s on two cores that was a third of the driver JVM's Java samples (Flight Recorder, 20 s),
all on the listener bus, plus the driver's Python time under the GIL the batches' own driver
work needs. Spark's events write themselves as JSON (`json`, the form Spark Connect sends) and
PySpark reads that form (`fromJson`), so one call carries the same event.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, ClassVar

from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

if TYPE_CHECKING:
    from py4j.java_gateway import JavaObject


class JsonEventListener(StreamingQueryListener):
    """A `StreamingQueryListener` whose events cross from the JVM as JSON; registered with
    `spark.streams.addListener` like any other."""

    @property
    def _jlistener(self) -> JavaObject:
        # PySpark's `addListener` and `removeListener` register what this returns, once.
        from pyspark import SparkContext

        if not hasattr(self, "_json_jlistener"):
            jvm = SparkContext._jvm
            assert jvm is not None, "a listener is registered with a running session"
            self._json_jlistener = jvm.PythonStreamingQueryListenerWrapper(_JsonEvents(self))
        return self._json_jlistener


class _JsonEvents:
    """Spark's `PythonStreamingQueryListener`, implemented for py4j's callback server."""

    def __init__(self, listener: StreamingQueryListener) -> None:
        self._listener = listener

    def onQueryStarted(self, jevent: JavaObject) -> None:  # noqa: N802 (Spark's API)
        self._listener.onQueryStarted(QueryStartedEvent.fromJson(json.loads(jevent.json())))

    def onQueryProgress(self, jevent: JavaObject) -> None:  # noqa: N802
        self._listener.onQueryProgress(QueryProgressEvent.fromJson(json.loads(jevent.json())))

    def onQueryIdle(self, jevent: JavaObject) -> None:  # noqa: N802
        self._listener.onQueryIdle(QueryIdleEvent.fromJson(json.loads(jevent.json())))

    def onQueryTerminated(self, jevent: JavaObject) -> None:  # noqa: N802
        self._listener.onQueryTerminated(QueryTerminatedEvent.fromJson(json.loads(jevent.json())))

    class Java:
        implements: ClassVar[list[str]] = [
            "org.apache.spark.sql.streaming.PythonStreamingQueryListener"
        ]
