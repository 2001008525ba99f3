"""Routing and event-time extraction: every quarantine reason the parser decides, with its cause."""

from __future__ import annotations

import json

import pytest

from streaming.records.parsing import Accepted, QuarantineReason, Rejected, parse_value
from tenants.conf_reader import load_registry
from tenants.registry import TenantRegistry
from tests.support.sample_conf import SAMPLE_CONF

MAX_BYTES = 4_096


@pytest.fixture(scope="module")
def registry() -> TenantRegistry:
    return load_registry(SAMPLE_CONF)


def parse(registry: TenantRegistry, value: object) -> Accepted | Rejected:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return parse_value(raw, registry, MAX_BYTES)


def test_web_record_with_iso_time_is_accepted(registry: TenantRegistry) -> None:
    outcome = parse(
        registry,
        {"tenant": "acme", "source": "web", "ts": "2026-01-01T00:00:01.250Z", "event_id": 7},
    )
    assert outcome == Accepted(
        "acme", "web", 1_767_225_601_250, "7", {"errors": 0.0, "avg_amount": None}
    )


def test_metric_inputs_follow_the_sources_metrics(registry: TenantRegistry) -> None:
    web = {"tenant": "acme", "source": "web", "ts": "2026-01-01T00:00:00Z"}
    error = parse(registry, {**web, "level": "ERROR", "amount": 3})
    wrong_kind = parse(registry, {**web, "level": 1, "amount": 2.5})
    assert isinstance(error, Accepted) and error.metric_inputs == {"errors": 1.0, "avg_amount": 3.0}
    assert isinstance(wrong_kind, Accepted)
    assert wrong_kind.metric_inputs == {"errors": 0.0, "avg_amount": 2.5}


def test_billing_record_with_nested_epoch_ms_is_accepted(registry: TenantRegistry) -> None:
    outcome = parse(registry, {"tenant": "globex", "source": "billing", "meta": {"event_ms": 5}})
    assert outcome == Accepted(
        "globex", "billing", 5, None, {"revenue": None, "largest": None, "smallest": None}
    )


def test_iso_time_with_offset_and_without_offset(registry: TenantRegistry) -> None:
    with_offset = parse(
        registry, {"tenant": "acme", "source": "web", "ts": "1970-01-01T01:00:00+01:00"}
    )
    naive = parse(registry, {"tenant": "acme", "source": "web", "ts": "1970-01-01T00:00:00.001"})
    assert isinstance(with_offset, Accepted) and with_offset.event_time_ms == 0
    assert isinstance(naive, Accepted) and naive.event_time_ms == 1


@pytest.mark.parametrize(
    ("value", "reason", "error_part"),
    [
        (b"{not json", QuarantineReason.MALFORMED_JSON, "not valid UTF-8 JSON"),
        (b"\xff\xfe{}", QuarantineReason.MALFORMED_JSON, "not valid UTF-8 JSON"),
        ([1, 2], QuarantineReason.MALFORMED_JSON, "expected a JSON object"),
        (
            {"source": "web", "ts": "2026-01-01T00:00:00Z"},
            QuarantineReason.MISSING_FIELD,
            "'tenant'",
        ),
        ({"tenant": 5, "source": "web"}, QuarantineReason.MISSING_FIELD, "must be a string"),
        ({"tenant": "acme"}, QuarantineReason.MISSING_FIELD, "'source'"),
        ({"tenant": "acme", "source": "web"}, QuarantineReason.MISSING_FIELD, "'ts' is missing"),
        ({"tenant": "acme", "source": "web", "ts": None}, QuarantineReason.MISSING_FIELD, "null"),
        (
            {"tenant": "acme", "source": "web", "ts": "soon"},
            QuarantineReason.BAD_EVENT_TIME,
            "'ts'",
        ),
        (
            {"tenant": "acme", "source": "web", "ts": 12},
            QuarantineReason.BAD_EVENT_TIME,
            "ISO 8601",
        ),
        (
            {"tenant": "acme", "source": "web", "ts": "1969-12-31T23:59:59Z"},
            QuarantineReason.BAD_EVENT_TIME,
            "outside",
        ),
        (
            {"tenant": "acme", "source": "billing", "meta": {"event_ms": "5"}},
            QuarantineReason.BAD_EVENT_TIME,
            "expected a number",
        ),
        (
            {"tenant": "acme", "source": "billing", "meta": {"event_ms": True}},
            QuarantineReason.BAD_EVENT_TIME,
            "expected a number",
        ),
        (
            {"tenant": "acme", "source": "billing", "meta": {"event_ms": 1e300}},
            QuarantineReason.BAD_EVENT_TIME,
            "outside",
        ),
        ({"tenant": "nobody", "source": "web"}, QuarantineReason.UNKNOWN_TENANT, "'nobody'"),
        ({"tenant": "../acme", "source": "web"}, QuarantineReason.UNKNOWN_TENANT, "'../acme'"),
        ({"tenant": "ACME", "source": "web"}, QuarantineReason.UNKNOWN_TENANT, "'ACME'"),
        ({"tenant": "acme", "source": "mobile"}, QuarantineReason.UNKNOWN_SOURCE, "'mobile'"),
        (b"x" * (MAX_BYTES + 1), QuarantineReason.TOO_LARGE, f"limit is {MAX_BYTES}"),
        (
            {"tenant": "acme", "source": "web", "ts": "2026-01-01T00:00:00Z", "amount": "12"},
            QuarantineReason.BAD_METRIC_VALUE,
            "'amount'",
        ),
    ],
)
def test_rejected_records_say_why(
    registry: TenantRegistry, value: object, reason: QuarantineReason, error_part: str
) -> None:
    outcome = parse(registry, value)
    assert isinstance(outcome, Rejected)
    assert outcome.reason is reason
    assert error_part in outcome.error


def test_a_rejected_record_keeps_the_tenant_it_claimed(registry: TenantRegistry) -> None:
    outcome = parse(registry, {"tenant": "acme", "source": "web", "ts": "soon"})
    assert isinstance(outcome, Rejected)
    assert (outcome.tenant, outcome.source) == ("acme", "web")


def test_null_kafka_value_is_malformed(registry: TenantRegistry) -> None:
    outcome = parse_value(None, registry, MAX_BYTES)
    assert isinstance(outcome, Rejected) and outcome.reason is QuarantineReason.MALFORMED_JSON


def test_numbers_python_cannot_hold_are_quarantined_not_fatal(registry: TenantRegistry) -> None:
    web = b'{"tenant": "acme", "source": "web", "ts": "2026-01-01T00:00:00Z", '
    long_integer = parse_value(web + b'"n": ' + b"9" * 5_000 + b"}", registry, 10_000)
    beyond_double = parse_value(web + b'"amount": 1' + b"0" * 400 + b"}", registry, 10_000)
    assert isinstance(long_integer, Rejected)
    assert long_integer.reason is QuarantineReason.MALFORMED_JSON
    assert isinstance(beyond_double, Rejected)
    assert beyond_double.reason is QuarantineReason.BAD_METRIC_VALUE
    assert "'amount'" in beyond_double.error
