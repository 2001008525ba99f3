"""What a deployment gets from the wheel: the product and its CLI, none of the development tools.

The wheel is built from a copy of this checkout and installed into a throwaway venv that borrows
this environment's dependencies through a `.pth` line (its `.pth` files, among them the editable
install's finder, are not run), so imports there resolve to the wheel alone. Commands run from a
folder outside the checkout, as they would on a deployed machine. The last test keeps the
Pythons the package declares and the ones infra/check_pythons.sh runs these tests on the same.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from tests.support.paths import ROOT

PRODUCT_PACKAGES = ("tenants", "streaming", "storage", "infra")
DEV_PACKAGE_DIR = "infra/dev/"
# Only the checkout's sources go into the copy the wheel is built from: no venvs, no data, no
# stale `build/` (setuptools would ship leftovers from an earlier build).
_NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv*", "data", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
)
_COMMAND_TIMEOUT_S = 120


@dataclass(frozen=True)
class Environment:
    """A throwaway venv: run its Python or its console script from a folder outside the checkout."""

    bin_dir: Path
    workdir: Path

    def run(self, *command: str) -> subprocess.CompletedProcess[str]:
        executable = str(self.bin_dir / command[0])
        environ = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        return subprocess.run(
            [executable, *command[1:]],
            cwd=self.workdir,
            env=environ,
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT_S,
            check=False,
        )


def _venv_borrowing(
    target: Path, site_dirs: Iterable[Path], workdir: Path
) -> tuple[Environment, Path]:
    """A venv without pip whose sys.path ends with `site_dirs`; returns it and its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    python = target / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    site_packages = Path(purelib)
    (site_packages / "borrowed.pth").write_text("".join(f"{path}\n" for path in site_dirs))
    workdir.mkdir(exist_ok=True)
    return Environment(target / "bin", workdir), site_packages


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build_dir = tmp_path_factory.mktemp("wheel")
    source = build_dir / "source"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCES)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "-q",
            "-w",
            str(build_dir),
        ],
        check=True,
        timeout=_COMMAND_TIMEOUT_S,
    )
    (built,) = build_dir.glob("tenant_windows-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Environment:
    base = tmp_path_factory.mktemp("installed")
    this_site = Path(sysconfig.get_paths()["purelib"])
    environment, _site = _venv_borrowing(base / "venv", [this_site], base / "elsewhere")
    subprocess.run(
        [
            sys.executable, "-m", "pip", "--python", str(environment.bin_dir / "python"),
            "install", "--no-deps", "--no-index", "-q", str(wheel),
        ],
        check=True,
        timeout=_COMMAND_TIMEOUT_S,
    )  # fmt: skip
    return environment


def _checkout_modules(keep: Callable[[str], bool]) -> set[str]:
    paths = (
        path.relative_to(ROOT).as_posix()
        for pkg in PRODUCT_PACKAGES
        for path in (ROOT / pkg).rglob("*.py")
    )
    return {path for path in paths if keep(path) and "__pycache__" not in path}


def test_the_wheel_holds_every_product_module_and_no_development_tool(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.endswith(".py")}
    assert not {name for name in shipped if name.startswith(DEV_PACKAGE_DIR)}
    assert shipped == _checkout_modules(lambda path: not path.startswith(DEV_PACKAGE_DIR))


def test_every_product_module_imports_from_the_installed_wheel(installed: Environment) -> None:
    modules = sorted(
        path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for path in _checkout_modules(lambda path: not path.startswith(DEV_PACKAGE_DIR))
    )
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    assert module.__file__.startswith(sys.prefix), (name, module.__file__)\n"
        "print(len(sys.modules))"
    )
    result = installed.run("python", "-c", script)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("command", ["demo", "produce"])
def test_a_development_command_from_the_wheel_says_what_to_install(
    installed: Environment, command: str
) -> None:
    result = installed.run("tenant-windows", command)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"`tenant-windows {command}` needs the development tools, which are not in the wheel "
        "(missing here: infra.dev); from a source checkout, run `pip install -e '.[dev]'`"
    ]


def test_the_demo_without_noida_db_says_what_to_install(tmp_path: Path) -> None:
    # This environment's packages minus noida-db, with the checkout (infra.dev included) first.
    this_site = Path(sysconfig.get_paths()["purelib"])
    without_noida = tmp_path / "site-without-noida"
    without_noida.mkdir()
    for entry in this_site.iterdir():
        if not entry.name.startswith("noida_db"):
            (without_noida / entry.name).symlink_to(entry)
    environment, _site = _venv_borrowing(tmp_path / "venv", [ROOT, without_noida], tmp_path)
    result = environment.run("python", "-m", "infra.cli", "demo")
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "`tenant-windows demo` needs the development tools, which are not in the wheel "
        "(missing here: noida_db); from a source checkout, run `pip install -e '.[dev]'`"
    ]


def test_the_config_reference_renders_from_the_installed_wheel(installed: Environment) -> None:
    printed = installed.run("python", "-m", "infra.config_reference")
    assert printed.returncode == 0, printed.stderr[-3000:]
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    marker = '<a id="examples"></a>'
    # Everything the models and the prose give is the committed reference, word for word.
    assert printed.stdout.split(marker)[0] == committed.split(marker)[0]
    assert "`docs/examples/`, is in the source repository" in printed.stdout

    written = installed.run("python", "-m", "infra.config_reference", "--output", "reference.md")
    assert written.returncode == 0, written.stderr[-3000:]
    assert (installed.workdir / "reference.md").read_text(encoding="utf-8") == printed.stdout
    unchecked = installed.run("python", "-m", "infra.config_reference", "--check")
    assert unchecked.returncode == 2
    assert "give --output FILE" in unchecked.stderr


def test_ci_checks_exactly_the_pythons_the_project_declares() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = SpecifierSet(project["requires-python"])
    script = (ROOT / "infra" / "check_pythons.sh").read_text()
    listed = re.search(r"^VERSIONS=\(([^)]*)\)$", script, re.M)
    assert listed is not None, "infra/check_pythons.sh has no VERSIONS=(...) line"
    checked = listed.group(1).split()
    assert checked == [f"3.{minor}" for minor in range(20) if f"3.{minor}" in declared]
    classified = {
        text.removeprefix("Programming Language :: Python :: ")
        for text in project["classifiers"]
        if text.count("::") == 2 and text.startswith("Programming Language :: Python :: 3.")
    }
    assert classified == set(checked)
