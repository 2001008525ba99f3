"""The CLI's global flags and how an expected failure ends a command."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.cli.exit_codes import ExitCode
from infra.cli.main import ExpectedFailuresInOneLine, build_parser, main


@pytest.fixture
def root_log_level() -> Iterator[None]:
    """`--verbose` sets the root logger's level, which outlives the call: put it back."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


def _refusing_server() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def _run_against(server: str, tmp_path: Path, *global_flags: str) -> list[str]:
    return [
        *global_flags,
        "run",
        "--app-config", str(tmp_path / "absent.yaml"),
        "--bootstrap-servers", server,
        "--lake-root", str(tmp_path / "lake"),
        "--checkpoint-dir", str(tmp_path / "checkpoint"),
    ]  # fmt: skip


def test_verbose_is_a_flag_before_or_after_the_command() -> None:
    assert build_parser().parse_args(["--verbose", "status"]).verbose is True
    assert build_parser().parse_args(["status", "--verbose"]).verbose is True
    assert build_parser().parse_args(["sql", "--verbose", "SELECT 1"]).verbose is True
    assert build_parser().parse_args(["tenants", "validate", "--verbose"]).verbose is True
    assert build_parser().parse_args(["status"]).verbose is False


def test_an_expected_failure_is_one_line_and_its_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], root_log_level: None
) -> None:
    server = _refusing_server()
    code = main(_run_against(server, tmp_path))
    err = capsys.readouterr().err
    assert code == ExitCode.REFUSED
    assert err == f"not starting: Kafka at {server} is unreachable: connection refused\n"
    assert not (tmp_path / "lake").exists() and not (tmp_path / "checkpoint").exists()


def test_verbose_prints_the_traceback_above_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], root_log_level: None
) -> None:
    server = _refusing_server()
    code = main(_run_against(server, tmp_path, "--verbose"))
    err = capsys.readouterr().err.splitlines()
    assert code == ExitCode.REFUSED
    assert err[0] == "Traceback (most recent call last):"
    assert err[-1] == f"not starting: Kafka at {server} is unreachable: connection refused"
    assert logging.getLogger().isEnabledFor(logging.DEBUG)


def test_a_logged_expected_failure_keeps_its_message_and_loses_its_frames() -> None:
    from streaming.kafka.client import KafkaUnavailableError

    try:
        raise KafkaUnavailableError("broker 127.0.0.1:9 unreachable (connection refused)")
    except KafkaUnavailableError as error:
        record = logging.LogRecord(
            "streaming.notify.notifier", logging.ERROR, __file__, 1, "%s: will try again",
            ("notifier",), (type(error), error, error.__traceback__),
        )  # fmt: skip
    assert ExpectedFailuresInOneLine().filter(record)
    assert record.exc_info is None
    assert record.getMessage() == (
        "notifier: will try again (KafkaUnavailableError: broker 127.0.0.1:9 unreachable "
        "(connection refused))"
    )


def test_a_logged_bug_keeps_its_traceback() -> None:
    try:
        raise KeyError("a bug")
    except KeyError as error:
        info = (type(error), error, error.__traceback__)
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, info)
    assert ExpectedFailuresInOneLine().filter(record)
    assert record.exc_info == info and record.getMessage() == "failed"
