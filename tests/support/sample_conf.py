"""The checkout's sample config (`conf/`: tenants acme, globex and initech), copies of it to
change in a test, and tenant files written there."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import ROOT

SAMPLE_CONF = ROOT / "conf"


def copy_conf(conf_dir: Path, folder: Path) -> Path:
    """A copy of the config in `conf_dir` at `folder/conf`, for a test to change."""
    target = folder / "conf"
    shutil.copytree(conf_dir, target)
    return target


def write_tenant(conf: Path, tenant: str, body: str | Mapping[str, Mapping[str, Any]]) -> Path:
    """Write `conf/tenants/<tenant>.yaml`: `body` as the file's text, or the tenant's sources
    with their rule overrides (source name to rules)."""
    if not isinstance(body, str):
        sources = {name: dict(rules) for name, rules in body.items()}
        body = yaml.safe_dump({"id": tenant, "sources": sources}, sort_keys=False)
    path = conf / "tenants" / f"{tenant}.yaml"
    path.write_text(body)
    return path
