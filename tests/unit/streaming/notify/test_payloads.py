"""What a notification says and under which key: idempotency keys, webhook bodies, Slack messages,
which panes qualify, and endpoints redacted for display."""

from __future__ import annotations

import hashlib
import json

import pytest

from streaming.notify.payloads import (
    PaneFacts,
    body_for,
    idempotency_key,
    qualifies,
    redact_endpoint,
    slack_body,
    webhook_body,
)
from tenants.models import NotifyKind, NotifyOn
from tests.support.sample_values import PANE

# Keys


def test_the_key_depends_on_stream_tenant_source_window_start_and_pane_only() -> None:
    key = idempotency_key("s", PANE)
    assert len(key) == 64 and int(key, 16) >= 0
    # A redelivery from other batch facts (count, batch) keeps the key.
    same_pane_later = PaneFacts(**{**PANE.__dict__, "count": 9, "batch_id": 8})
    assert idempotency_key("s", same_pane_later) == key
    for changed in (
        {"tenant": "globex"},
        {"source": "billing"},
        {"window_start_ms": PANE.window_start_ms + 1},
        {"pane_index": 2},
    ):
        assert idempotency_key("s", PaneFacts(**{**PANE.__dict__, **changed})) != key
    assert idempotency_key("other-stream", PANE) != key


def test_the_key_is_stable_across_releases() -> None:
    # Receivers deduplicate by key across a deploy: the derivation docs/notifications.md gives.
    documented = b'["tenant-windows","acme","web",1767225600000,1]'
    assert idempotency_key("tenant-windows", PANE) == hashlib.sha256(documented).hexdigest()


# Bodies


def test_the_webhook_body_is_canonical_json_of_the_pane_facts() -> None:
    body = webhook_body(PANE)
    assert body == webhook_body(PaneFacts(**PANE.__dict__))
    assert json.loads(body) == {
        "tenant": "acme",
        "source": "web",
        "window_start": "2026-01-01T00:00:00.000Z",
        "window_end": "2026-01-01T00:01:00.000Z",
        "pane_index": 1,
        "timing": "LATE",
        "is_final": True,
        "count": 7,
        "metrics": {"avg_amount": None, "errors": 2.0},
    }
    # Sorted keys, no spaces: byte-identical on every redelivery.
    assert body == json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
    assert b"batch" not in body and b"attempt" not in body


def test_the_slack_message_has_text_and_blocks_with_the_same_facts() -> None:
    message = json.loads(slack_body(PANE))
    assert set(message) == {"text", "blocks"}
    assert "acme/web" in message["text"] and "7 records" in message["text"]
    assert all(block["type"] == "section" for block in message["blocks"])
    fields = {
        field["text"].split("\n")[0].strip("*"): field["text"].split("\n")[1]
        for field in message["blocks"][1]["fields"]
    }
    assert fields == {
        "tenant": "acme",
        "source": "web",
        "window_start": "2026-01-01T00:00:00.000Z",
        "window_end": "2026-01-01T00:01:00.000Z",
        "pane_index": "1",
        "timing": "LATE",
        "is_final": "true",
        "count": "7",
    }
    assert message["blocks"][2]["text"]["text"] == "`avg_amount`: None\n`errors`: 2.0"
    assert body_for(NotifyKind.SLACK, PANE) == slack_body(PANE)
    assert body_for(NotifyKind.WEBHOOK, PANE) == webhook_body(PANE)


def test_final_endpoints_get_only_final_panes() -> None:
    not_final = PaneFacts(**{**PANE.__dict__, "is_final": False})
    assert qualifies(NotifyOn.FINAL, PANE) and not qualifies(NotifyOn.FINAL, not_final)
    assert qualifies(NotifyOn.EVERY_PANE, not_final)


# Redaction


@pytest.mark.parametrize(
    ("kind", "url", "shown"),
    [
        (
            NotifyKind.WEBHOOK,
            "https://user:pw@h.example:8443/a/b?token=s3&x=",
            "https://h.example:8443/a/b?token=***&x=***",
        ),
        (NotifyKind.WEBHOOK, "http://127.0.0.1:8080/hook#frag", "http://127.0.0.1:8080/hook"),
        (
            NotifyKind.SLACK,
            "https://hooks.slack.com/services/T0/B0/XyZ",
            "https://hooks.slack.com/services/***",
        ),
        (
            NotifyKind.WEBHOOK,
            "https://hooks.slack.com/services/T0/B0/XyZ",
            "https://hooks.slack.com/services/***",
        ),
        (NotifyKind.SLACK, "https://proxy.example/", "https://proxy.example/***"),
    ],
)
def test_a_redacted_endpoint_holds_no_secret(kind: NotifyKind, url: str, shown: str) -> None:
    assert redact_endpoint(kind, url) == shown
