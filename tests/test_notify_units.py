"""Notifications without Spark: keys, bodies, Slack messages, redaction, backoff, config, secrets."""

from __future__ import annotations

import hashlib
import json
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import SecretStr

from storage.lake.delivery_outbox import AttemptRow, Outcome
from streaming.hooks import NO_FAULTS
from streaming.notify.delivery import Delivery, EndpointScheduler, backoff_ceiling_ms, backoff_ms
from streaming.notify.endpoints import post, resolve_endpoint
from streaming.notify.payloads import (
    Pane,
    body_for,
    idempotency_key,
    qualifies,
    redact_endpoint,
    slack_body,
    webhook_body,
)
from tenants.models import NotifyKind, NotifyOn, NotifyTarget, SourceConfig
from tenants.registry import ConfigError, load_registry
from tenants.settings import NotifySettings
from tests.notify_receiver import Receiver, serve

PANE = Pane(
    tenant="acme",
    source="web",
    window_start_ms=1_767_225_600_000,
    window_end_ms=1_767_225_660_000,
    pane_index=1,
    timing="LATE",
    is_final=True,
    count=7,
    metrics=(("avg_amount", float("nan")), ("errors", 2.0)),
    batch_id=3,
)


# Keys


def test_the_key_depends_on_stream_tenant_source_window_start_and_pane_only() -> None:
    key = idempotency_key("s", PANE)
    assert len(key) == 64 and int(key, 16) >= 0
    # A redelivery from other batch facts (count, batch) keeps the key.
    same_pane_later = Pane(**{**PANE.__dict__, "count": 9, "batch_id": 8})
    assert idempotency_key("s", same_pane_later) == key
    for changed in (
        {"tenant": "globex"},
        {"source": "billing"},
        {"window_start_ms": PANE.window_start_ms + 1},
        {"pane_index": 2},
    ):
        assert idempotency_key("s", Pane(**{**PANE.__dict__, **changed})) != key
    assert idempotency_key("other-stream", PANE) != key


def test_the_key_is_stable_across_releases() -> None:
    # Receivers deduplicate by key across a deploy: the derivation docs/notifications.md gives.
    documented = b'["tenant-windows","acme","web",1767225600000,1]'
    assert idempotency_key("tenant-windows", PANE) == hashlib.sha256(documented).hexdigest()


# Bodies


def test_the_webhook_body_is_canonical_json_of_the_pane_facts() -> None:
    body = webhook_body(PANE)
    assert body == webhook_body(Pane(**PANE.__dict__))
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
    not_final = Pane(**{**PANE.__dict__, "is_final": False})
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


# Backoff


def test_backoff_ceilings_double_from_the_first_up_to_the_cap() -> None:
    settings = NotifySettings(first_backoff="100ms", max_backoff="1s")
    assert [backoff_ceiling_ms(n, settings) for n in range(1, 7)] == [
        100,
        200,
        400,
        800,
        1000,
        1000,
    ]
    assert backoff_ceiling_ms(10_000, settings) == 1000


def test_backoff_waits_are_jittered_within_their_ceiling() -> None:
    settings = NotifySettings(first_backoff="100ms", max_backoff="1s")
    rng = random.Random(1)
    for failures in range(1, 8):
        waits = [backoff_ms(failures, settings, rng) for _ in range(200)]
        ceiling = backoff_ceiling_ms(failures, settings)
        assert min(waits) >= 0 and max(waits) <= ceiling
        assert len(set(waits)) > 20  # spread out, not one fixed delay


# Config


def _write_conf(tmp_path: Path, notify_yaml: str) -> Path:
    (tmp_path / "tenants").mkdir()
    (tmp_path / "sources.yaml").write_text(
        "sources:\n  web:\n    event_time: {field: ts, format: iso8601}\n"
        "    window: {kind: tumbling, size: 1m}\n    out_of_orderness: 1s\n"
    )
    (tmp_path / "tenants" / "acme.yaml").write_text(
        f"id: acme\nsources:\n  web:\n    notify:\n{notify_yaml}"
    )
    return tmp_path


@pytest.mark.parametrize(
    ("notify_yaml", "problem"),
    [
        ("      - {kind: webhook, url: 'ftp://127.0.0.1/x'}\n", "only http and https"),
        ("      - {kind: webhook, url: 'file:///etc/passwd'}\n", "only http and https"),
        ("      - {kind: webhook, url: 'http:///no-host'}\n", "no host"),
        ("      - {kind: email, url: 'http://127.0.0.1/x'}\n", "webhook"),
        ("      - {kind: webhook, url: 'http://127.0.0.1/x', on: sometimes}\n", "final"),
        ("      - {kind: webhook, url: 'http://127.0.0.1/x', timeout: soon}\n", "duration"),
        ("      - {kind: webhook, url: 'secret:'}\n", "file path"),
        ("      - {kind: webhook, url: 'http://127.0.0.1:99999/no-host'}\n", "host and port"),
        ("      - {kind: webhook, url: 'http://127.0.0.1/a no-host'}\n", "spaces"),
    ],
)
def test_a_bad_endpoint_is_refused_naming_the_file_and_field(
    tmp_path: Path, notify_yaml: str, problem: str
) -> None:
    conf = _write_conf(tmp_path, notify_yaml)
    with pytest.raises(ConfigError) as refused:
        load_registry(conf)
    message = str(refused.value)
    assert str(conf / "tenants" / "acme.yaml") in message
    assert "sources.web.notify.0" in message
    assert problem in message
    assert "passwd" not in message and "no-host" not in message  # the URL itself is not quoted


def test_a_tenant_override_replaces_the_source_endpoints(tmp_path: Path) -> None:
    conf = _write_conf(tmp_path, "      - {kind: slack, url: '${ACME_SLACK}', on: every_pane}\n")
    registry = load_registry(conf)
    source = registry.sources["web"]
    targets = source.notify_targets(registry.tenants["acme"].sources["web"])
    assert [(t.kind, t.on, t.timeout_ms) for t in targets] == [
        (NotifyKind.SLACK, NotifyOn.EVERY_PANE, 5_000)
    ]
    assert source.notify_targets(None) == ()
    # Window rules never carry endpoints: the windows' state must hold no secret.
    assert "notify" not in registry.resolve("acme", "web").rules.model_dump()  # type: ignore[union-attr]


def test_a_url_is_never_shown_but_survives_the_config_snapshot() -> None:
    url = "https://hooks.slack.com/services/T0/B0/XyZ"
    target = NotifyTarget(kind=NotifyKind.SLACK, url=SecretStr(url))
    assert "XyZ" not in repr(target) and "XyZ" not in str(target)
    source = SourceConfig.model_validate(
        {
            "event_time": {"field": "ts", "format": "iso8601"},
            "window": {"kind": "tumbling", "size": "1m"},
            "out_of_orderness": "1s",
            "notify": [{"kind": "slack", "url": url}],
        }
    )
    assert SourceConfig.model_validate_json(source.model_dump_json()) == source


# Secrets and requests


def test_env_and_file_references_resolve_at_delivery_and_errors_name_only_the_reference(
    tmp_path: Path,
) -> None:
    (tmp_path / "hook.url").write_text("https://hooks.slack.com/services/T0/B0/XyZ\n")
    from_file = resolve_endpoint(
        NotifyTarget(kind=NotifyKind.SLACK, url=SecretStr("secret:hook.url")), tmp_path, {}
    )
    assert from_file.url is not None
    assert from_file.url.get_secret_value().endswith("/XyZ")
    assert from_file.redacted == "https://hooks.slack.com/services/***"
    assert "XyZ" not in repr(from_file)

    from_env = resolve_endpoint(
        NotifyTarget(kind=NotifyKind.WEBHOOK, url=SecretStr("${HOOK}")),
        tmp_path,
        {"HOOK": "http://u:pw@127.0.0.1:1/x?k=v"},
    )
    assert from_env.redacted == "http://127.0.0.1:1/x?k=***"

    unset = resolve_endpoint(
        NotifyTarget(kind=NotifyKind.WEBHOOK, url=SecretStr("${MISSING}")), tmp_path, {}
    )
    assert unset.url is None and unset.problem == "environment variable MISSING is not set"
    (tmp_path / "bad.url").write_text("gopher://127.0.0.1/secret-token")
    bad = resolve_endpoint(
        NotifyTarget(kind=NotifyKind.WEBHOOK, url=SecretStr("secret:bad.url")), tmp_path, {}
    )
    assert bad.url is None and bad.problem is not None
    assert "only http and https" in bad.problem and "secret-token" not in bad.problem
    outcome = post(bad, "k", b"{}")
    assert (outcome.succeeded, outcome.retryable, outcome.error) == (False, False, bad.problem)


def test_a_post_carries_the_key_and_body_and_reports_the_answer(tmp_path: Path) -> None:
    receiver = Receiver(flaky_failures=1)
    server = serve(receiver)
    port = server.server_address[1]
    try:

        def endpoint(path: str) -> object:
            target = NotifyTarget(
                kind=NotifyKind.WEBHOOK, url=SecretStr(f"http://127.0.0.1:{port}{path}")
            )
            return resolve_endpoint(target, tmp_path, {})

        flaky = endpoint("/flaky/x")
        first, second = post(flaky, "key-1", b'{"a":1}'), post(flaky, "key-1", b'{"a":1}')  # type: ignore[arg-type]
        assert (first.status_code, first.retryable, first.error) == (503, True, "HTTP 503")
        assert second.succeeded
        assert [(r.key, r.body) for r in receiver.requests] == [("key-1", b'{"a":1}')] * 2
    finally:
        server.shutdown()
        server.server_close()
    unreachable = post(endpoint("/ok/x"), "key-2", b"{}")  # type: ignore[arg-type]
    assert unreachable.status_code is None and unreachable.retryable
    assert unreachable.error is not None and str(port) not in unreachable.error


def test_a_request_cut_short_by_a_dying_sender_is_not_a_delivery(tmp_path: Path) -> None:
    # http.client sends the headers and the body in two writes: a SIGKILL between them leaves
    # the receiver a key with no body. The redelivery after restart is the delivery.
    receiver = Receiver()
    server = serve(receiver)
    port = server.server_address[1]
    body = b'{"pane_index":0}'
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as dying:
            dying.sendall(
                b"POST /ok/x HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: key-1\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body[:5]
            )
        target = NotifyTarget(
            kind=NotifyKind.WEBHOOK, url=SecretStr(f"http://127.0.0.1:{port}/ok/x")
        )
        assert post(resolve_endpoint(target, tmp_path, {}), "key-1", body).succeeded
        deadline = time.monotonic() + 5
        while not receiver.incomplete and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        server.shutdown()
        server.server_close()
    assert [(r.key, r.body) for r in receiver.requests] == [("key-1", body)]
    assert [(r.key, r.body) for r in receiver.incomplete] == [("key-1", body[:5])]


def test_a_hanging_endpoint_holds_up_no_other_endpoint(tmp_path: Path) -> None:
    receiver = Receiver()
    server = serve(receiver)
    port = server.server_address[1]
    rows: list[AttemptRow] = []
    stopping = threading.Event()
    # Two workers, six endpoints: one hangs until released, five answer at once.
    scheduler = EndpointScheduler(
        NotifySettings(endpoint_workers=2), post, NO_FAULTS, rows.append, stopping
    )
    try:
        paths = ["/hang/0", *(f"/ok/{n}" for n in range(1, 6))]
        for path in paths:
            target = NotifyTarget(
                kind=NotifyKind.WEBHOOK,
                url=SecretStr(f"http://127.0.0.1:{port}{path}"),
                timeout="2m",
            )
            endpoint = resolve_endpoint(target, tmp_path, {})
            for pane_index in range(3):
                pane = Pane(**{**PANE.__dict__, "pane_index": pane_index})
                key = idempotency_key("s", pane)
                scheduler.submit(Delivery("s", key, pane, endpoint, webhook_body(pane)))
        fast_done = _wait_for(lambda: sum(r.status_code == 200 for r in list(rows)) == 15)
        hanging_meanwhile = receiver.received("/hang/") == []
        receiver.release.set()
        scheduler.wait_idle()
    finally:
        receiver.release.set()
        stopping.set()
        scheduler.join()
        server.shutdown()
        server.server_close()
    assert fast_done and hanging_meanwhile
    assert sorted((r.path, r.status) for r in receiver.requests) == sorted(
        [(path, 200) for path in paths for _ in range(3)]
    )
    assert {r.outcome for r in rows} == {Outcome.SUCCEEDED}


def _wait_for(condition: Callable[[], bool], limit_s: float = 60) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("notify_yaml", "notifies"),
    [
        ("      - {kind: webhook, url: 'http://127.0.0.1/x'}\n", True),
        ("      []\n", False),
    ],
)
def test_the_registry_knows_whether_any_key_has_an_endpoint(
    tmp_path: Path, notify_yaml: str, notifies: bool
) -> None:
    assert load_registry(_write_conf(tmp_path, notify_yaml)).notifies_anyone() is notifies


def test_the_project_conf_notifies_nobody() -> None:
    assert not load_registry(Path(__file__).parents[1] / "conf").notifies_anyone()
