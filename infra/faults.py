"""Deterministic fault injection for recovery tests; inert unless its variables are set.

`TENANT_WINDOWS_CRASH_AT=<point>@<position>` kills the whole stream process group with SIGKILL when
the named point is reached at that position: a batch id for driver points, a Kafka offset for
executor points (executors do not know the batch id). The group is the one `arm()` recorded in
the driver, so a Python worker that hits the point takes the driver and the JVM down with it,
as a lost machine would.

`TENANT_WINDOWS_PAUSE_AT=<point>@<position>` instead stops the driver process with SIGSTOP, as a
long GC pause or a frozen VM would, until it gets SIGCONT: how a zombie writer is made.
"""

from __future__ import annotations

import logging
import os
import signal
from enum import StrEnum

CRASH_AT_ENV = "TENANT_WINDOWS_CRASH_AT"
PAUSE_AT_ENV = "TENANT_WINDOWS_PAUSE_AT"
PROCESS_GROUP_ENV = "TENANT_WINDOWS_CRASH_GROUP"

log = logging.getLogger(__name__)


class CrashPoint(StrEnum):
    KAFKA_READ = "kafka_read"
    """Executor, while reading a Kafka partition range; position: an offset in the range."""
    STATE_FUNCTION = "state_function"
    """Executor, inside the per-key state function; position: an offset of the key's records."""
    BATCH_START = "batch_start"
    """Driver, in foreachBatch before anything is written; Spark's offset log holds the batch."""
    BETWEEN_TABLE_COMMITS = "between_table_commits"
    """Driver, after the first table's Delta commit and before the next one."""
    BEFORE_DELTA_COMMIT = "before_delta_commit"
    """Driver, after a table's fence and batch checks, before its Delta commit."""
    AFTER_DELTA_COMMITS = "after_delta_commits"
    """Driver, after every Delta commit, before Spark writes its commit log entry."""


def arm() -> None:
    """Record this process's group for workers to kill; a no-op unless a crash is requested."""
    if os.environ.get(CRASH_AT_ENV):
        os.environ[PROCESS_GROUP_ENV] = str(os.getpgid(0))


def crash_if_requested(point: CrashPoint, first: int, last: int | None = None) -> None:
    """Crash (or pause) if the requested point is `point` and its position is in [first, last]."""
    if _requested(CRASH_AT_ENV, point, first, last):
        log.warning("fault injection: SIGKILL at %s", point.value)
        group = int(os.environ.get(PROCESS_GROUP_ENV, os.getpgid(0)))
        os.killpg(group, signal.SIGKILL)
    if _requested(PAUSE_AT_ENV, point, first, last):
        log.warning("fault injection: SIGSTOP at %s", point.value)
        os.kill(os.getpid(), signal.SIGSTOP)


def _requested(variable: str, point: CrashPoint, first: int, last: int | None) -> bool:
    requested = os.environ.get(variable)
    if not requested:
        return False
    name, _, position = requested.partition("@")
    if name != point.value:
        return False
    at = int(position) if position else first
    return first <= at <= (first if last is None else last)
