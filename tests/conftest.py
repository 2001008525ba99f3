"""Shared fixtures: one real broker and one SparkSession for the whole run (each costs seconds)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sample_conf import SAMPLE_CONF

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from infra.dev.local_stack import LocalKafka

    with LocalKafka(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from streaming.pipeline.spark_session import build_spark

    session = build_spark("tenant-windows-tests", master="local[2]", shuffle_partitions=4)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def conf_dir() -> Path:
    return SAMPLE_CONF


# A test that starts the broker or Spark is an integration test whether or not its module says
# so: `-m "not integration"` (the unit run on the other Pythons) must not start either.
_INTEGRATION_FIXTURES = {"kafka", "spark"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
