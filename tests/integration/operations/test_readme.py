"""The README's first screen promises two commands; CI must run exactly those, and the first
one, the demo, ends with commands that run as printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.sample_conf import SAMPLE_CONF, copy_conf

DEMO_TIMEOUT_S = 600
TRY_TIMEOUT_S = 300


def readme_commands() -> list[str]:
    first_block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert first_block is not None, "README has no bash block"
    return [
        line.split("#")[0].strip() for line in first_block.group(1).splitlines() if line.strip()
    ]


def test_readme_first_screen_has_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert readme.index("```bash") < 600, "the commands must be on the first screen"
    assert readme_commands() == ["./infra/demo.sh", "./infra/test.sh"]


def test_ci_runs_the_readme_commands() -> None:
    ci_lines = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for command in readme_commands():
        script = command.removeprefix("./")
        assert f"bash {script}" in ci_lines, f".ci/run does not run {command}"
        assert (ROOT / script).stat().st_mode & 0o111, f"{script} is not executable"


def try_commands(demo_output: str) -> list[str]:
    """The commands of the demo's `Try:` paragraph: its first line and the indented ones under
    it."""
    lines = demo_output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Try: "))
    commands = [lines[start].removeprefix("Try: ").strip()]
    for line in lines[start + 1 :]:
        if not line.startswith("     ") or not line.strip():
            break
        commands.append(line.strip())
    return commands


@pytest.mark.integration
def test_the_demos_try_commands_run_as_printed(tmp_path: Path) -> None:
    """One small demo run (its own broker, the stream, Spark SQL), then each `Try:` command as
    printed, in a shell from where the demo ran, with what infra/demo.sh leaves: no `.venv/bin`
    on the PATH (a bare `tenant-windows` was "command not found") and no `TW_*` variables."""
    copy_conf(SAMPLE_CONF, tmp_path)
    bin_dir = Path(sys.executable).parent
    environ = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("TW_") and name not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    environ["PATH"] = os.pathsep.join(
        entry for entry in environ.get("PATH", "").split(os.pathsep) if Path(entry) != bin_dir
    )
    demo = subprocess.run(
        [sys.executable, "-m", "infra.cli", "demo", "--count", "900"],
        cwd=tmp_path,
        env={**environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    commands = try_commands(demo.stdout)
    assert [command.split()[1] for command in commands] == ["sql", "status"], commands
    printed = {}
    for command in commands:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=tmp_path,
            env=environ,
            capture_output=True,
            text=True,
            timeout=TRY_TIMEOUT_S,
        )
        assert done.returncode == 0, (
            f"{command!r} exited {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
        printed[command.split()[1]] = done.stdout
    assert "window_id" in printed["sql"], printed["sql"]
    # status read the demo's lake and checkpoint, not the defaults of conf/app.yaml.
    assert "does not exist" not in printed["status"] and "acme" in printed["status"]
