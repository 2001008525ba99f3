"""What the crash tests' streams read, and the tables they must end with: one topic of sample
load (`FAULT_LOAD`) and the tables a run without a fault writes from it.

Module-scoped: a module's tests then run on one worker (tests/conftest.py), which builds both
once. Session-scoped, each worker that drew one of its tests built them again, and spreading the
tests gains nothing on a suite that keeps both cores busy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.support.datasets import (
    COMPACT_EVERY_BATCH,
    FAULT_BATCH_SIZE,
    FAULT_LOAD,
    clean_run,
    produce_dataset,
)


@pytest.fixture(scope="module")
def dataset(kafka: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One topic every run reads from the start, so runs differ only by their fault."""
    return produce_dataset(kafka, conf_dir, tmp_path_factory.mktemp("topic"), FAULT_LOAD)


# Where a row ends is its key's partition however it got there (settled after every batch, by
# size in a merge, or from a run at the end), so a run that settles after every batch is the
# reference for every compaction mode.
@pytest.fixture(scope="module")
def clean_tables(
    kafka: Any, spark: Any, conf_dir: Path, dataset: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, pd.DataFrame]:
    workdir = tmp_path_factory.mktemp("clean")
    return clean_run(
        kafka,
        spark,
        conf_dir,
        workdir,
        dataset,
        FAULT_BATCH_SIZE,
        environ=dict(COMPACT_EVERY_BATCH),
    )
