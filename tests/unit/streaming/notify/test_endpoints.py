"""An endpoint's URL resolved at delivery (environment, secret file) and one POST to it, against
a real HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from pydantic import SecretStr

from streaming.notify.endpoints import post, resolve_endpoint
from tenants.models import NotifyKind, NotifyTarget
from tests.support.webhook_receiver import Receiver, serve


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
