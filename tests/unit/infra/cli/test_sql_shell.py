"""`tenant-windows sql` options and prompt input, without Spark."""

from __future__ import annotations

import io

import pytest

from infra.cli.sql_shell import SqlOptionError, parse_versions, run_prompt
from storage.lake.tables import ALL_TABLES

TABLES = [spec.name for spec in ALL_TABLES]


def test_a_bare_version_applies_to_every_table_and_table_versions_override_it() -> None:
    assert parse_versions([]) == {}
    assert parse_versions(["3"]) == dict.fromkeys(TABLES, 3)
    assert parse_versions(["windows=5", "3"]) == {**dict.fromkeys(TABLES, 3), "windows": 5}
    assert parse_versions(["events=0"]) == {"events": 0}


@pytest.mark.parametrize(
    ("value", "message"),
    [("-1", "expected a table version"), ("x", "expected"), ("tenants=1", "no table 'tenants'")],
)
def test_a_bad_version_says_what_is_expected(value: str, message: str) -> None:
    with pytest.raises(SqlOptionError, match=message):
        parse_versions([value])


def test_piped_statements_end_at_a_semicolon_and_quit_leaves() -> None:
    ran: list[str] = []

    def run(statement: str) -> bool:
        ran.append(statement)
        return "bad" not in statement

    script = "SELECT 1\nFROM events;\n\nSELECT bad;\nQUIT;\nSELECT 'never';\n"
    code = run_prompt(run, "> ", io.StringIO(script), io.StringIO())
    assert ran == ["SELECT 1\nFROM events;", "SELECT bad;"]
    assert code == 2


def test_the_last_statement_may_omit_its_semicolon() -> None:
    ran: list[str] = []
    code = run_prompt(lambda s: ran.append(s) is None, "> ", io.StringIO("SELECT 1"), io.StringIO())
    assert ran == ["SELECT 1"] and code == 0
