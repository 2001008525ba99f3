"""The expected-failure table names its errors without importing them; the names must resolve."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from infra.cli.exit_codes import EXPECTED_FAILURES, ExitCode, expected_failure


@pytest.mark.parametrize("row", EXPECTED_FAILURES, ids=lambda row: row.error)
def test_every_named_error_is_an_exception_class_that_the_table_then_recognises(row) -> None:
    module_name, class_name = row.error.split(":")
    error_class = getattr(importlib.import_module(module_name), class_name)
    assert issubclass(error_class, Exception)

    error = error_class.__new__(error_class)
    assert expected_failure(error) is row


def test_an_unlisted_error_keeps_its_traceback() -> None:
    assert expected_failure(ValueError("a bug")) is None


def test_a_subclass_of_a_listed_error_is_expected_too() -> None:
    from tenants.registry import ConfigError

    class NarrowConfigError(ConfigError):
        pass

    row = expected_failure(NarrowConfigError("conf/app.yaml", [("kafka", "missing")]))
    assert row is not None and row.exit_code is ExitCode.REFUSED


def test_the_cli_starts_without_spark_pyarrow_delta_rs_or_kafka() -> None:
    # What every command pays before it does anything; `sql` must answer in a second.
    heavy = ("pyspark", "pyarrow", "deltalake", "kafka", "pandas")
    probe = (
        "import sys, infra.cli.main as m; m.build_parser(); "
        f"print(' '.join(n for n in {heavy!r} if n in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert loaded == []
