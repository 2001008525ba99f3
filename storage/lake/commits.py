"""Conditional Delta commits: check a snapshot, then commit only if nothing landed after it.

The writer lease's table and the commits made by delta-rs (where the log's readers decline,
and reprocessing's swaps) share these two primitives; the stream's batches, compactions and
fences are checked on the log instead (`log_commits`). A commit made with
`conditional()` has no commit retry, so any commit that landed after the snapshot it was
checked against (another instance's fence, a racing claim) makes it fail; `commit_without_
conflict` then runs the whole attempt again, checks included.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError

log = logging.getLogger(__name__)
_T = TypeVar("_T")

COMMIT_ATTEMPTS = 20
FIRST_BACKOFF_S = 0.02
MAX_BACKOFF_S = 1.0


class FencedError(RuntimeError):
    """A newer instance claimed this stream: this one must not write anything more."""


def fence_app_id(stream: str) -> str:
    return f"{stream}/writer_epoch"


def check_fence(table: DeltaTable, stream: str, epoch: int) -> None:
    """Raise unless `table`'s snapshot is fenced with exactly `epoch`."""
    fenced_with = table.transaction_version(fence_app_id(stream))
    check_fence_epoch(fenced_with, table.table_uri, stream, epoch)


def check_fence_epoch(fenced_with: int | None, table_uri: str, stream: str, epoch: int) -> None:
    """Raise unless a table (at `table_uri`) fenced with `fenced_with` is fenced with `epoch`."""
    if fenced_with != epoch:
        raise FencedError(
            f"stream {stream!r}: {table_uri} is fenced by writer epoch {fenced_with}, this "
            f"instance holds epoch {epoch}; a newer instance took the stream over, so this one "
            "stops without writing"
        )


def conditional(*transactions: Transaction) -> CommitProperties:
    """Commit properties without retry: the commit fails if anything landed after its snapshot."""
    return CommitProperties(app_transactions=list(transactions), max_commit_retries=0)


def commit_without_conflict(
    what: str, attempt: Callable[[], _T], exhausted: type[Exception] = RuntimeError
) -> _T:
    """Run `attempt` until its conditional commit lands with no other commit in between.

    `attempt` loads a fresh snapshot, checks it, and commits with `conditional()`; a commit that
    landed after that snapshot fails it with CommitFailedError, and it runs again, checks
    included. After COMMIT_ATTEMPTS such failures, `exhausted` is raised.

    Between attempts it waits a random time that doubles with each failure (full jitter):
    several streams committing to one lake would otherwise retry in lockstep and collide again.
    """
    for attempt_number in range(COMMIT_ATTEMPTS):
        try:
            return attempt()
        except CommitFailedError:
            log.info("%s: another commit landed first; checking again", what)
            ceiling_s = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2**attempt_number)
            time.sleep(random.uniform(0, ceiling_s))
    raise exhausted(f"{what}: the table kept changing during {COMMIT_ATTEMPTS} attempts; retry")
