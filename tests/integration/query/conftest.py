"""The lake the SQL doors' tests serve, written once per run (tests/support/served_lake.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.pipeline_harness import Pipeline
from tests.support.served_lake import write_served_lake


# Session-scoped and in tests/conftest.py's grouped session fixtures, so the modules that serve
# it run on one worker and it is streamed once, not once per module.
@pytest.fixture(scope="session")
def served_lake(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Pipeline:
    return write_served_lake(kafka, spark, tmp_path_factory.mktemp("served-lake"), conf_dir)
