"""`dev broker`: the development parts a user starts by hand, to try the product or the docs'
examples against a running stream."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from infra.cli.command_context import (
    BOOTSTRAP_SERVERS,
    TOPIC,
    add_settings_flags,
    require_dev_tools,
    settings_from,
)
from infra.cli.exit_codes import ExitCode

DEFAULT_BROKER_DIR = Path("data/dev-broker")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`dev broker`."""
    dev = commands.add_parser("dev", help="development parts: a local Kafka broker")
    actions = dev.add_subparsers(required=True, metavar="ACTION")
    broker = actions.add_parser(
        "broker",
        help="run a Kafka broker (noida-db) on 127.0.0.1 at the port kafka.bootstrap_servers "
        "names, with its topic, until Ctrl-C or SIGTERM",
    )
    add_settings_flags(broker, BOOTSTRAP_SERVERS, TOPIC)
    broker.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_BROKER_DIR,
        help=f"where the broker keeps its data and log, kept across restarts "
        f"(default {DEFAULT_BROKER_DIR})",
    )
    broker.add_argument(
        "--partitions",
        type=int,
        default=4,
        help="partitions of the topic, if the broker creates it (default 4)",
    )
    broker.set_defaults(handler=_broker)


def _broker(args: argparse.Namespace) -> int:
    require_dev_tools("dev broker", "noida_db")
    from infra.dev.local_stack import LocalKafka, loopback_port, run_until_stopped

    settings = settings_from(args)
    try:
        port = loopback_port(settings.kafka.bootstrap_servers)
    except ValueError as error:
        print(error, file=sys.stderr)
        return ExitCode.REFUSED
    kafka = LocalKafka(args.data_dir, port)

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        return run_until_stopped(kafka, settings.kafka.topic, args.partitions, say)
    except RuntimeError as error:  # the port is taken, or the broker did not start
        print(f"no broker: {error}", file=sys.stderr)
        return ExitCode.FAILED
