"""The output tables' schemas and partitioning (contract §5), and how a batch's rows become them.

The stateful stage emits one union row per output row, tagged with `kind`; `rows_for_table`
selects one table's rows and derives its typed columns (UTC timestamps, partition dates).

Staged, then settled. A table whose rows settle in per-tenant partitions (`events`, `windows`,
`late_events`) is partitioned by layout columns, not by `tenant` itself: `layout_tenant`,
`layout_source` (and `layout_window_date`) hold the row's own tenant, source (and window date)
once it has settled, and `layout_tenant = '_staged'` (the others null) while it waits for
compaction. A micro-batch therefore writes one staged file per write task whatever the number
of tenants, and compaction moves staged rows to their tenant's partition in one Delta commit
that removes the staged files and adds the settled ones: at every version each row is in
exactly one file. The logical columns (`tenant`, `source`, `window_date`) are stored in the data
files, so they read the same wherever the row is. No tenant id starts with `_`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TIMESTAMP = pa.timestamp("us", tz="UTC")
METRICS = pa.map_(pa.string(), pa.float64())


STAGED = "_staged"
"""`layout_tenant` of rows that have not settled in their tenant's partition yet."""
LAYOUT_PREFIX = "layout_"
TENANT_PARTITION_COLUMNS = (f"{LAYOUT_PREFIX}tenant", "tenant")
"""Partition columns naming the tenant a file belongs to: this release's layout column, or
`tenant` itself in a lake written before the staged layout."""


def tenant_partition_column(partition_columns: Collection[str]) -> str | None:
    """The partition column whose value is a file's tenant; None: files are not by tenant."""
    return next((c for c in TENANT_PARTITION_COLUMNS if c in partition_columns), None)


@dataclass(frozen=True)
class TableSpec:
    name: str
    schema: pa.Schema
    """The rows as readers see them."""
    partition_by: tuple[str, ...]
    """The Delta partition columns."""
    settles_by: tuple[str, ...] = ()
    """Columns of `schema` whose values name the partition a row settles in; `partition_by` is
    then their layout columns. Empty: rows are written straight to their partition."""
    sort_by: tuple[str, ...] = ()
    """A total order of the rows within a settled file, so compaction is deterministic."""
    counted_by: str | None = None
    """A column whose values every written file counts (`WrittenFile.value_counts`): the
    stream's metrics, without reading a row back on the driver."""
    row_unique: tuple[str, ...] = ()
    """Columns whose value is nearly every row's own (a record's id, payload, offset and
    times): a compressed file writes them without a dictionary, which for them was half of a
    batch's `events` file's encoding time and made the file no smaller."""

    @property
    def staged(self) -> bool:
        return bool(self.settles_by)

    @property
    def storage_schema(self) -> pa.Schema:
        """The Delta table's schema: the rows plus the layout columns."""
        if not self.staged:
            return self.schema
        layout = [
            pa.field(name, self.schema.field(settled).type)
            for name, settled in zip(self.partition_by, self.settles_by, strict=True)
        ]
        return pa.schema([*self.schema, *layout])


def _settled(*columns: str) -> dict[str, Any]:
    return {
        "partition_by": tuple(f"{LAYOUT_PREFIX}{column}" for column in columns),
        "settles_by": columns,
    }


_KAFKA_COORDINATES = [
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("kafka_timestamp", TIMESTAMP),
]
_KEY = [pa.field("tenant", pa.string()), pa.field("source", pa.string())]
_WINDOW = [
    pa.field("window_id", pa.string()),
    pa.field("window_start", TIMESTAMP),
    pa.field("window_end", TIMESTAMP),
    pa.field("window_date", pa.date32()),
]

EVENTS = TableSpec(
    "events",
    pa.schema(
        [
            *_KEY,
            *_WINDOW,
            pa.field("pane_index", pa.int32()),
            pa.field("timing", pa.string()),
            pa.field("event_time", TIMESTAMP),
            pa.field("event_id", pa.string()),
            *_KAFKA_COORDINATES,
            pa.field("payload", pa.string()),
            pa.field("batch_id", pa.int64()),
        ]
    ),
    **_settled("tenant", "source", "window_date"),
    sort_by=(
        "tenant",
        "source",
        "window_start",
        "window_id",
        "topic",
        "partition",
        "offset",
        "pane_index",
        "batch_id",
    ),
    counted_by="timing",
    row_unique=("event_time", "event_id", "offset", "kafka_timestamp", "payload"),
)
WINDOWS = TableSpec(
    "windows",
    pa.schema(
        [
            *_KEY,
            *_WINDOW,
            pa.field("pane_index", pa.int32()),
            pa.field("timing", pa.string()),
            pa.field("is_final", pa.bool_()),
            pa.field("count", pa.int64()),
            pa.field("metrics", METRICS),
            pa.field("merged_window_ids", pa.list_(pa.string())),
            pa.field("watermark", TIMESTAMP),
            pa.field("batch_id", pa.int64()),
        ]
    ),
    **_settled("tenant", "source", "window_date"),
    sort_by=("tenant", "source", "window_start", "window_id", "pane_index", "batch_id"),
)
LATE_EVENTS = TableSpec(
    "late_events",
    pa.schema(
        [
            *_KEY,
            *_WINDOW,
            pa.field("event_time", TIMESTAMP),
            pa.field("lateness_ms", pa.int64()),
            pa.field("watermark", TIMESTAMP),
            pa.field("event_id", pa.string()),
            *_KAFKA_COORDINATES,
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("batch_id", pa.int64()),
        ]
    ),
    **_settled("tenant", "source"),
    sort_by=("tenant", "source", "topic", "partition", "offset", "window_start", "batch_id"),
    row_unique=("event_time", "event_id", "offset", "kafka_timestamp", "key", "value"),
)
QUARANTINE = TableSpec(
    "quarantine",
    pa.schema(
        [
            pa.field("reason", pa.string()),
            pa.field("ingest_date", pa.date32()),
            pa.field("error", pa.string()),
            *_KEY,
            *_KAFKA_COORDINATES,
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("batch_id", pa.int64()),
        ]
    ),
    ("reason", "ingest_date"),
    row_unique=("offset", "kafka_timestamp", "key", "value"),
)
TENANT_STATUS = TableSpec(
    "tenant_status",
    pa.schema(
        [
            *_KEY,
            pa.field("watermark", TIMESTAMP),
            pa.field("max_event_time", TIMESTAMP),
            pa.field("open_windows", pa.int32()),
            pa.field("last_record_processing_time", TIMESTAMP),
            pa.field("processing_time", TIMESTAMP),
            pa.field("on_time_records", pa.int64()),
            pa.field("late_records", pa.int64()),
            pa.field("too_late_records", pa.int64()),
            pa.field("quarantined_records", pa.int64()),
            pa.field("batch_id", pa.int64()),
            # `configured`, `active` or `offboarded` (streaming.state.union_rows.Lifecycle); added
            # after the table's first release, so null in rows written before it.
            pa.field("lifecycle", pa.string()),
        ]
    ),
    (),
)
ALL_TABLES = (EVENTS, WINDOWS, LATE_EVENTS, QUARANTINE, TENANT_STATUS)
"""The stream's output: every micro-batch commits to each of these (`pipeline.batch_sink`)."""
STAGED_TABLES = tuple(spec for spec in ALL_TABLES if spec.staged)
"""The tables whose rows are staged, then settled by compaction."""

# Notification deliveries (`delivery_outbox`): one row per attempt to tell an endpoint about
# a committed pane. Written by the notifier, never by a micro-batch, so not in ALL_TABLES.
DELIVERIES = TableSpec(
    "deliveries",
    pa.schema(
        [
            pa.field("stream", pa.string()),
            pa.field("idempotency_key", pa.string()),
            *_KEY,
            pa.field("window_start", TIMESTAMP),
            pa.field("pane_index", pa.int32()),
            pa.field("windows_batch_id", pa.int64()),
            pa.field("endpoint_id", pa.string()),
            pa.field("endpoint", pa.string()),
            pa.field("kind", pa.string()),
            pa.field("attempt", pa.int32()),
            pa.field("status_code", pa.int32()),
            pa.field("error", pa.string()),
            pa.field("outcome", pa.string()),
            pa.field("attempted_at", TIMESTAMP),
            pa.field("succeeded_at", TIMESTAMP),
            pa.field("body", pa.string()),
        ]
    ),
    (),
)
REHEARSALS_DIR = "_rehearsal"
"""Under the lake root: `<stream>/`, a standby's scratch lake while it rehearses
(`streaming.pipeline.rehearsal`), removed after it."""
REPROCESS_PLANS_DIR = "_reprocess"
"""Under the lake root: `<stream>/<tenant>/run-<N>.json`, each `tenants reprocess` run's plan
(`streaming.repair.reprocess`)."""
LAKE_TABLES = (*ALL_TABLES, DELIVERIES)
"""Every table under the lake root: what is created, vacuumed and optimized."""
APPENDED_TABLES = tuple(spec for spec in LAKE_TABLES if not spec.staged)
"""The tables whose rows go straight to their partitions, a file per batch and task (per
delivery for `deliveries`), with no stream to settle them: compaction packs their small files."""


UNION_ROWS = pa.schema(
    [
        pa.field("kind", pa.string()),
        pa.field("tenant", pa.string()),
        pa.field("source", pa.string()),
        pa.field("window_id", pa.string()),
        pa.field("window_start_ms", pa.int64()),
        pa.field("window_end_ms", pa.int64()),
        pa.field("pane_index", pa.int32()),
        pa.field("timing", pa.string()),
        pa.field("is_final", pa.bool_()),
        pa.field("count", pa.int64()),
        pa.field("metrics", METRICS),
        pa.field("merged_window_ids", pa.list_(pa.string())),
        pa.field("event_time_ms", pa.int64()),
        pa.field("lateness_ms", pa.int64()),
        pa.field("watermark_ms", pa.int64()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("kafka_timestamp_ms", pa.int64()),
        pa.field("event_id", pa.string()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("reason", pa.string()),
        pa.field("error", pa.string()),
        # tenant_status only
        pa.field("max_event_time_ms", pa.int64()),
        pa.field("open_windows", pa.int32()),
        pa.field("last_record_processing_ms", pa.int64()),
        pa.field("processing_time_ms", pa.int64()),
        pa.field("on_time_records", pa.int64()),
        pa.field("late_records", pa.int64()),
        pa.field("too_late_records", pa.int64()),
        pa.field("quarantined_records", pa.int64()),
        pa.field("lifecycle", pa.string()),
    ]
)
"""The stateful stage's output rows (`streaming.state.union_rows`): every table's columns, each
row tagged with its table (`kind`), null where its table has no such column. Times are epoch ms;
`metrics` and `merged_window_ids` are already the `windows` table's types, so the writer derives
nothing per row."""

_DERIVED_TIMES = {
    "window_start": "window_start_ms",
    "window_end": "window_end_ms",
    "event_time": "event_time_ms",
    "watermark": "watermark_ms",
    "kafka_timestamp": "kafka_timestamp_ms",
    "max_event_time": "max_event_time_ms",
    "last_record_processing_time": "last_record_processing_ms",
    "processing_time": "processing_time_ms",
}
"""Table columns that are a union column's epoch ms as a UTC timestamp."""


def rows_for_table(batch: pa.Table, spec: TableSpec, batch_id: int) -> pa.Table:
    """The rows of `batch` (`UNION_ROWS`, from the stateful stage) that belong to `spec`.

    Column-wise only: at 100,000 tenants a batch has a `tenant_status` row per key."""
    # Only the union columns this table reads are filtered: a batch's union rows have 33
    # columns, `events` reads 8 of them, and each table's filter copied every column.
    rows = batch.select(_union_columns(spec, batch.schema)).filter(
        pc.equal(batch["kind"], spec.name)
    )

    def column(name: str) -> pa.ChunkedArray | pa.Array:
        if name == "batch_id":
            return pa.array(np.full(rows.num_rows, batch_id, np.int64))
        values = rows[_union_column(name)]
        if name in _DERIVED_TIMES:
            return _timestamp(values)
        if name in _DERIVED_DATES:
            return pc.cast(_timestamp(values), pa.date32())
        if name == "payload":
            # Accepted values were decoded as UTF-8 JSON objects upstream: this cannot fail.
            return pc.cast(values, pa.string())
        return values

    columns = [_typed(column(field.name), field.type) for field in spec.schema]
    return pa.Table.from_arrays(columns, schema=spec.schema)


def _union_columns(spec: TableSpec, union: pa.Schema) -> list[str]:
    """The union columns `rows_for_table` reads for `spec`."""
    wanted = {_union_column(field.name) for field in spec.schema}
    return [name for name in union.names if name in wanted]


def _union_column(name: str) -> str:
    """The union column a table column is read from."""
    return _DERIVED_TIMES.get(name) or _DERIVED_DATES.get(name) or _PAYLOAD.get(name, name)


_DERIVED_DATES = {
    "window_date": "window_start_ms",
    # From the Kafka timestamp, not the clock, so a replay lands identically.
    "ingest_date": "kafka_timestamp_ms",
}
"""Table columns that are a union column's epoch ms as a UTC date."""
_PAYLOAD = {"payload": "value"}
"""The record's value, as text."""


def _typed(
    values: pa.ChunkedArray | pa.Array, arrow_type: pa.DataType
) -> pa.ChunkedArray | pa.Array:
    return values if values.type == arrow_type else values.cast(arrow_type)


def with_layout(rows: pa.Table, spec: TableSpec, settled: bool) -> pa.Table:
    """`rows` (in `spec.schema`) with the layout columns: staged, or settled in their own
    tenant's partition."""
    columns = list(rows.columns)
    for name, settles_by in zip(spec.partition_by, spec.settles_by, strict=True):
        if settled:
            columns.append(rows[settles_by])
        else:
            staged_value = STAGED if name == spec.partition_by[0] else None
            field_type = spec.schema.field(settles_by).type
            columns.append(pa.repeat(pa.scalar(staged_value, field_type), rows.num_rows))
    return pa.Table.from_arrays(columns, schema=spec.storage_schema)


def _timestamp(epoch_ms: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.cast(pc.cast(epoch_ms, pa.timestamp("ms", tz="UTC")), TIMESTAMP)
