"""What the stream says when its query fails: one line for an outage, everything for a bug;
and what it keeps quiet while it stops."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest

from streaming.process import CALLBACK_LOGGER, outage_cause, quiet_stopping

KAFKA_CAUSE = (
    "tw_kafka: fetching end offsets of topic 'events' from bootstrap servers 127.0.0.1:9 kept "
    "failing for 4004 ms (fetchOffset.timeoutMs 4000, 2 attempts); last error: "
    "KafkaTimeoutError('Unable to bootstrap from 127.0.0.1:9')."
)
# The shape of Spark's text for a query that a driver-side Python error stopped: a chained
# Python traceback inside the Java error, then the query and its plan.
FAILED_QUERY = f"""[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: \
[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source perform \
latestOffset: Traceback (most recent call last):
  File "/work/streaming/kafka/offsets.py", line 311, in _ask_broker
    consumer = self._driver_consumer(remaining_ms)
kafka.errors.KafkaTimeoutError: KafkaTimeoutError: Unable to bootstrap from 127.0.0.1:9

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/work/streaming/kafka/offsets.py", line 330, in _ask_broker
    raise KafkaUnavailableError(
streaming.kafka.client.KafkaUnavailableError: {KAFKA_CAUSE}
 SQLSTATE: 38000
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.pythonStreamingDataSourceRuntimeError
=== Streaming Query ===
Logical Plan:
~WriteToMicroBatchDataSourceV1 ForeachBatchSink
"""


def test_a_broker_outage_is_its_own_line() -> None:
    assert outage_cause(FAILED_QUERY) == f"KafkaUnavailableError: {KAFKA_CAUSE}"


def test_a_lake_outage_on_an_executor_is_its_own_line() -> None:
    cause = "the lake s3://b/p is unreachable at http://127.0.0.1:9 while writing batch 7's file"
    failure = (
        "Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times, most recent "
        "failure: Lost task 0.0: org.apache.spark.api.python.PythonException: Traceback (most "
        f'recent call last):\n  File "x.py", line 1, in write\n'
        f"storage.lake.s3_options.LakeUnavailableError: {cause}\n\tat org.apache.spark.Foo\n"
    )
    assert outage_cause(failure) == f"LakeUnavailableError: {cause}"


def test_a_subclass_of_an_outage_keeps_its_own_name() -> None:
    failure = "streaming.kafka.client.KafkaSecurityError: Kafka at h:1 over SSL: certificate\n"
    assert outage_cause(failure) == "KafkaSecurityError: Kafka at h:1 over SSL: certificate"


def test_any_other_failure_is_a_bug_and_has_no_one_line_cause() -> None:
    bug = FAILED_QUERY.replace("streaming.kafka.client.KafkaUnavailableError", "KeyError")
    assert outage_cause(bug) is None


def test_py4j_errors_are_quiet_while_the_stream_stops_and_heard_again_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    callback_logger = logging.getLogger(CALLBACK_LOGGER)
    without_a_jvm = cast(Any, object())  # its Spark loggers cannot be set: only a debug line

    with caplog.at_level(logging.INFO), quiet_stopping(without_a_jvm):
        callback_logger.error("an interrupted foreachBatch")
    callback_logger.error("a later session's failing callback")

    said = [record.getMessage() for record in caplog.records if record.name == CALLBACK_LOGGER]
    assert said == ["a later session's failing callback"]
