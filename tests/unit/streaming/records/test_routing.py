"""The router's Arrow batches are what Spark expects of `ROUTED_SCHEMA`, and say what the pandas
router (`route_frame`, which replays use) says of the same records."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from streaming.records.routing import ROUTED_SCHEMA, route_batch, route_frame
from tenants.conf_reader import load_registry
from tests.support.sample_conf import SAMPLE_CONF

VALUES = [
    b'{"tenant": "acme", "source": "web", "ts": "2026-01-01T00:00:07Z", "event_id": "e1"}',
    b'{"tenant": "acme", "source": "web", "ts": "not a time"}',
    b'{"tenant": "nobody", "source": "web", "ts": "2026-01-01T00:00:07Z"}',
    b"not json",
    None,
]
# What Spark hands the router: the columns `KAFKA_COLUMNS_SQL` selects, in Spark's Arrow types.
KAFKA = pa.RecordBatch.from_pydict(
    {
        "key": pa.array([b"k"] * len(VALUES), pa.binary()),
        "value": pa.array(VALUES, pa.binary()),
        "topic": pa.array(["events"] * len(VALUES)),
        "partition": pa.array(range(len(VALUES)), pa.int32()),
        "offset": pa.array(range(100, 100 + len(VALUES)), pa.int64()),
        "kafka_timestamp_ms": pa.array([1_767_225_600_000] * len(VALUES), pa.int64()),
        "batch_timestamp_ms": pa.array([1_767_225_601_000] * len(VALUES), pa.int64()),
    }
)


def test_a_routed_batch_has_the_types_spark_expects_and_keeps_the_kafka_columns() -> None:
    routed = route_batch(KAFKA, load_registry(SAMPLE_CONF), max_record_bytes=10_000)
    expected = to_arrow_schema(ROUTED_SCHEMA)
    assert routed.schema.names == expected.names
    assert routed.schema.types == expected.types
    for name in ("key", "value", "topic", "partition", "offset", "kafka_timestamp_ms"):
        assert routed.column(name).equals(KAFKA.column(name)), name


def test_the_arrow_and_the_pandas_router_route_every_record_alike() -> None:
    registry = load_registry(SAMPLE_CONF)
    routed = route_batch(KAFKA, registry, max_record_bytes=10_000).to_pydict()
    frame = KAFKA.to_pandas().drop(columns=["batch_timestamp_ms"])
    from_pandas = route_frame(frame, registry, max_record_bytes=10_000)
    for name in ROUTED_SCHEMA.fieldNames():
        column = from_pandas[name].astype(object).where(from_pandas[name].notna(), None)
        assert routed[name] == column.tolist(), name
    assert routed["tenant"][0] == "acme"
    assert routed["event_time_ms"][0] == 1_767_225_607_000
    assert [reason is not None for reason in routed["reason"]] == [False, True, True, True, True]
    assert pd.isna(from_pandas["event_time_ms"][1])
