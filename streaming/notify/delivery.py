"""Deliver one pane to one endpoint: bounded attempts with full-jitter backoff, then dead-letter.

Each endpoint is bound to one lane (a thread with its own queue) of a bounded pool, so a slow or
failing endpoint holds up only its own lane, never other tenants' endpoints or the micro-batches.
Every attempt is reported as an `AttemptRow` for the outbox; the key and body are the same on
every attempt, so an attempt repeated after a crash is deduplicated by the receiver.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from storage.deliveries import AttemptRow, Outcome
from streaming.hooks import FaultHook, FaultPoint
from streaming.notify.endpoints import Endpoint, SendResult
from streaming.notify.payloads import Pane, iso_utc
from tenants.settings import NotifySettings

log = logging.getLogger(__name__)

Send = Callable[[Endpoint, str, bytes], SendResult]
_QUEUE_POLL_S = 0.2


@dataclass(frozen=True)
class Delivery:
    stream: str
    idempotency_key: str
    pane: Pane
    endpoint: Endpoint
    body: bytes
    first_attempt: int = 1
    """Attempts already made (before a restart, or before `notify retry`) are not counted again."""


def backoff_ceiling_ms(failed_attempts: int, settings: NotifySettings) -> int:
    """The longest wait after `failed_attempts` failures: doubling from the first, capped."""
    doubled = settings.first_backoff_ms << min(failed_attempts - 1, 62)
    return min(settings.max_backoff_ms, doubled)


def backoff_ms(failed_attempts: int, settings: NotifySettings, rng: random.Random) -> int:
    # Full jitter: endpoints recovering from one outage are not hit by every sender at once.
    return rng.randint(0, backoff_ceiling_ms(failed_attempts, settings))


def deliver(
    delivery: Delivery,
    send: Send,
    settings: NotifySettings,
    fault_hook: FaultHook,
    stopping: threading.Event,
    report: Callable[[AttemptRow], None],
    rng: random.Random,
) -> None:
    """Attempt `delivery` until it succeeds, fails for good, or `settings.max_attempts` attempts
    of this run have failed; report every attempt. Returns early (unfinished) when `stopping`."""
    last_attempt = delivery.first_attempt + settings.max_attempts - 1
    pane = delivery.pane
    for attempt in range(delivery.first_attempt, last_attempt + 1):
        fault_hook.reached(FaultPoint.BEFORE_DELIVERY, pane.batch_id)
        attempted_at_ms = _now_ms()
        result = send(delivery.endpoint, delivery.idempotency_key, delivery.body)
        fault_hook.reached(FaultPoint.AFTER_DELIVERY_BEFORE_RECORD, pane.batch_id)
        if result.succeeded:
            outcome = Outcome.SUCCEEDED
        elif result.retryable and attempt < last_attempt:
            outcome = Outcome.RETRYING
        else:
            outcome = Outcome.DEAD_LETTER
        report(_attempt_row(delivery, attempt, result, outcome, attempted_at_ms))
        if outcome is not Outcome.RETRYING:
            if outcome is Outcome.DEAD_LETTER:
                log.warning(
                    "dead-lettered: %s/%s window %s pane %d to %s after %d attempts: %s",
                    pane.tenant,
                    pane.source,
                    iso_utc(pane.window_start_ms),
                    pane.pane_index,
                    delivery.endpoint.redacted,
                    attempt,
                    result.error,
                )
            return
        if stopping.wait(backoff_ms(attempt - delivery.first_attempt + 1, settings, rng) / 1000):
            return


def _attempt_row(
    delivery: Delivery, attempt: int, result: SendResult, outcome: Outcome, attempted_at_ms: int
) -> AttemptRow:
    pane, endpoint = delivery.pane, delivery.endpoint
    return AttemptRow(
        stream=delivery.stream,
        idempotency_key=delivery.idempotency_key,
        tenant=pane.tenant,
        source=pane.source,
        window_start_ms=pane.window_start_ms,
        pane_index=pane.pane_index,
        windows_batch_id=pane.batch_id,
        endpoint_id=endpoint.endpoint_id,
        endpoint=endpoint.redacted,
        kind=endpoint.kind.value,
        attempt=attempt,
        status_code=result.status_code,
        error=result.error,
        outcome=outcome,
        attempted_at_ms=attempted_at_ms,
        succeeded_at_ms=_now_ms() if outcome is Outcome.SUCCEEDED else None,
        body=delivery.body.decode(),
    )


class EndpointLanes:
    """`lanes` threads, each with its own queue; an endpoint is bound to one lane for good.

    Endpoints take free lanes in the order they first appear, so up to `lanes` endpoints never
    share one; beyond that they are spread round-robin.
    """

    def __init__(
        self, lanes: int, run: Callable[[Delivery], None], stopping: threading.Event
    ) -> None:
        self._run = run
        self._stopping = stopping
        self._queues: list[queue.Queue[Delivery]] = [queue.Queue() for _ in range(lanes)]
        self._lane_of: dict[str, int] = {}
        self._threads = [
            threading.Thread(target=self._work, args=(lane,), name=f"notify-lane-{n}", daemon=True)
            for n, lane in enumerate(self._queues)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, delivery: Delivery) -> None:
        endpoint = delivery.endpoint.endpoint_id
        lane = self._lane_of.setdefault(endpoint, len(self._lane_of) % len(self._queues))
        self._queues[lane].put(delivery)

    def join(self) -> None:
        """Wait for the lanes to end; the caller sets `stopping` first."""
        for thread in self._threads:
            thread.join()

    def _work(self, lane: queue.Queue[Delivery]) -> None:
        while not self._stopping.is_set():
            try:
                delivery = lane.get(timeout=_QUEUE_POLL_S)
            except queue.Empty:
                continue
            try:
                self._run(delivery)
            except Exception:
                # A bug must not end the lane: the delivery stays unfinished and is planned
                # again after a restart.
                log.exception("delivery to %s failed", delivery.endpoint.redacted)


def _now_ms() -> int:
    # Stamps attempts in the outbox only; nothing sent depends on it.
    return time.time_ns() // 1_000_000
