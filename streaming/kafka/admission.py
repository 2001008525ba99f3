"""Admission: which of a Kafka partition's records a micro-batch windows now, and which wait.

Pure: no Spark, Kafka or files. A partition's reader task calls `admit` once per micro-batch
with the partition's `Ledger` (what earlier batches deferred, and each tenant's quota tokens),
the tenant of each new record, and the batch's share of `window_budget`. It gets back which new
records to window, which deferred ones to release first, and the ledger to hand to the next
batch. The same inputs always give the same answer, so a replayed batch decides as the first
attempt did.

The rules, per tenant and partition:
- a tenant's records leave in offset order: deferred ones first, and a new record is windowed
  only once every earlier one of its tenant has been;
- a quota is a token bucket: `records_per_second` tokens a second of processing time (the
  batches' own timestamps), at most `burst`; a windowed record costs a token;
- when the tenants' windowable records exceed the budget, the budget is shared max-min fairly
  (water-filling): a tenant wanting less than an equal share gets all it wants, the others
  split the rest equally. Over batches this is deficit round robin with a quantum of one batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tenants.models import Quota

UNPARSED_TENANT = ""
"""The queue of records without a readable `tenant`: they are quarantined when windowed, and
wait their turn like any tenant's, so a flood of garbage cannot crowd out other tenants."""


@dataclass(frozen=True)
class Segment:
    """One tenant's records deferred by one batch: `count` rows of `file`, `released` of which
    (the first ones) have been windowed since."""

    file: str
    count: int
    released: int
    deferred_at_ms: int

    @property
    def waiting(self) -> int:
        return self.count - self.released


@dataclass(frozen=True)
class TenantQueue:
    """One tenant's place in one partition: its deferred records and its quota tokens."""

    segments: tuple[Segment, ...] = ()
    tokens: float | None = None
    """Tokens left after the batch; None when the tenant had no quota."""
    refilled_at_ms: int = 0

    @property
    def backlog(self) -> int:
        return sum(segment.waiting for segment in self.segments)

    @property
    def oldest_deferred_at_ms(self) -> int | None:
        return self.segments[0].deferred_at_ms if self.segments else None


@dataclass(frozen=True)
class BatchCounts:
    """What one batch did in one partition."""

    read: int = 0
    windowed: int = 0
    """New records windowed at once."""
    released: int = 0
    """Deferred records windowed, from earlier batches."""
    deferred: int = 0
    """New records deferred."""

    def __add__(self, other: BatchCounts) -> BatchCounts:
        return BatchCounts(
            self.read + other.read,
            self.windowed + other.windowed,
            self.released + other.released,
            self.deferred + other.deferred,
        )


@dataclass(frozen=True)
class Ledger:
    """A partition's deferral state after a batch: every tenant with records waiting or a
    quota bucket that is not full. A tenant not in it has nothing waiting and full tokens."""

    tenants: Mapping[str, TenantQueue] = field(default_factory=dict)
    counts: BatchCounts = BatchCounts()
    """The batch that wrote the ledger, for the progress line."""

    @property
    def backlog(self) -> int:
        return sum(queue.backlog for queue in self.tenants.values())

    def is_empty(self) -> bool:
        """Nothing waits, no quota bucket needs refilling, and the batch deferred and released
        nothing: a missing ledger says all of that."""
        return not self.tenants and not self.counts.deferred and not self.counts.released

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": vars(self.counts),
            "tenants": {
                tenant: {
                    "segments": [vars(segment) for segment in queue.segments],
                    "tokens": queue.tokens,
                    "refilled_at_ms": queue.refilled_at_ms,
                }
                for tenant, queue in sorted(self.tenants.items())
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ledger:
        return cls(
            tenants={
                tenant: TenantQueue(
                    segments=tuple(Segment(**segment) for segment in queue["segments"]),
                    tokens=queue["tokens"],
                    refilled_at_ms=queue["refilled_at_ms"],
                )
                for tenant, queue in data["tenants"].items()
            },
            counts=BatchCounts(**data["counts"]),
        )


@dataclass(frozen=True)
class Release:
    """Rows [start, stop) of `tenant`'s rows in deferral `file` (in their order there)."""

    tenant: str
    file: str
    start: int
    stop: int


@dataclass(frozen=True)
class Admission:
    """One partition's decision for one batch."""

    window_now: np.ndarray
    """One bool per new record: windowed in this batch; the others are deferred."""
    releases: tuple[Release, ...]
    """Deferred records windowed in this batch, before the new ones."""
    ledger: Ledger


def admit(
    ledger: Ledger,
    tenants: Sequence[str],
    quota_of: Callable[[str], Quota | None],
    budget: int | None,
    now_ms: int,
    file: str,
) -> Admission:
    """Decide one batch of one partition. `tenants` holds each new record's tenant in offset
    order; records deferred now go to `file`, in offset order."""
    codes, names = _factorise(tenants)
    arriving = np.bincount(codes, minlength=len(names)).tolist()
    queues = {name: ledger.tenants.get(name, TenantQueue()) for name in names}
    for name, queue in ledger.tenants.items():
        queues.setdefault(name, queue)
    arriving_by_name = dict(zip(names, arriving, strict=True))

    order = sorted(queues)
    quotas = {name: quota_of(name) for name in order}
    tokens: dict[str, float | None] = {}
    wanted: dict[str, int] = {}
    for name in order:
        queue, quota = queues[name], quotas[name]
        tokens[name] = None if quota is None else _refilled(queue, quota, now_ms)
        demand = queue.backlog + arriving_by_name.get(name, 0)
        allowed = tokens[name]
        wanted[name] = demand if allowed is None else min(demand, int(allowed))
    granted = fair_shares(wanted, budget)

    releases: list[Release] = []
    window_new: dict[str, int] = {}
    next_queues: dict[str, TenantQueue] = {}
    counts = BatchCounts(read=len(tenants))
    for name in order:
        queue, grant = queues[name], granted[name]
        segments, released = _release(queue.segments, grant, name, releases)
        window_new[name] = grant - released
        deferred = arriving_by_name.get(name, 0) - window_new[name]
        if deferred:
            segments += (Segment(file=file, count=deferred, released=0, deferred_at_ms=now_ms),)
        left = tokens[name]
        if left is not None:
            left -= grant
        counts += BatchCounts(windowed=window_new[name], released=released, deferred=deferred)
        quota = quotas[name]
        if segments or (quota is not None and left is not None and left < quota.burst):
            next_queues[name] = TenantQueue(segments=segments, tokens=left, refilled_at_ms=now_ms)
    window_now = _first_of_each(codes, np.array([window_new[name] for name in names], np.int64))
    return Admission(window_now, tuple(releases), Ledger(next_queues, counts))


def fair_shares(wanted: Mapping[str, int], budget: int | None) -> dict[str, int]:
    """Max-min fair shares of `budget` (water-filling); everything wanted when it fits.

    Deterministic: the records left over after equal integer shares go one each to the
    tenants still wanting more, by tenant id.
    """
    if budget is None or sum(wanted.values()) <= budget:
        return dict(wanted)
    granted = dict.fromkeys(wanted, 0)
    hungry = sorted((count, name) for name, count in wanted.items() if count > 0)
    left = budget
    while hungry and left >= len(hungry):
        share = left // len(hungry)
        smallest = hungry[0][0] - granted[hungry[0][1]]
        step = min(share, smallest)
        for _, name in hungry:
            granted[name] += step
        left -= step * len(hungry)
        hungry = [(count, name) for count, name in hungry if granted[name] < count]
    for _, name in sorted(hungry, key=lambda item: item[1])[:left]:
        granted[name] += 1
    return granted


def _refilled(queue: TenantQueue, quota: Quota, now_ms: int) -> float:
    if queue.tokens is None:
        return float(quota.burst)
    elapsed_s = max(0, now_ms - queue.refilled_at_ms) / 1000
    return min(float(quota.burst), queue.tokens + quota.records_per_second * elapsed_s)


def _release(
    segments: tuple[Segment, ...], grant: int, tenant: str, releases: list[Release]
) -> tuple[tuple[Segment, ...], int]:
    """Release up to `grant` of the oldest deferred records; the segments left and how many."""
    released = 0
    kept: list[Segment] = []
    for segment in segments:
        take = min(segment.waiting, grant - released)
        if take:
            releases.append(
                Release(tenant, segment.file, segment.released, segment.released + take)
            )
            released += take
        if take < segment.waiting:
            kept.append(replace(segment, released=segment.released + take))
    return tuple(kept), released


def _factorise(tenants: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Each record's tenant as a code, and the names of the codes."""
    if not tenants:
        return np.zeros(0, np.int64), []
    names, codes = np.unique(np.asarray(tenants, dtype=object), return_inverse=True)
    return codes.astype(np.int64), [str(name) for name in names]


def _first_of_each(codes: np.ndarray, firsts: np.ndarray) -> np.ndarray:
    """True for the first `firsts[code]` records of each code, in record order."""
    if not len(codes):
        return np.zeros(0, bool)
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.searchsorted(sorted_codes, sorted_codes, side="left")
    rank = np.empty(len(codes), np.int64)
    rank[order] = np.arange(len(codes)) - starts
    window_now: np.ndarray = rank < firsts[codes]
    return window_now
