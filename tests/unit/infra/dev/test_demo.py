"""The commands the demo prints at its end run as printed: no `tenant-windows` on the PATH."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from infra.dev.demo import tenant_windows_command, try_lines


def _venv(root: Path, with_script: bool) -> Path:
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").touch()
    if with_script:
        (bin_dir / "tenant-windows").touch()
    return bin_dir


def test_from_the_checkout_it_is_the_venvs_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """infra/demo.sh runs `.venv/bin/tenant-windows demo` in the checkout after setup."""
    bin_dir = _venv(tmp_path, with_script=True)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    assert tenant_windows_command(tmp_path) == ".venv/bin/tenant-windows"
    assert tenant_windows_command(tmp_path / "elsewhere") == str(bin_dir / "tenant-windows")
    assert tenant_windows_command(bin_dir) == "./tenant-windows"


def test_without_the_script_it_is_the_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = _venv(tmp_path, with_script=False)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    assert tenant_windows_command(tmp_path) == ".venv/bin/python -m infra.cli"


def test_the_try_lines_quote_what_the_shell_would_split() -> None:
    text = try_lines(Path("my lake"), Path("data/demo/checkpoint"), ".venv/bin/tenant-windows")
    assert text.splitlines() == [
        "Lake: my lake",
        "Try: .venv/bin/tenant-windows sql --lake-root 'my lake' 'SELECT * FROM windows LIMIT 5'",
        "     .venv/bin/tenant-windows status --lake-root 'my lake' "
        "--checkpoint-dir data/demo/checkpoint",
    ]
