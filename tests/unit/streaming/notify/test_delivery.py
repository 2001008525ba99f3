"""Delivering notifications: jittered, capped backoff between attempts, and endpoints that do not
hold each other up."""

from __future__ import annotations

import random
import threading
from pathlib import Path

from pydantic import SecretStr

from storage.lake.delivery_outbox import AttemptRow, Outcome
from streaming.fault_points import NO_FAULTS
from streaming.notify.delivery import Delivery, EndpointScheduler, backoff_ceiling_ms, backoff_ms
from streaming.notify.endpoints import post, resolve_endpoint
from streaming.notify.payloads import PaneFacts, idempotency_key, webhook_body
from tenants.models import NotifyKind, NotifyTarget
from tenants.settings import NotifySettings
from tests.support.sample_values import PANE
from tests.support.waiting import wait_until
from tests.support.webhook_receiver import Receiver, serve


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
                pane = PaneFacts(**{**PANE.__dict__, "pane_index": pane_index})
                key = idempotency_key("s", pane)
                scheduler.submit(Delivery("s", key, pane, endpoint, webhook_body(pane)))
        fast_done = wait_until(
            lambda: sum(r.status_code == 200 for r in list(rows)) == 15,
            60,
            "the five answering endpoints' deliveries",
            interval_s=0.05,
        )
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
