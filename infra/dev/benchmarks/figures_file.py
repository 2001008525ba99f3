"""A benchmark's figures as the JSON file its `--json` names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_figures(path: Path | None, figures: Any) -> None:
    """`figures` as indented JSON at `path` (its folders made); nothing without a path."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=2))
