"""The router's column-wise parser decides every record exactly as `parse_value` does.

Random records (valid ones, wrong types, missing and nested fields, unknown keys, numbers at the
edges, malformed bytes) go through `bulk_parsing.parse_values` as one frame and through the
reference `parsing.parse_value` one at a time; every column must agree, reasons and messages
included.
"""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streaming.records.bulk_parsing import RoutedColumns, parse_values, unpacked_metric_values
from streaming.records.parsing import parse_value
from tenants.conf_reader import load_registry
from tenants.registry import TenantRegistry
from tests.support.sample_conf import SAMPLE_CONF

MAX_BYTES = 300

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -0.0, 1e308, 253_402_300_799_999, 253_402_300_800_000, "ERROR", ""]),
    st.text(max_size=8),
)
times = st.one_of(
    scalars,
    st.sampled_from(
        [
            "2026-01-01T00:00:01.250Z",
            "2026-01-01T00:00:01+02:00",
            "2026-01-01",
            "1969-12-31T23:59:59Z",
            "9999-12-31T23:59:59.999+00:00",
            "0001-01-01T00:00:00-23:59",
            "yesterday",
        ]
    ),
    st.integers(0, 2_000_000_000_000),
    st.floats(0, 2e12, allow_nan=False),
)
records = st.fixed_dictionaries(
    {},
    optional={
        "tenant": st.one_of(
            st.sampled_from(["acme", "globex", "initech", "nobody", "Bad!"]), scalars
        ),
        "source": st.one_of(st.sampled_from(["web", "billing", "app", "other"]), scalars),
        "ts": times,
        "meta": st.one_of(st.fixed_dictionaries({}, optional={"event_ms": times}), scalars),
        "amount": scalars,
        "level": st.one_of(st.sampled_from(["ERROR", "INFO"]), scalars),
        "event_id": scalars,
    },
)
values = st.one_of(
    records.map(lambda record: json.dumps(record).encode()),
    st.sampled_from(
        [
            None,
            b"",
            b"{",
            b"[1, 2]",
            b'"text"',
            b"\xef\xbb\xbf{}",
            b'{"tenant": "acme", "source": "web", "ts": NaN}',
            b'{"tenant": "acme", "source": "web", "ts": "2026-01-01T00:00:00Z", "amount": Infinity}',
            b'{"tenant": "acme", "tenant": "globex", "source": "billing", "meta": {"event_ms": 1}}',
            b'{"tenant": "acme", "source": "web", "ts": "2026-01-01T00:00:00Z", "amount": 1'
            + b"0" * 400
            + b"}",
            b'{"tenant": "acme", "source": "web", "ts": "2026-01-01T00:00:00Z", "level": "\\ud800"}',
            b'{"tenant": "acme", "source": "web", "ts": "\xff"}',
            b'{"tenant": "acme", "source": "web", "ts": 1e400}',
        ]
    ),
)


@pytest.fixture(scope="module")
def registry() -> TenantRegistry:
    return load_registry(SAMPLE_CONF)


def _reference(values: list[bytes | None], registry: TenantRegistry) -> RoutedColumns:
    columns = RoutedColumns.empty(len(values))
    for index, value in enumerate(values):
        columns.set_outcome(index, parse_value(value, registry, MAX_BYTES))
    return columns


@settings(
    max_examples=400,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(batch=st.lists(values, max_size=30))
def test_the_column_wise_parser_agrees_with_the_reference_on_every_record(
    registry: TenantRegistry, batch: list[bytes | None]
) -> None:
    bulk = parse_values(batch, registry, MAX_BYTES)
    reference = _reference(batch, registry)
    bulk.slow_records = reference.slow_records
    assert bulk == reference


def test_ordinary_records_take_the_fast_path(registry: TenantRegistry) -> None:
    web = {"tenant": "acme", "source": "web", "ts": "2026-01-01T00:00:00Z", "amount": 2}
    billing = {"tenant": "globex", "source": "billing", "meta": {"event_ms": 5}, "amount": 1.5}
    routed = parse_values([orjson.dumps(web), orjson.dumps(billing), b"{"], registry, MAX_BYTES)
    assert routed.slow_records == 1
    assert routed.event_time_ms == [1_767_225_600_000, 5, None]
    assert [unpacked_metric_values(values) for values in routed.metric_values[:2]] == [  # type: ignore[arg-type]
        [0.0, 2.0],
        [1.5, 1.5, 1.5],
    ]
    assert routed.reason == [None, None, "malformed_json"]
