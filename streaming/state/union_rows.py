"""The stateful stage's output: one union row per output row, tagged with its table (`kind`).

A bucket call emits rows for five tables as one Arrow table, so they share one schema,
`OUTPUT_ARROW_SCHEMA`: every table's columns, null where a table has none. `UnionRows` gathers a
bucket call's rows, from keys advanced as columns and keys advanced record by record, and builds
the table once. It crosses Spark packed (`storage.lake.packed_rows`, `PACKED_OUTPUT_SCHEMA`), and
the sink's writer splits it by `kind` (`storage.lake.tables.rows_for_table`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql.types import BinaryType, StructField, StructType

from storage.lake.packed_rows import PACKED_COLUMN
from storage.lake.tables import (
    EVENTS,
    LATE_EVENTS,
    METRICS,
    QUARANTINE,
    TENANT_STATUS,
    UNION_ROWS,
    WINDOWS,
)
from streaming.state.bucket_state import Key, StoredKey
from streaming.windowing.columnar_windows import BucketAdvance, optional_times, window_ids
from streaming.windowing.key_state import Timing
from streaming.windowing.key_windows import Assignment, BatchResult, Pane, TooLate

OUTPUT_ARROW_SCHEMA = UNION_ROWS
"""The union rows' schema, owned by the writer that reads them (`storage.lake.tables`)."""
PACKED_OUTPUT_SCHEMA = StructType([StructField(PACKED_COLUMN, BinaryType())])
"""What the stateful stage hands Spark: its union rows packed (`storage.lake.packed_rows`)."""
_RECORD_COLUMNS = ["topic", "partition", "offset", "kafka_timestamp_ms", "key", "value"]


class Lifecycle(StrEnum):
    """Where a key stands, as its `tenant_status` rows say."""

    CONFIGURED = "configured"
    """Its config appeared in this batch; no record has been processed yet."""
    ACTIVE = "active"
    OFFBOARDED = "offboarded"
    """Its config is gone: its windows got their final panes and its state was dropped."""


@dataclass
class UnionRows:
    """The union rows of one bucket call, gathered per table and built into one table.

    Keys advanced as columns give their rows as Arrow tables at once. Keys that went record by
    record give windowing objects, turned into columns once per bucket, one list comprehension
    per column. The union is assembled in Arrow, where a column another table does not have
    costs one null array.
    """

    batch: pd.DataFrame
    tables: list[pa.Table] = field(default_factory=list)
    """Rows of the keys advanced as columns."""
    assignments: list[tuple[Key, int, Assignment]] = field(default_factory=list)
    too_late: list[tuple[Key, int, TooLate]] = field(default_factory=list)
    panes: list[tuple[Key, Pane]] = field(default_factory=list)
    statuses: list[tuple[Key, StoredKey, int, Lifecycle]] = field(default_factory=list)
    _arrow_batch: dict[str, pa.Array] = field(default_factory=dict)
    """The batch's columns in Arrow, converted once each: a bucket's rules groups and tables
    each take rows from them."""

    def add_columns(
        self,
        result: BucketAdvance,
        rows: np.ndarray,
        record_key: np.ndarray,
        names: list[str],
        processing_time_ms: int,
    ) -> None:
        """The rows of keys advanced together: `rows[i]` is record i's row in the batch,
        `record_key[i]` its key in `result.keys`."""
        keys, panes = result.keys, result.panes
        placed, rejected = result.placements, result.rejections

        def record_columns(kind: str, record: np.ndarray) -> dict[str, Any]:
            key = record_key[record]
            return self._record_columns(kind, rows[record], keys.tenant[key], keys.source[key])

        if len(placed.record_index):
            record = placed.record_index
            self.tables.append(
                union_table(
                    {
                        **record_columns(EVENTS.name, record),
                        "window_id": window_ids(placed.window_start_ms, placed.window_end_ms),
                        "window_start_ms": placed.window_start_ms,
                        "window_end_ms": placed.window_end_ms,
                        "pane_index": placed.pane_index,
                        "timing": np.where(placed.late, Timing.LATE.value, Timing.ON_TIME.value),
                    },
                    len(record),
                )
            )
        if len(rejected.record_index):
            record = rejected.record_index
            self.tables.append(
                union_table(
                    {
                        **record_columns(LATE_EVENTS.name, record),
                        "window_start_ms": rejected.window_start_ms,
                        "window_end_ms": rejected.window_end_ms,
                        "lateness_ms": rejected.watermark_ms - rejected.window_end_ms,
                        "watermark_ms": rejected.watermark_ms,
                    },
                    len(record),
                )
            )
        if len(panes.key):
            self.tables.append(
                union_table(
                    {
                        "kind": _repeated(WINDOWS.name, len(panes.key)),
                        "tenant": keys.tenant[panes.key],
                        "source": keys.source[panes.key],
                        "window_id": window_ids(panes.window_start_ms, panes.window_end_ms),
                        "window_start_ms": panes.window_start_ms,
                        "window_end_ms": panes.window_end_ms,
                        "pane_index": panes.pane_index,
                        "timing": np.where(panes.late, Timing.LATE.value, Timing.ON_TIME.value),
                        "is_final": panes.is_final,
                        "count": panes.count,
                        "metrics": panes.metrics_map(names),
                        "merged_window_ids": _no_merged_ids(len(panes.key)),
                        "watermark_ms": optional_times(panes.watermark_ms),
                    },
                    len(panes.key),
                )
            )
        count = len(keys.tenant)
        self.tables.append(
            union_table(
                {
                    "kind": _repeated(TENANT_STATUS.name, count),
                    "tenant": keys.tenant,
                    "source": keys.source,
                    "watermark_ms": optional_times(keys.watermark_ms),
                    "max_event_time_ms": optional_times(keys.max_event_time_ms),
                    "open_windows": np.bincount(keys.windows.key, minlength=count),
                    "last_record_processing_ms": optional_times(keys.last_record_processing_ms),
                    "processing_time_ms": np.full(count, processing_time_ms, np.int64),
                    "on_time_records": keys.on_time_records,
                    "late_records": keys.late_records,
                    "too_late_records": keys.too_late_records,
                    "quarantined_records": keys.quarantined_records,
                    "lifecycle": _repeated(Lifecycle.ACTIVE.value, count),
                },
                count,
            )
        )

    def add_result(self, key: Key, rows: list[int], result: BatchResult) -> None:
        self.assignments += [(key, rows[a.record_index], a) for a in result.assignments]
        self.too_late += [(key, rows[t.record_index], t) for t in result.too_late]
        self.panes += [(key, pane) for pane in result.panes]

    def add_status(
        self, key: Key, stored: StoredKey, processing_time_ms: int, lifecycle: Lifecycle
    ) -> None:
        self.statuses.append((key, stored, processing_time_ms, lifecycle))

    def set_quarantine(self, reasons: list[str | None], errors: list[str | None]) -> None:
        """The stage quarantined more of the batch's records than routing did: every record's
        reason and error now."""
        self.batch["reason"] = reasons
        self.batch["error"] = errors
        self._arrow_batch.pop("reason", None)
        self._arrow_batch.pop("error", None)

    def table(self) -> pa.Table:
        parts = [
            part
            for part in (
                *self.tables,
                self._event_rows(),
                self._late_rows(),
                self._pane_rows(),
                self._status_rows(),
                self._quarantine_rows(),
            )
            if part is not None
        ]
        return pa.concat_tables(parts) if parts else OUTPUT_ARROW_SCHEMA.empty_table()

    def _event_rows(self) -> pa.Table | None:
        if not self.assignments:
            return None
        objects = [assignment for _, _, assignment in self.assignments]
        return union_table(
            {
                **self._object_record_columns(EVENTS.name, self.assignments),
                "window_id": [a.window_id for a in objects],
                "window_start_ms": [a.window_start_ms for a in objects],
                "window_end_ms": [a.window_end_ms for a in objects],
                "pane_index": [a.pane_index for a in objects],
                "timing": [a.timing.value for a in objects],
            },
            len(objects),
        )

    def _late_rows(self) -> pa.Table | None:
        if not self.too_late:
            return None
        objects = [too_late for _, _, too_late in self.too_late]
        return union_table(
            {
                **self._object_record_columns(LATE_EVENTS.name, self.too_late),
                "window_start_ms": [t.window_start_ms for t in objects],
                "window_end_ms": [t.window_end_ms for t in objects],
                "lateness_ms": [t.lateness_ms for t in objects],
                "watermark_ms": [t.watermark_ms for t in objects],
            },
            len(objects),
        )

    def _object_record_columns(
        self, kind: str, objects: list[tuple[Key, int, Assignment]] | list[tuple[Key, int, TooLate]]
    ) -> dict[str, Any]:
        return self._record_columns(
            kind,
            np.array([row for _, row, _ in objects], dtype=np.int64),
            [key[0] for key, _, _ in objects],
            [key[1] for key, _, _ in objects],
        )

    def _record_columns(
        self, kind: str, rows: np.ndarray, tenants: Any, sources: Any
    ) -> dict[str, Any]:
        """The batch's columns of these records, and their keys."""
        return {
            **self._batch_columns(rows, [*_RECORD_COLUMNS, "event_time_ms", "event_id"]),
            "kind": _repeated(kind, len(rows)),
            "tenant": tenants,
            "source": sources,
        }

    def _quarantine_rows(self) -> pa.Table | None:
        if "reason" not in self.batch:
            return None
        indexes = np.flatnonzero(self.batch["reason"].notna().to_numpy())
        if not len(indexes):
            return None
        columns = ["tenant", "source", *_RECORD_COLUMNS, "event_id", "reason", "error"]
        return union_table(
            {
                **self._batch_columns(indexes, columns),
                "kind": _repeated(QUARANTINE.name, len(indexes)),
            },
            len(indexes),
        )

    def _batch_columns(self, indexes: np.ndarray, names: list[str]) -> dict[str, Any]:
        """The batch's rows at `indexes`, in the given columns."""
        return {name: self._arrow_column_of_batch(name).take(indexes) for name in names}

    def _arrow_column_of_batch(self, name: str) -> pa.Array:
        column = self._arrow_batch.get(name)
        if column is None:
            # pandas' missing values (None, NaN or NA) become nulls.
            column = pa.Array.from_pandas(
                self.batch[name], type=OUTPUT_ARROW_SCHEMA.field(name).type
            )
            self._arrow_batch[name] = column
        return column

    def _pane_rows(self) -> pa.Table | None:
        if not self.panes:
            return None
        panes = [pane for _, pane in self.panes]
        return union_table(
            {
                "kind": _repeated(WINDOWS.name, len(panes)),
                "tenant": [key[0] for key, _ in self.panes],
                "source": [key[1] for key, _ in self.panes],
                "window_id": [p.window_id for p in panes],
                "window_start_ms": [p.window_start_ms for p in panes],
                "window_end_ms": [p.window_end_ms for p in panes],
                "pane_index": [p.pane_index for p in panes],
                "timing": [p.timing.value for p in panes],
                "is_final": [p.is_final for p in panes],
                "count": [p.count for p in panes],
                "metrics": pa.array([sorted(p.metrics.items()) for p in panes], METRICS),
                "merged_window_ids": [list(p.merged_window_ids) for p in panes],
                "watermark_ms": [p.watermark_ms for p in panes],
            },
            len(panes),
        )

    def _status_rows(self) -> pa.Table | None:
        if not self.statuses:
            return None
        stored_keys = [stored for _, stored, _, _ in self.statuses]
        states = [stored.key_state for stored in stored_keys]
        return union_table(
            {
                "kind": _repeated(TENANT_STATUS.name, len(states)),
                "tenant": [key[0] for key, _, _, _ in self.statuses],
                "source": [key[1] for key, _, _, _ in self.statuses],
                "watermark_ms": [state.watermark_ms for state in states],
                "max_event_time_ms": [state.max_event_time_ms for state in states],
                "open_windows": [len(state.windows) for state in states],
                "last_record_processing_ms": [state.last_record_processing_ms for state in states],
                "processing_time_ms": [now_ms for _, _, now_ms, _ in self.statuses],
                "on_time_records": [state.on_time_records for state in states],
                "late_records": [state.late_records for state in states],
                "too_late_records": [state.too_late_records for state in states],
                "quarantined_records": [stored.quarantined_records for stored in stored_keys],
                "lifecycle": [lifecycle.value for _, _, _, lifecycle in self.statuses],
            },
            len(states),
        )


def union_table(columns: dict[str, Any], rows: int) -> pa.Table:
    """A table of the union schema: `columns` as given, every other column null.

    A column is a list of values, a NumPy array or an Arrow array.
    """
    arrays = [
        _arrow_column(columns[field.name], field.type)
        if field.name in columns
        else pa.nulls(rows, field.type)
        for field in OUTPUT_ARROW_SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=OUTPUT_ARROW_SCHEMA)


def _repeated(value: str, rows: int) -> pa.Array:
    """`value` in every row: built by Arrow, not from a Python list of `rows` strings."""
    return pa.repeat(pa.scalar(value, pa.string()), rows)


def _no_merged_ids(rows: int) -> pa.ListArray:
    """Fixed windows merge nothing: an empty list per pane."""
    return pa.ListArray.from_arrays(
        pa.array(np.zeros(rows + 1, np.int32)), pa.array([], pa.string())
    )


def _arrow_column(values: Any, arrow_type: pa.DataType) -> pa.Array:
    if isinstance(values, pa.Array):
        return values if values.type == arrow_type else values.cast(arrow_type)
    return pa.array(values, arrow_type)
