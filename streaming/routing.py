"""Spark stage 1: parse each Kafka record and tag it with its key, or with why it is rejected.

A thin shell around `parsing.parse_value`, run with `mapInPandas` before the stateful stage so
each value is decoded once. Rejected records keep flowing: the stateful stage emits them as
quarantine rows, so one micro-batch writes every output table from one plan.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pandas as pd
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from streaming.parsing import Accepted, parse_value
from tenants.config_store import ConfigSnapshots
from tenants.registry import TenantRegistry

ROUTED_SCHEMA = StructType(
    [
        StructField("tenant", StringType()),
        StructField("source", StringType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("kafka_timestamp_ms", LongType()),
        StructField("event_time_ms", LongType()),
        StructField("event_id", StringType()),
        StructField("metric_inputs_json", StringType()),
        StructField("reason", StringType()),
        StructField("error", StringType()),
    ]
)

KAFKA_COLUMNS_SQL = [
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "CAST(unix_millis(timestamp) AS LONG) AS kafka_timestamp_ms",
    # In a streaming query this is the micro-batch's timestamp, kept in the offset log, so a
    # replayed batch routes with the same tenant config as the first time.
    "CAST(unix_millis(current_timestamp()) AS LONG) AS batch_timestamp_ms",
]


def make_router(
    snapshots: ConfigSnapshots, max_record_bytes: int
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """The `mapInPandas` function; expects the columns selected by `KAFKA_COLUMNS_SQL`."""

    def route(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            if frame.empty:
                continue
            registry = snapshots.registry_at(int(frame["batch_timestamp_ms"].iloc[0]))
            yield route_frame(frame, registry, max_record_bytes)

    return route


def route_frame(
    frame: pd.DataFrame, registry: TenantRegistry, max_record_bytes: int
) -> pd.DataFrame:
    outcomes = [parse_value(value, registry, max_record_bytes) for value in frame["value"]]
    routed = frame.copy()
    routed["tenant"] = [outcome.tenant for outcome in outcomes]
    routed["source"] = [outcome.source for outcome in outcomes]
    routed["event_time_ms"] = pd.array(
        [o.event_time_ms if isinstance(o, Accepted) else None for o in outcomes], dtype="Int64"
    )
    routed["event_id"] = [o.event_id if isinstance(o, Accepted) else None for o in outcomes]
    routed["metric_inputs_json"] = [
        json.dumps(o.metric_inputs) if isinstance(o, Accepted) and o.metric_inputs else None
        for o in outcomes
    ]
    routed["reason"] = [None if isinstance(o, Accepted) else o.reason.value for o in outcomes]
    routed["error"] = [None if isinstance(o, Accepted) else o.error for o in outcomes]
    return routed[ROUTED_SCHEMA.fieldNames()]
