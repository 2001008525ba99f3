"""Poll until something happens, for a bounded time: the one wait loop of the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

_Seen = TypeVar("_Seen")


def _neither_none_nor_false(seen: object) -> bool:
    return seen is not None and seen is not False


def wait_until(
    condition: Callable[[], _Seen],
    timeout_s: float,
    what: str = "the condition",
    *,
    done: Callable[[_Seen], bool] = _neither_none_nor_false,
    alive: Callable[[], object] | None = None,
    retry_on_assertion: bool = False,
    interval_s: float = 0.5,
) -> _Seen:
    """Call `condition()` every `interval_s` until `done` accepts what it returned (by default
    anything but None or False), for at most `timeout_s`; return that.

    `alive()` runs before each try and raises if what is waited on has failed (a stream's
    error, a process that exited), so the wait fails at once rather than at the timeout. With
    `retry_on_assertion`, an AssertionError from `condition` means "not yet", and its message
    is reported at the timeout. A timeout raises AssertionError naming `what` and the last
    problem or observation.
    """
    deadline = time.monotonic() + timeout_s
    last = "never checked"
    while True:
        if alive is not None:
            alive()
        try:
            seen = condition()
        except AssertionError as problem:
            if not retry_on_assertion:
                raise
            last = str(problem)
        else:
            if done(seen):
                return seen
            last = f"last seen: {seen!r}"
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; {last}")
        time.sleep(interval_s)
