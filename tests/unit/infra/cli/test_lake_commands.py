"""The lake commands (`retain`, `tenants purge`) refuse in one line what they cannot do."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.cli.main import main
from tests.support.sample_conf import SAMPLE_CONF


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["retain"], 'tenant_status" does not exist'),
        (["tenants", "purge", "ghost"], 'tenant_status" does not exist'),
        (["tenants", "purge", "Bad Id"], "not a tenant id: 'Bad Id'"),
    ],
)
def test_lake_commands_refuse_in_one_line_without_a_lake_or_a_valid_id(
    command: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--conf", str(SAMPLE_CONF), "--lake-root", str(tmp_path)]
    assert main([*command, *flags]) == 2
    error = capsys.readouterr().err
    assert said in error and "Traceback" not in error
    assert len(error.strip().splitlines()) == 1, error
