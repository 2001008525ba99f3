"""Where the checkout is, for tests at any depth below `tests/`."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: the folder of `pyproject.toml`, `conf/` and the product packages."""
