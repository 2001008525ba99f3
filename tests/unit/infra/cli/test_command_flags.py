"""Each command's `--help` is true: every flag it lists has a description, and it lists only
the flags its own code path reads, found in the code (`tests.support.code_reads`), not in a list
kept beside the parser."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from infra.cli.command_context import (
    QUERY_METRICS_PORT,
    SETTINGS_FLAGS,
    STREAM_METRICS_PORT,
    SettingsFlag,
)
from infra.cli.main import build_parser
from tests.support.code_reads import covers, reads_of

GLOBAL = {"help", "verbose"}
# A server's port belongs to the command that starts that server (`run`, `serve`): a command
# that reads the whole settings is not asked to offer the other one's.
SERVER_PORTS = {STREAM_METRICS_PORT.name, QUERY_METRICS_PORT.name}


def _commands(
    parser: argparse.ArgumentParser, name: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, below in action.choices.items():
                yield from _commands(below, f"{name} {command}".strip())
    if parser.get_default("handler") is not None:
        yield name, parser


COMMANDS = dict(_commands(build_parser()))


def _settings_flag(parser: argparse.ArgumentParser, dest: str) -> SettingsFlag | None:
    return next((flag for flag in SETTINGS_FLAGS if flag.name == dest), None)


def _reads(parser: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    """(settings paths, `args` attributes) the command's handler reads along its calls."""
    handler = parser.get_default("handler")
    settings = reads_of(handler.__module__, handler.__name__, None, frozenset({"settings_from"}))
    args = reads_of(
        handler.__module__, handler.__name__, "args", opaque=frozenset({"settings_from"})
    )
    return settings, args


def _listed(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions if action.dest not in GLOBAL]


def test_every_command_is_walked() -> None:
    assert {"run", "status", "produce", "sql", "serve", "optimize", "tenants purge"} <= set(
        COMMANDS
    )


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_flag_has_a_description(command: str) -> None:
    parser = COMMANDS[command]
    bare = [
        "/".join(action.option_strings) or action.dest
        for action in parser._actions
        if not action.help or action.help == argparse.SUPPRESS
    ]
    assert bare == [], f"`{command} --help` lists flags without a description: {bare}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_lists_only_the_flags_it_reads(command: str) -> None:
    parser = COMMANDS[command]
    settings_reads, args_reads = _reads(parser)
    unread = []
    for action in _listed(parser):
        flag = _settings_flag(parser, action.dest)
        if action.dest == "app_config":
            read = bool(settings_reads)
        elif flag is not None:
            read = covers(settings_reads, flag.attribute)
        else:
            read = covers(args_reads, action.dest)
        if not read:
            unread.append("/".join(action.option_strings) or action.dest)
    assert unread == [], f"`{command} --help` lists flags its code never reads: {unread}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_offers_the_flag_of_each_setting_it_reads(command: str) -> None:
    parser = COMMANDS[command]
    settings_reads, _ = _reads(parser)
    offered = {action.dest for action in parser._actions}
    missing = [
        flag.flag
        for flag in SETTINGS_FLAGS
        if flag.name not in SERVER_PORTS
        and covers(settings_reads, flag.attribute)
        and flag.name not in offered
    ]
    assert missing == [], f"`{command}` reads these settings but offers no flag: {missing}"
