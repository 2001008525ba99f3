"""The `sql` benchmark times whole processes and checks each exits as its case says."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.dev.benchmarks.sql_cli import ROOT, Case, cases, corpus_cases, time_case


def test_the_cases_are_the_four_the_figures_name(tmp_path: Path) -> None:
    names = [case.name for case in cases(tmp_path / "lake", tmp_path / "conf")]
    assert names == ["scoped", "operator", "refused", "missing lake"]
    corpus = corpus_cases(tmp_path / "lake", tmp_path / "conf")
    assert {case.exit_code for case in corpus if case.name.startswith("typo")} == {2}
    assert [case.stdin is not None for case in corpus].count(True) == 1


def test_a_case_is_timed_as_a_whole_process_and_its_exit_code_checked(tmp_path: Path) -> None:
    [*_, missing] = cases(tmp_path / "lake", ROOT / "conf")
    timings = time_case(ROOT, missing, runs=2)
    assert len(timings) == 2
    assert all(cpu > 0 and 0 < wall < 60 for wall, cpu in timings)
    wrong = Case("wrong", missing.arguments, exit_code=0)
    with pytest.raises(RuntimeError, match="exit 2, expected 0"):
        time_case(ROOT, wrong, runs=1)
