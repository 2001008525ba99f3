"""Warming the Python workers at a start imports every module a batch's Python stages import."""

from __future__ import annotations

import importlib
import logging
from typing import Any

import pytest

from streaming.pipeline.worker_warmup import BATCH_MODULES, warm_python_workers


def test_the_warm_up_job_runs_and_names_modules_that_exist(
    spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    for module in BATCH_MODULES:  # a renamed module would make every warm-up fail quietly
        importlib.import_module(module)
    with caplog.at_level(logging.INFO, logger="streaming.pipeline.worker_warmup"):
        thread = warm_python_workers(spark)
        thread.join(timeout=120)
    assert not thread.is_alive()
    assert any("Python workers warmed" in record.message for record in caplog.records)
