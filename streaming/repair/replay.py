"""Replaying one key's records with the current rules (`tenants reprocess`), and which rows the
replay may replace.

The replay is the stream's own bucket code (`bucket_processor.run_bucket`) run again over the key's
records as the lake holds them (`events` and `late_events` keep each record's raw value and
Kafka coordinates), batch by batch in the order the stream windowed them, each batch at the
processing time the stream gave it (its `tenant_status` rows record it). Processing time is
what the idle timeout and the future-skew guard read, so with unchanged rules the replay gives
the rows the stream wrote, and with new rules the rows a stream with those rules from the start
would have written over the same batches.

Scope. A window's rows are replaced when the window starts at or after `since` and ends by
the horizon: `until`, the start of the key's oldest window the live stream still has open (its
rows are the live state's), and the start of the oldest window the replay leaves open (it has
no final pane yet). Old rows and replayed rows in scope swap places; every other row stays.

Pure: pyarrow and pandas, no Spark.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from storage.lake.tables import EVENTS, LATE_EVENTS, QUARANTINE, WINDOWS, rows_for_table
from streaming.records.routing import route_frame
from streaming.state.bucket_processor import run_bucket, sorted_batch
from tenants.registry import TenantRegistry

RECORD_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("kafka_timestamp_ms", pa.int64()),
        pa.field("batch_id", pa.int64()),
    ]
)
"""A key's records as the replay reads them: what the router reads of a Kafka record, and the
batch that windowed it."""
REPLAYED_TABLES = (EVENTS, WINDOWS, LATE_EVENTS, QUARANTINE)
WINDOWED_TABLES = (EVENTS, WINDOWS, LATE_EVENTS)
NO_TIME = np.iinfo(np.int64).max


def records_of(events: pa.Table, late_events: pa.Table) -> pa.Table:
    """Each record of a key once (in `RECORD_SCHEMA`), from its `events` and `late_events`
    rows: a record in several windows has a row in each. `events` keeps the value as text
    (it was valid UTF-8 JSON) and no Kafka key; `late_events` keeps both as bytes."""
    from_events = pa.table(
        {
            "key": pa.nulls(events.num_rows, pa.binary()),
            "value": pc.cast(events["payload"], pa.binary()),
            **_coordinates(events),
        },
        schema=RECORD_SCHEMA,
    )
    from_late = pa.table(
        {"key": late_events["key"], "value": late_events["value"], **_coordinates(late_events)},
        schema=RECORD_SCHEMA,
    )
    # late_events first: of a record's copies, the one that kept its Kafka key wins.
    both = pa.concat_tables([from_late, from_events])
    first = (
        both.append_column("row", pa.array(np.arange(both.num_rows)))
        .group_by(["topic", "partition", "offset"], use_threads=False)
        .aggregate([("row", "min")])
    )
    return both.take(first["row_min"]).sort_by(
        [("batch_id", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
    )


def _coordinates(rows: pa.Table) -> dict[str, pa.ChunkedArray]:
    return {
        "topic": rows["topic"],
        "partition": rows["partition"],
        "offset": rows["offset"],
        "kafka_timestamp_ms": pc.cast(
            pc.cast(rows["kafka_timestamp"], pa.timestamp("ms", tz="UTC")), pa.int64()
        ),
        "batch_id": rows["batch_id"],
    }


@dataclass(frozen=True)
class KeyHistory:
    """When the stream ran a key, from the key's `tenant_status` rows."""

    batch_times_ms: dict[int, int]
    """Each batch the stream ran the key in, records or not (an idle timeout fires in a batch
    without records), and its processing time. A `configured` row is the driver's, not a run."""
    offboarded: frozenset[int]
    """The batches in which the stream offboarded the key (its config was gone): it closed the
    key's windows with final panes and dropped its state; after a later onboarding the key
    started afresh."""

    @classmethod
    def of(cls, status: pa.Table) -> KeyHistory:
        lifecycle = status["lifecycle"]
        ran = status.filter(pc.fill_null(pc.not_equal(lifecycle, "configured"), True))
        times = pc.cast(pc.cast(ran["processing_time"], pa.timestamp("ms", tz="UTC")), pa.int64())
        offboarded = status.filter(pc.fill_null(pc.equal(lifecycle, "offboarded"), False))
        return cls(
            dict(zip(ran["batch_id"].to_pylist(), times.to_pylist(), strict=True)),
            frozenset(offboarded["batch_id"].to_pylist()),
        )


def replay_key(
    tenant: str,
    records: pa.Table,
    history: KeyHistory,
    registry: TenantRegistry,
    max_record_bytes: int,
) -> dict[str, pa.Table]:
    """Every row the stream would have written for one key of `tenant` and these records with
    `registry`'s rules, per table (`REPLAYED_TABLES`), in the tables' schemas.

    The key runs in each batch of its `history`, at that batch's processing time (a batch with
    records but no known time, which should not happen, takes its newest Kafka timestamp), and
    is offboarded again where the stream offboarded it.
    """
    without_tenant = (
        TenantRegistry.build(
            registry.sources,
            {t: config for t, config in registry.tenants.items() if t != tenant},
            f"{registry.fingerprint}/without {tenant}",
        )
        if history.offboarded
        else registry
    )
    frame = records.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    by_batch = {int(batch): rows for batch, rows in frame.groupby("batch_id", sort=True)}
    out: dict[str, list[pa.Table]] = {spec.name: [] for spec in REPLAYED_TABLES}
    blob: bytes | None = None
    for batch_id in sorted({*by_batch, *history.batch_times_ms}):
        batch = by_batch.get(batch_id, frame.iloc[0:0]).drop(columns=["batch_id"])
        processing_time_ms = history.batch_times_ms.get(batch_id)
        if processing_time_ms is None:
            processing_time_ms = int(batch["kafka_timestamp_ms"].max())
        rules = without_tenant if batch_id in history.offboarded else registry
        routed = route_frame(batch.reset_index(drop=True), rules, max_record_bytes)
        run = run_bucket(blob, sorted_batch([routed]), rules, processing_time_ms)
        blob = run.blob
        for spec in REPLAYED_TABLES:
            rows = rows_for_table(run.rows, spec, batch_id)
            if rows.num_rows:
                out[spec.name].append(rows)
    return {
        spec.name: pa.concat_tables(out[spec.name]) if out[spec.name] else spec.schema.empty_table()
        for spec in REPLAYED_TABLES
    }


def oldest_open_window_ms(events: pa.Table, windows: pa.Table) -> int:
    """The start of the oldest window that holds records (`events`) but has no final pane
    (`windows`): still open. `NO_TIME` when every window is closed."""
    final = windows.filter(pc.equal(windows["is_final"], True))["window_id"]
    open_rows = events.filter(
        pc.invert(pc.is_in(events["window_id"], value_set=final.combine_chunks()))
    )
    oldest = pc.min(open_rows["window_start"]).as_py()
    return NO_TIME if oldest is None else int(oldest.timestamp() * 1000)


@dataclass(frozen=True)
class Scope:
    """The windows whose rows a reprocess replaces, in ms since the epoch: start >= `since_ms`,
    end <= `horizon_ms`."""

    since_ms: int
    horizon_ms: int

    def holds(self, rows: pa.Table) -> pa.ChunkedArray:
        """Which of `rows` (a windowed table's) belong to windows in scope."""
        start = pc.cast(pc.cast(rows["window_start"], pa.timestamp("ms", tz="UTC")), pa.int64())
        end = pc.cast(pc.cast(rows["window_end"], pa.timestamp("ms", tz="UTC")), pa.int64())
        return pc.and_(pc.greater_equal(start, self.since_ms), pc.less_equal(end, self.horizon_ms))


def scope_of(
    since_ms: int,
    until_ms: int,
    live: Mapping[str, pa.Table],
    replayed: Mapping[str, pa.Table],
) -> Scope:
    """The key's scope: from `since_ms` to the earliest of `until_ms` and the oldest window
    either the live stream (`live`: its current rows) or the replay leaves open."""
    horizon = min(
        until_ms,
        oldest_open_window_ms(live[EVENTS.name], live[WINDOWS.name]),
        oldest_open_window_ms(replayed[EVENTS.name], replayed[WINDOWS.name]),
    )
    return Scope(since_ms, horizon)


def record_ids(rows: pa.Table) -> set[tuple[str, int, int]]:
    """The (topic, partition, offset) of each record with a row in `rows`."""
    return set(
        zip(
            rows["topic"].to_pylist(),
            rows["partition"].to_pylist(),
            rows["offset"].to_pylist(),
            strict=True,
        )
    )
