"""`tenant-windows`: run the stream, validate tenants, query the output, produce load, demo.

This module only assembles the command groups' parsers and turns expected failures into one
line and an exit code (`exit_codes`); each group's module parses its flags and calls the product.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from infra.cli import (
    config_commands,
    lake_commands,
    notify_commands,
    sql_commands,
    stream_commands,
    tenant_commands,
)
from infra.cli.exit_codes import expected_failure
from streaming.hooks import NO_FAULTS, FaultHook

DESCRIPTION = (
    "`tenant-windows`: run the stream, validate tenants, query the output, produce load, demo."
)
COMMAND_GROUPS = (
    stream_commands,
    config_commands,
    tenant_commands,
    sql_commands,
    lake_commands,
    notify_commands,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tenant-windows", description=DESCRIPTION)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(commands)
    return parser


def main(argv: Sequence[str] | None = None, fault_hook: FaultHook = NO_FAULTS) -> int:
    """Parse `argv` and run its command; `fault_hook` is for the recovery tests."""
    args = build_parser().parse_args(argv)
    args.fault_hook = fault_hook
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for chatty in ("py4j", "kafka"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        result: int = args.handler(args)
        return result
    except Exception as error:
        failure = expected_failure(error)
        if failure is None:
            raise
        print(failure.message(error), file=sys.stderr)
        return int(failure.exit_code)


if __name__ == "__main__":
    sys.exit(main())
