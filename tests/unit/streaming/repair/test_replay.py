"""The replay behind `tenants reprocess`: from the rows a stream wrote, one key's records
replayed with the same rules give the same rows, whatever else shared its bucket."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.lake.tables import EVENTS, LATE_EVENTS, TENANT_STATUS, WINDOWS, rows_for_table
from streaming.records.routing import route_frame
from streaming.repair.replay import (
    NO_TIME,
    REPLAYED_TABLES,
    KeyHistory,
    Scope,
    oldest_open_window_ms,
    records_of,
    replay_key,
)
from streaming.state.bucket_processor import run_bucket, sorted_batch
from tenants.registry import TenantRegistry
from tests.support.bucket_inputs import registry_with
from tests.support.timestamps import T0_MS

MAX_RECORD_BYTES = 1_000_000
# A record: (tenant, partition, event time offset s, late by s, batch).
record_strategy = st.tuples(
    st.sampled_from(["acme", "globex"]),
    st.integers(0, 1),
    st.integers(0, 900),
    st.sampled_from([0, 0, 0, 40, 200]),
    st.integers(0, 5),
)


def _kafka_frame(
    rows: list[tuple[str, int, int, int, int]], offsets: dict[int, int]
) -> pd.DataFrame:
    values, partitions, numbers = [], [], []
    for tenant, partition, event_s, late_s, _ in rows:
        ts = pd.Timestamp(T0_MS + (event_s - late_s) * 1000, unit="ms", tz="UTC").isoformat()
        values.append(json.dumps({"tenant": tenant, "source": "web", "ts": ts}).encode())
        partitions.append(partition)
        numbers.append(offsets[partition])
        offsets[partition] += 1
    return pd.DataFrame(
        {
            "key": [b"k"] * len(rows),
            "value": values,
            "topic": "events",
            "partition": pd.array(partitions, "int32"),
            "offset": pd.array(numbers, "int64"),
            "kafka_timestamp_ms": pd.array([T0_MS] * len(rows), "int64"),
        }
    )


def _stream(
    records: list[tuple[str, int, int, int, int]],
    registry: TenantRegistry,
    offboarded_in: int | None = None,
) -> dict[str, pa.Table]:
    """What the stream writes when one bucket holds every key: its rows per table. In batch
    `offboarded_in`, acme's config is gone (it is onboarded again in the next)."""
    without_acme = TenantRegistry.build(
        registry.sources,
        {t: c for t, c in registry.tenants.items() if t != "acme"},
        "without acme",
    )
    out: dict[str, list[pa.Table]] = {}
    blob: bytes | None = None
    offsets = {0: 0, 1: 0}
    # Batch 6 has no records: an idle timeout (2 minutes) fires in it.
    for batch_id in range(7):
        batch = [r for r in records if r[4] == batch_id]
        rules = without_acme if batch_id == offboarded_in else registry
        routed = route_frame(_kafka_frame(batch, offsets), rules, MAX_RECORD_BYTES)
        processing_time_ms = T0_MS + 3_600_000 + batch_id * 40_000
        run = run_bucket(blob, sorted_batch([routed]), rules, processing_time_ms)
        blob = run.blob
        for spec in (*REPLAYED_TABLES, TENANT_STATUS):
            out.setdefault(spec.name, []).append(rows_for_table(run.rows, spec, batch_id))
    return {name: pa.concat_tables(parts) for name, parts in out.items()}


def _of(rows: pa.Table, tenant: str) -> pa.Table:
    return rows.filter(pc.equal(rows["tenant"], tenant))


def _sorted(rows: pa.Table, spec_sort: tuple[str, ...]) -> pa.Table:
    return rows.sort_by([(column, "ascending") for column in spec_sort])


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> TenantRegistry:
    return registry_with(tmp_path_factory.mktemp("conf"), ["acme", "globex"])


@settings(max_examples=40)
@given(
    records=st.lists(record_strategy, min_size=1, max_size=40),
    offboarded_in=st.one_of(st.none(), st.integers(1, 5)),
)
def test_a_key_replayed_with_the_same_rules_gives_the_streams_rows(
    records: list[tuple[str, int, int, int, int]],
    offboarded_in: int | None,
    registry: TenantRegistry,
) -> None:
    """Also when the key was offboarded in between and onboarded again."""
    written = _stream(records, registry, offboarded_in)

    replayed = replay_key(
        "acme",
        records_of(_of(written[EVENTS.name], "acme"), _of(written[LATE_EVENTS.name], "acme")),
        KeyHistory.of(_of(written[TENANT_STATUS.name], "acme")),
        registry,
        MAX_RECORD_BYTES,
    )

    for spec in (EVENTS, WINDOWS, LATE_EVENTS):
        expected = _of(written[spec.name], "acme")
        if spec.name == LATE_EVENTS.name:
            # `events` keeps no Kafka key: a record replayed from it has none.
            expected = expected.drop_columns(["key"])
            actual = replayed[spec.name].drop_columns(["key"])
        else:
            actual = replayed[spec.name]
        assert (
            _sorted(actual, spec.sort_by).to_pylist() == _sorted(expected, spec.sort_by).to_pylist()
        ), spec.name


def _windowed(rows: list[tuple[str, int, int, bool]]) -> tuple[pa.Table, pa.Table]:
    """(window id, start ms, end ms, final) rows as `events` and `windows` columns."""

    def stamp(ms: list[int]) -> pa.Array:
        return pa.array(ms, pa.timestamp("ms", tz="UTC"))

    events = pa.table(
        {
            "window_id": [r[0] for r in rows],
            "window_start": stamp([r[1] for r in rows]),
            "window_end": stamp([r[2] for r in rows]),
        }
    )
    windows = pa.table({"window_id": [r[0] for r in rows], "is_final": [r[3] for r in rows]})
    return events, windows


def test_the_oldest_window_without_a_final_pane_is_open() -> None:
    events, windows = _windowed([("a", 0, 60, True), ("b", 60, 120, False), ("c", 120, 180, False)])
    assert oldest_open_window_ms(events, windows) == 60
    events, windows = _windowed([("a", 0, 60, True)])
    assert oldest_open_window_ms(events, windows) == NO_TIME


def test_a_scope_holds_windows_from_since_that_end_by_the_horizon() -> None:
    events, _ = _windowed([("a", 0, 60, True), ("b", 60, 120, True), ("c", 120, 180, True)])
    assert Scope(since_ms=60, horizon_ms=120).holds(events).to_pylist() == [False, True, False]


def test_a_record_in_several_rows_is_replayed_once_with_its_kafka_key() -> None:
    stamp = pa.scalar(
        pd.Timestamp(T0_MS, unit="ms", tz="UTC"), EVENTS.schema.field("kafka_timestamp").type
    )
    common = {
        "topic": "events",
        "partition": 0,
        "offset": 7,
        "kafka_timestamp": stamp.as_py(),
        "batch_id": 3,
    }
    events = pa.Table.from_pylist(
        [{**common, "payload": '{"x": 1}'}, {**common, "payload": '{"x": 1}'}],
        schema=EVENTS.schema,
    )
    late = pa.Table.from_pylist(
        [{**common, "key": b"k7", "value": b'{"x": 1}'}], schema=LATE_EVENTS.schema
    )
    records = records_of(events, late)
    assert records.num_rows == 1
    assert records.to_pylist()[0] | {"kafka_timestamp_ms": 0} == {
        "key": b"k7",
        "value": b'{"x": 1}',
        "topic": "events",
        "partition": 0,
        "offset": 7,
        "kafka_timestamp_ms": 0,
        "batch_id": 3,
    }
    assert records["kafka_timestamp_ms"][0].as_py() == T0_MS
