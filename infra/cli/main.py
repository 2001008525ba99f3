"""`tenant-windows`: run the stream, validate tenants, query the output, produce load, demo.

This module only assembles the command groups' parsers and turns expected failures into one
line and an exit code (`exit_codes`); each group's module parses its flags and calls the product.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Sequence

from infra.cli import (
    config_commands,
    dev_commands,
    lake_commands,
    notify_commands,
    sql_commands,
    stream_commands,
    tenant_commands,
)
from infra.cli.exit_codes import expected_failure
from streaming.fault_points import NO_FAULTS, FaultHook
from streaming.pipeline.native_allocators import use_long_lived_allocators

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
    dev_commands,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tenant-windows", description=DESCRIPTION)
    verbose_help = (
        "log at DEBUG, and print the traceback of an expected failure (a broker, the lake, "
        "the config) above its one line"
    )
    parser.add_argument("--verbose", action="store_true", help=verbose_help)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(commands)
    # Also after the command, where a user adds it to the line that just failed; SUPPRESS
    # leaves the value given before the command when it is not repeated.
    for command in _commands_below(parser):
        command.add_argument(
            "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help
        )
    return parser


def _commands_below(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every command's parser under `parser`, nested ones too (`tenants validate`)."""
    found = []
    # argparse has no public way to list them; its own help code walks `_actions` too.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                found += [command, *_commands_below(command)]
    return found


def main(argv: Sequence[str] | None = None, fault_hook: FaultHook = NO_FAULTS) -> int:
    """Parse `argv` and run its command; `fault_hook` is for the recovery tests."""
    use_long_lived_allocators()
    args = build_parser().parse_args(argv)
    args.fault_hook = fault_hook
    _configure_logging(args.verbose)
    try:
        result: int = args.handler(args)
        return result
    except Exception as error:
        failure = expected_failure(error)
        if failure is None:
            raise
        # The one line says what to do; the frames below it are for whoever debugs the code.
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            traceback.print_exc(file=sys.stderr)
        print(failure.message(error), file=sys.stderr)
        return int(failure.exit_code)


def _configure_logging(verbose: bool) -> None:
    root = logging.getLogger()
    configured_already = bool(root.handlers)  # e.g. by a test that calls `main`
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if verbose:
        root.setLevel(logging.DEBUG)
    elif not configured_already:
        for handler in root.handlers:
            handler.addFilter(ExpectedFailuresInOneLine())
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # kafka-python logs every failed reconnect of a broker outage; the product's own errors
    # and warnings name the broker and what failed, once. Never DEBUG: it prints configs.
    logging.getLogger("kafka").setLevel(logging.WARNING if verbose else logging.CRITICAL)


class ExpectedFailuresInOneLine(logging.Filter):
    """A record logged with an expected failure's traceback (a background thread's
    `log.exception` during an outage: the notifier, the lease renewal) keeps its message and
    the failure's first line; the frames are for `--verbose`."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, Exception) and expected_failure(error) is not None:
            first_line = next(iter(str(error).splitlines()), "")
            record.msg = f"{record.getMessage()} ({type(error).__name__}: {first_line})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


if __name__ == "__main__":
    sys.exit(main())
