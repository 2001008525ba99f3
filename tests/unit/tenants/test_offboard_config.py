"""`tenants offboard`: what it refuses, and the copy it keeps that lets a tenant come back."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.cli.main import main
from tenants.conf_reader import load_registry
from tests.support.sample_conf import copy_conf


def test_offboard_refuses_an_unknown_tenant_and_moves_nothing(
    conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = copy_conf(conf_dir, tmp_path)
    before = sorted(path.name for path in (conf / "tenants").iterdir())

    assert main(["tenants", "offboard", "nobody", "--conf", str(conf)]) == 2

    assert "no tenant 'nobody' is configured" in capsys.readouterr().err
    assert sorted(path.name for path in (conf / "tenants").iterdir()) == before
    assert not (conf / "offboarded").exists()


def test_offboard_refuses_while_the_config_is_invalid(
    conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = copy_conf(conf_dir, tmp_path)
    (conf / "tenants" / "broken.yaml").write_text("id: broken\nsources: [nowhere]\n")

    assert main(["tenants", "offboard", "acme", "--conf", str(conf)]) == 2

    assert "broken.yaml: sources.nowhere: unknown source" in capsys.readouterr().err
    assert (conf / "tenants" / "acme.yaml").exists()


def test_offboard_keeps_a_copy_the_registry_ignores_and_a_tenant_can_come_back(
    conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = copy_conf(conf_dir, tmp_path)

    assert main(["tenants", "offboard", "globex", "--conf", str(conf)]) == 0

    assert "move the file back" in capsys.readouterr().out
    assert set(load_registry(conf).tenants) == {"acme", "initech"}
    (copy,) = (conf / "offboarded").iterdir()
    copy.rename(conf / "tenants" / "globex.yaml")
    assert set(load_registry(conf).tenants) == {"acme", "globex", "initech"}
