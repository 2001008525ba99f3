"""`notify ...`: pane notifications' dead letters, and retrying them."""

from __future__ import annotations

import argparse
import dataclasses
import json

from infra.cli.command_context import (
    CONF_DIR,
    LAKE_ROOT,
    STREAM_NAME,
    add_settings_flags,
    settings_from,
)
from infra.cli.exit_codes import ExitCode


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`notify retry|dead-letters`."""
    notify = commands.add_parser("notify", help="pane notifications: dead letters, retry")
    actions = notify.add_subparsers(required=True, metavar="ACTION")
    retry = actions.add_parser(
        "retry", help="attempt dead-lettered deliveries again (same key and body)"
    )
    add_settings_flags(retry, CONF_DIR, LAKE_ROOT, STREAM_NAME)
    retry.add_argument("--tenant", help="only this tenant's dead letters")
    retry.set_defaults(handler=_notify_retry)
    dead = actions.add_parser("dead-letters", help="dead-lettered deliveries per endpoint")
    add_settings_flags(dead, LAKE_ROOT, STREAM_NAME)
    dead.set_defaults(handler=_notify_dead_letters)


def _notify_retry(args: argparse.Namespace) -> int:
    from storage.lake.delta_lake import DeltaLake
    from streaming.notify.notifier import retry_dead_letters

    settings = settings_from(args)
    report = retry_dead_letters(
        settings, DeltaLake.from_settings(settings.lake), args.tenant, args.fault_hook
    )
    print(json.dumps(dataclasses.asdict(report)))
    return ExitCode.OK if report.dead_lettered == 0 else ExitCode.FAILED


def _notify_dead_letters(args: argparse.Namespace) -> int:
    from storage.lake.delivery_outbox import dead_letter_summary
    from storage.lake.delta_lake import DeltaLake

    settings = settings_from(args)
    summary = dead_letter_summary(DeltaLake.from_settings(settings.lake), settings.stream.name)
    for group in summary:
        print(json.dumps(dataclasses.asdict(group)))
    return ExitCode.OK
