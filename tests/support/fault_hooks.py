"""Fault hooks for the recovery tests, and a runner that starts the CLI with one installed.

`python -m tests.support.fault_hooks --crash-at POINT@POSITION -- run ...` runs `tenant-windows
run ...` with a hook that SIGKILLs the whole process group when POINT is reached at POSITION: a
Python worker that hits an executor point takes the driver and the JVM down with it, as a lost
machine would. `--pause-at` instead stops the driver with SIGSTOP until SIGCONT, as a long GC
pause or a frozen VM would: how a zombie writer is made. Without a position the first call fires.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from streaming.fault_points import FaultPoint

log = logging.getLogger(__name__)
# This module's name whether imported or run with `python -m` (then `__name__` is "__main__").
MODULE = __spec__.name if __spec__ is not None else __name__
PAUSE_SETTLE_S = 0.5
"""How long a paused thread waits for its own SIGSTOP to take hold."""


def cli_command(cli_args: Sequence[str], fault: Sequence[str] = ()) -> list[str]:
    """The command line of `tenant-windows CLI_ARGS...` in a new Python: through this module
    with the hook `fault` installed (e.g. `["--crash-at", "batch_start@1"]`), or without a
    fault, the CLI itself."""
    program = [MODULE, *fault, "--"] if fault else ["infra.cli"]
    return [sys.executable, "-m", *program, *cli_args]


@dataclass(frozen=True)
class _AtPoint:
    point: FaultPoint
    position: int | None

    def _hit(self, point: FaultPoint, first: int, last: int | None) -> bool:
        if point is not self.point:
            return False
        at = first if self.position is None else self.position
        return first <= at <= (first if last is None else last)

    @classmethod
    def parse(cls, text: str) -> tuple[FaultPoint, int | None]:
        name, _, position = text.partition("@")
        return FaultPoint(name), int(position) if position else None


@dataclass(frozen=True)
class KillAt(_AtPoint):
    """SIGKILL `process_group` (recorded in the driver, pickled to executors) at the point."""

    process_group: int

    def reached(self, point: FaultPoint, first: int, last: int | None = None) -> None:
        if self._hit(point, first, last):
            log.warning("fault injection: SIGKILL at %s", point.value)
            os.killpg(self.process_group, signal.SIGKILL)


@dataclass(frozen=True)
class PauseAt(_AtPoint):
    """SIGSTOP the process that reaches the point (a driver point: the driver)."""

    def reached(self, point: FaultPoint, first: int, last: int | None = None) -> None:
        if self._hit(point, first, last):
            log.warning("fault injection: SIGSTOP at %s", point.value)
            os.kill(os.getpid(), signal.SIGSTOP)
            # The stop reaches every thread a moment after `kill` returns (a CI run's driver
            # finished its batch's commits first): wait here for it, not past the point.
            time.sleep(PAUSE_SETTLE_S)


def main(argv: list[str]) -> int:
    from infra.cli.main import main as cli_main

    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--crash-at", metavar="POINT@POSITION")
    where.add_argument("--pause-at", metavar="POINT@POSITION")
    parser.add_argument("cli_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cli_args = args.cli_args[1:] if args.cli_args[:1] == ["--"] else args.cli_args
    if args.crash_at:
        hook: KillAt | PauseAt = KillAt(*_AtPoint.parse(args.crash_at), os.getpgid(0))
    else:
        hook = PauseAt(*_AtPoint.parse(args.pause_at))
    return cli_main(cli_args, fault_hook=hook)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
