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


def test_retain_says_each_cut_off_once_and_why() -> None:
    from infra.cli.lake_commands import _cut_line
    from storage.upkeep.retention import TenantRetention, explain_cuts, plan_cuts

    day_ms = 86_400_000
    now_ms = 1_780_000_000_000  # 2026-05-28T20:26:40Z
    tenants = {
        "steady": TenantRetention(30 * day_ms, now_ms, 60_000, "web"),
        # Its windows are 330 days old, and so is its watermark: they may still be open.
        "acme": TenantRetention(30 * day_ms, now_ms - 330 * day_ms, 300_000, "billing"),
    }
    cuts = plan_cuts(tenants, TenantRetention(30 * day_ms), now_ms)
    reasons, _ = explain_cuts(cuts, tenants, now_ms)
    lines = sorted(_cut_line(reason) for reason in reasons)
    assert lines == [
        "2025-07-02T20:00:00Z for acme: held back to the watermark 2025-07-02T20:26:40Z of "
        "acme/billing minus its allowed lateness 5m, not now minus retention (30d): windows "
        "after it may still be open",
        "2026-04-28T20:26:40Z for any tenant without a cut-off of its own (1 configured): "
        "now minus lake.default_retention (30d)",
    ]
