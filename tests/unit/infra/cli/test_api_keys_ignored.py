"""A key issued in a checkout stays out of git: `conf/api_keys/` is in the project's `.gitignore`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from infra.cli.main import main

CHECKOUT = Path(__file__).resolve().parents[4]


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_an_issued_key_does_not_show_in_git_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A copy of the checkout's config and ignore rules, committed, so the test never writes a key
    # into the real checkout.
    repo = tmp_path / "checkout"
    shutil.copytree(CHECKOUT / "conf", repo / "conf")
    shutil.copy(CHECKOUT / ".gitignore", repo / ".gitignore")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "config")

    assert main(["tenants", "issue-key", "acme", "--conf", str(repo / "conf")]) == 0
    key_files = list((repo / "conf" / "api_keys").iterdir())
    assert key_files, "the key's hash was not written under conf/api_keys/"

    assert _git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    for key_file in key_files:
        relative = key_file.relative_to(repo).as_posix()
        assert _git(repo, "check-ignore", relative).strip() == relative
    assert capsys.readouterr().out.strip(), "no key printed"
