"""The sample config as the integration tests run it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.sample_conf import SAMPLE_CONF, copy_conf


@pytest.fixture(scope="session")
def conf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample config with no idle timeout that a test could reach: a copy per worker.

    The contract closes an idle key's windows by processing time (`web`: `idle_timeout: 2m`),
    and these tests compare runs whose batches fall at different processing times: a stream
    restarted after a crash, a standby taking over, a run on a cluster, against a clean run. On a
    busy machine two batches of the first kind were once more than two minutes apart, so the
    idle keys' later records were late there and on time in the clean run (CI, 2026-11-28: a
    crash chain, the cluster run and a failover). Idle timeouts have tests of their own, with
    rules of their own (`test_semantics_spark.py`).
    """
    conf = copy_conf(SAMPLE_CONF, tmp_path_factory.mktemp("sample"))
    sources = conf / "sources.yaml"
    sample = sources.read_text()
    assert "idle_timeout: 2m" in sample, "the sample's sources changed: say here what to raise"
    sources.write_text(sample.replace("idle_timeout: 2m", "idle_timeout: 1d"))
    return conf
