"""Deliver panes to endpoints: bounded attempts with full-jitter backoff, then dead-letter.

`EndpointScheduler` keeps one queue per endpoint and a bounded pool of workers. A worker makes
one attempt at a time, for an endpoint no other worker is serving, and a failed attempt's
backoff is a time before which that endpoint is not picked, not a sleeping worker. So a slow
endpoint ties up at most one worker (for at most its timeout per attempt), a failing one none
while it backs off, and other tenants' endpoints, like the micro-batches, never wait for them.
Each endpoint's deliveries go in order. Every attempt is reported as an `AttemptRow` for the
outbox; the key and body are the same on every attempt, so an attempt repeated after a crash is
deduplicated by the receiver.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from storage.lake.delivery_outbox import AttemptRow, Outcome
from streaming.fault_points import FaultHook, FaultPoint
from streaming.notify.endpoints import Endpoint, SendResult
from streaming.notify.payloads import PaneFacts, iso_utc
from tenants.settings import NotifySettings

log = logging.getLogger(__name__)

Send = Callable[[Endpoint, str, bytes], SendResult]
_IDLE_POLL_S = 0.2


@dataclass(frozen=True)
class Delivery:
    stream: str
    idempotency_key: str
    pane: PaneFacts
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


def attempt(
    delivery: Delivery, number: int, last: int, send: Send, fault_hook: FaultHook
) -> AttemptRow:
    """Make attempt `number` of `delivery` (of at most `last`) and say how it ended."""
    pane = delivery.pane
    fault_hook.reached(FaultPoint.BEFORE_DELIVERY, pane.batch_id)
    attempted_at_ms = _now_ms()
    result = send(delivery.endpoint, delivery.idempotency_key, delivery.body)
    fault_hook.reached(FaultPoint.AFTER_DELIVERY_BEFORE_RECORD, pane.batch_id)
    if result.succeeded:
        outcome = Outcome.SUCCEEDED
    elif result.retryable and number < last:
        outcome = Outcome.RETRYING
    else:
        outcome = Outcome.DEAD_LETTER
        log.warning(
            "dead-lettered: %s/%s window %s pane %d to %s after %d attempts: %s",
            pane.tenant,
            pane.source,
            iso_utc(pane.window_start_ms),
            pane.pane_index,
            delivery.endpoint.redacted,
            number,
            result.error,
        )
    return _attempt_row(delivery, number, result, outcome, attempted_at_ms)


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


@dataclass
class _Job:
    delivery: Delivery
    next_attempt: int


@dataclass
class _EndpointQueue:
    jobs: deque[_Job] = field(default_factory=deque)
    busy: bool = False
    not_before_s: float = 0.0
    """Monotonic time before which the endpoint is backing off."""


class EndpointScheduler:
    """A bounded pool of workers over one queue per endpoint; see the module doc.

    Each delivery gets `settings.max_attempts` attempts from its `first_attempt` on; every
    attempt is passed to `report` (from a worker thread). Workers end when `stopping` is set,
    after their attempt in flight; what is left unfinished is not reported.
    """

    def __init__(
        self,
        settings: NotifySettings,
        send: Send,
        fault_hook: FaultHook,
        report: Callable[[AttemptRow], None],
        stopping: threading.Event,
        rng: random.Random | None = None,
    ) -> None:
        self._settings = settings
        self._send = send
        self._fault_hook = fault_hook
        self._report = report
        self._stopping = stopping
        self._rng = rng or random.Random()
        self._changed = threading.Condition()
        # In the order endpoints last started an attempt, so every endpoint gets its turn.
        self._endpoints: dict[str, _EndpointQueue] = {}
        self._workers = [
            threading.Thread(target=self._work, name=f"notify-worker-{n}", daemon=True)
            for n in range(settings.endpoint_workers)
        ]
        for worker in self._workers:
            worker.start()

    def submit(self, delivery: Delivery) -> None:
        with self._changed:
            endpoint = delivery.endpoint.endpoint_id
            queue = self._endpoints.setdefault(endpoint, _EndpointQueue())
            queue.jobs.append(_Job(delivery, delivery.first_attempt))
            self._changed.notify()

    def wait_idle(self) -> None:
        """Block until every submitted delivery has finished (each has bounded attempts), or
        `stopping` is set."""
        with self._changed:
            while self._endpoints and not self._stopping.is_set():
                self._changed.wait(timeout=_IDLE_POLL_S)

    def join(self) -> None:
        """Wait for the workers to end; the caller sets `stopping` first."""
        for worker in self._workers:
            worker.join()

    def _work(self) -> None:
        while not self._stopping.is_set():
            with self._changed:
                picked = self._pick(time.monotonic())
                if picked is None:
                    self._changed.wait(timeout=self._idle_wait_s(time.monotonic()))
                    continue
                endpoint, job = picked
            delivery = job.delivery
            last = delivery.first_attempt + self._settings.max_attempts - 1
            try:
                row: AttemptRow | None = attempt(
                    delivery, job.next_attempt, last, self._send, self._fault_hook
                )
            except Exception:
                # A bug must not end the worker; the delivery stays unfinished, so the
                # high-water mark waits for it and a restart plans it again.
                log.exception("delivery to %s failed", delivery.endpoint.redacted)
                row = None
            if row is not None:
                self._report(row)
            with self._changed:
                self._finish(endpoint, job, row)
                self._changed.notify_all()

    def _pick(self, now_s: float) -> tuple[str, _Job] | None:
        for endpoint, queue in self._endpoints.items():
            if not queue.busy and queue.not_before_s <= now_s:
                queue.busy = True
                # To the back of the turn order.
                self._endpoints[endpoint] = self._endpoints.pop(endpoint)
                return endpoint, queue.jobs[0]
        return None

    def _idle_wait_s(self, now_s: float) -> float:
        waiting = [q.not_before_s - now_s for q in self._endpoints.values() if not q.busy]
        return max(0.0, min([_IDLE_POLL_S, *waiting]))

    def _finish(self, endpoint: str, job: _Job, row: AttemptRow | None) -> None:
        queue = self._endpoints[endpoint]
        queue.busy = False
        if row is not None and row.outcome is Outcome.RETRYING:
            failures = job.next_attempt - job.delivery.first_attempt + 1
            job.next_attempt += 1
            wait_ms = backoff_ms(failures, self._settings, self._rng)
            queue.not_before_s = time.monotonic() + wait_ms / 1000
            return
        queue.jobs.popleft()
        if not queue.jobs:
            del self._endpoints[endpoint]


def _now_ms() -> int:
    # Stamps attempts in the outbox only; nothing sent depends on it.
    return time.time_ns() // 1_000_000
