"""The README's first screen promises two commands; CI must run exactly those."""

from __future__ import annotations

import re

from tests.support.paths import ROOT


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
