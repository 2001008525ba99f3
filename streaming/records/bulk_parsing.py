"""`parse_value` for a whole frame of Kafka values at once: what the router runs.

`parsing.parse_value` stays the reference, one record at a time. Here an ordinary record (a JSON
object whose tenant and source are strings, whose event time and metric fields have the types
their source expects) is decoded with orjson and routed once per key; the records of all keys
that read their fields the same way (most keys of a source) are then read in one pass per field.
Any other record goes through `parse_value` itself, so the two never disagree on an outcome, a
reason or a message (`tests/unit/streaming/records/test_bulk_parsing.py` checks it on random
records). At 10 tenants
this took routing from about 29 to a few µs per record (`infra/dev/benchmarks/windowing_cost`).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
import orjson

from streaming.records.parsing import (
    MAX_EVENT_TIME_MS,
    Accepted,
    Rejected,
    lookup,
    parse_value,
    route_key,
    same_value,
)
from tenants.models import EventTimeFormat, EventTimeSpec, MetricKind, MetricSpec
from tenants.registry import TenantRegistry

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_UTF8_BOM = b"\xef\xbb\xbf"
# Integers this large or larger do not fit a double: the reference rejects them.
_DOUBLE_LIMIT = 2**1023
METRIC_VALUE_DTYPE = np.dtype("<f8")
"""A packed metric value (`packed_metric_values`): a little-endian double."""
_SLOW = object()
"""A field the fast path leaves to `parse_value`."""


@dataclass
class RoutedColumns:
    """One entry per value, in order: `routing.ROUTED_SCHEMA`'s parsed columns."""

    tenant: list[str | None]
    source: list[str | None]
    event_time_ms: list[int | None]
    event_id: list[str | None]
    metric_values: list[bytes | None]
    """The metric inputs, in the order of the source's metrics (`packed_metric_values`); None:
    the source has no metrics."""
    reason: list[str | None]
    error: list[str | None]
    slow_records: int = field(default=0)
    """How many went through `parse_value` one by one."""

    @classmethod
    def empty(cls, count: int) -> RoutedColumns:
        return cls(
            [None] * count,
            [None] * count,
            [None] * count,
            [None] * count,
            [None] * count,
            [None] * count,
            [None] * count,
        )

    def set_outcome(self, index: int, outcome: Accepted | Rejected) -> None:
        self.tenant[index], self.source[index] = outcome.tenant, outcome.source
        if isinstance(outcome, Accepted):
            self.event_time_ms[index] = outcome.event_time_ms
            self.event_id[index] = outcome.event_id
            self.metric_values[index] = packed_metric_values(list(outcome.metric_inputs.values()))
        else:
            self.reason[index], self.error[index] = outcome.reason.value, outcome.error


def packed_metric_values(values: Sequence[float | None]) -> bytes | None:
    """A record's metric inputs as the stateful stage reads them without parsing: float64,
    little-endian, NaN where a metric has no value (an input is never NaN: the parser refuses
    non-finite numbers); None when there are none."""
    if not values:
        return None
    return struct.pack(
        _metric_format(len(values)), *[math.nan if value is None else value for value in values]
    )


def unpacked_metric_values(packed: bytes) -> list[float | None]:
    """`packed_metric_values` read back: None where a metric has no value."""
    return [
        None if math.isnan(value) else value
        for value in struct.unpack(
            _metric_format(len(packed) // METRIC_VALUE_DTYPE.itemsize), packed
        )
    ]


def _metric_format(metrics: int) -> str:
    """`struct`'s format of `metrics` values of `METRIC_VALUE_DTYPE`, one after the other."""
    return f"<{metrics}d"


def parse_values(
    values: Sequence[bytes | None], registry: TenantRegistry, max_record_bytes: int
) -> RoutedColumns:
    columns = RoutedColumns.empty(len(values))
    decoded = [_decode(value, max_record_bytes) for value in values]
    slow: list[int] = []
    by_key: dict[tuple[str, str], list[int]] = {}
    for index, record in enumerate(decoded):
        if record is None:
            slow.append(index)
            continue
        tenant, source = record.get("tenant"), record.get("source")
        if type(tenant) is str and type(source) is str:
            by_key.setdefault((tenant, source), []).append(index)
        else:
            slow.append(index)
    # Keys that read their records the same way (most keys of a source) are read together, so a
    # key with one record a batch (100,000 tenants) costs a route and no pass of its own.
    by_plan: dict[tuple[int, int], _Plan] = {}
    for (tenant, source), indexes in by_key.items():
        route = route_key(tenant, source, registry)
        if isinstance(route, Rejected):
            for index in indexes:
                columns.set_outcome(index, route)
            continue
        plan_id = (id(route.event_time), id(route.rules.metrics))
        plan = by_plan.get(plan_id)
        if plan is None:
            plan = by_plan[plan_id] = _Plan(route.event_time, route.rules.metrics)
        plan.indexes += indexes
        plan.keys += [(tenant, source)] * len(indexes)
    for plan in by_plan.values():
        records: list[dict[str, object]] = [decoded[index] for index in plan.indexes]  # type: ignore[misc]
        event_times = _event_times(records, plan.event_time)
        metrics = _metric_values(records, plan.metrics)
        for index, (tenant, source), record, event_time_ms, metric_values in zip(
            plan.indexes, plan.keys, records, event_times, metrics, strict=True
        ):
            if event_time_ms is None or metric_values is _SLOW:
                slow.append(index)
                continue
            event_id = record.get("event_id")
            columns.tenant[index], columns.source[index] = tenant, source
            columns.event_time_ms[index] = event_time_ms
            columns.event_id[index] = None if event_id is None else str(event_id)
            columns.metric_values[index] = metric_values  # type: ignore[call-overload]
    for index in slow:
        columns.set_outcome(index, parse_value(values[index], registry, max_record_bytes))
    columns.slow_records = len(slow)
    return columns


@dataclass
class _Plan:
    """How a group of keys' records are read: their event time and metrics, and the records."""

    event_time: EventTimeSpec
    metrics: dict[str, MetricSpec]
    indexes: list[int] = field(default_factory=list)
    keys: list[tuple[str, str]] = field(default_factory=list)
    """Each record's (tenant, source)."""


def _decode(value: bytes | None, max_record_bytes: int) -> dict[str, object] | None:
    """The value as a JSON object, or None: `parse_value` decides what it is."""
    # A leading BOM is an error to the reference's decoder; leave the message to it.
    if value is None or len(value) > max_record_bytes or value.startswith(_UTF8_BOM):
        return None
    try:
        record = orjson.loads(value)
    except orjson.JSONDecodeError:
        # Also what the reference accepts and orjson does not (NaN, integers beyond 64 bits).
        return None
    return record if type(record) is dict else None


def _event_times(records: list[dict[str, object]], spec: EventTimeSpec) -> list[int | None]:
    """Each record's event time, or None where `parse_value` must say what is wrong."""
    nodes = _field_column(records, spec.path)
    if spec.format is EventTimeFormat.ISO8601:
        return [_iso_ms(node) if type(node) is str else None for node in nodes]
    scale = 1 if spec.format is EventTimeFormat.EPOCH_MS else 1000
    return [_epoch_ms(node, scale) if type(node) in (int, float) else None for node in nodes]


def _epoch_ms(number: object, scale: int) -> int | None:
    scaled = number * scale  # type: ignore[operator]
    if type(scaled) is float and not math.isfinite(scaled):
        return None
    event_time_ms = math.floor(scaled)
    return event_time_ms if 0 <= event_time_ms <= MAX_EVENT_TIME_MS else None


def _iso_ms(text: str) -> int | None:
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    try:
        event_time_ms = (parsed - _EPOCH) // _ONE_MS
    except OverflowError:
        return None
    return event_time_ms if 0 <= event_time_ms <= MAX_EVENT_TIME_MS else None


def _metric_values(
    records: list[dict[str, object]], metrics: dict[str, MetricSpec]
) -> list[object]:
    """Each record's `packed_metric_values`, or `_SLOW` where `parse_value` must say what is
    wrong."""
    if not metrics:
        return [None] * len(records)
    per_metric = [_metric_column(records, spec) for spec in metrics.values()]
    slow = [_SLOW in column for column in per_metric]
    if any(slow):
        rows = list(zip(*per_metric, strict=True))
        return [_SLOW if _SLOW in row else packed_metric_values(row) for row in rows]
    # Most columns have a value in every record: only the others are rewritten.
    columns = [
        [math.nan if value is None else value for value in column] if None in column else column
        for column in per_metric
    ]
    pack = struct.Struct(_metric_format(len(columns))).pack
    return [pack(*row) for row in zip(*columns, strict=True)]


def _metric_column(records: list[dict[str, object]], spec: MetricSpec) -> list[object]:
    if spec.kind is MetricKind.COUNT:
        if spec.field is None:
            return [1.0] * len(records)
        expected = spec.equals
        return [
            1.0 if same_value(value, expected) else 0.0
            for value in _field_column(records, spec.path)
        ]
    return [_number(value) for value in _field_column(records, spec.path)]


def _field_column(records: list[dict[str, object]], path: tuple[str, ...]) -> list[object]:
    """`lookup` of one path in every record."""
    if len(path) == 1:
        name = path[0]
        return [record.get(name) for record in records]
    return [lookup(record, path) for record in records]


def _number(value: object) -> object:
    """A metric field's input: the number as a float, None (absent), or `_SLOW`."""
    if value is None:
        return None
    if type(value) is float:
        return value if math.isfinite(value) else _SLOW
    if type(value) is int and -_DOUBLE_LIMIT < value < _DOUBLE_LIMIT:
        return float(value)
    return _SLOW
