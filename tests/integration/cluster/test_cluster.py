"""`tenant-windows run --master spark://...` on a real standalone cluster that has none of this
project: a master and two workers from a virtualenv with only pyspark, pandas and pyarrow, each
worker (and so its executors) blind to the checkout and its `.venv`.

The run must write exactly the tables a local-mode run writes from the same topic, and its
records must have been processed by Python in the executors, with what the driver shipped.
The topic is on a broker that speaks only TLS plus SASL (`tests/support/secured_kafka.py`): the
executors read with the credentials the driver resolved, which travel inside the tasks.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.cluster.ship import project_cache_dir
from infra.dev.load_generator import LoadSpec
from infra.dev.standalone_cluster import StandaloneCluster, node_python_env
from tenants.conf_reader import load_registry
from tests.support.datasets import sample_records
from tests.support.paths import ROOT
from tests.support.pipeline_harness import Pipeline
from tests.support.secured_kafka import SecuredKafka, secured_kafka, security_environ
from tests.support.stream_process import wait_or_kill
from tests.support.table_snapshots import (
    assert_every_record_landed_once,
    assert_same_tables,
    snapshot,
)

pytestmark = pytest.mark.integration

RECORDS = 300
BATCH_SIZE = 150  # two micro-batches
STREAM_NAME = "cluster-stream"
RUN_TIMEOUT_S = 300
# One line per Python task in an executor: how many Arrow batches the state function was fed.
STATE_FUNCTION_TASK = re.compile(r"ApplyInPandasWithStatePythonRunner: Times: .* Batches: (\d+)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    node_python = node_python_env(project_cache_dir())
    workdir = tmp_path_factory.mktemp("standalone")
    with StandaloneCluster(workdir, node_python, workers=2, blind_to=ROOT) as running:
        yield running


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    with secured_kafka(
        tmp_path_factory.mktemp("cluster_broker"), "sasl_ssl", "SCRAM-SHA-512"
    ) as broker:
        yield broker


def _mounts(pid: int) -> list[tuple[str, str]]:
    """(mount point, file system type) of each mount `pid` sees."""
    mounts = []
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        mounts.append((before.split()[4], after.split()[0]))
    return mounts


def test_workers_cannot_see_the_checkout(cluster: StandaloneCluster) -> None:
    for worker in cluster.workers:
        assert worker.pid is not None
        assert (str(ROOT), "tmpfs") in _mounts(worker.pid)
    assert cluster.master.pid is not None
    assert (str(ROOT), "tmpfs") not in _mounts(cluster.master.pid)


def test_a_cluster_run_over_tls_and_sasl_writes_what_a_local_run_writes(
    secured: SecuredKafka, spark: Any, conf_dir: Path, cluster: StandaloneCluster, tmp_path: Path
) -> None:
    registry = load_registry(conf_dir)
    spec = LoadSpec(count=RECORDS, late_share=0.1, malformed_share=0.05, jitter=30_000, seed=13)
    options: dict[str, Any] = {
        "partitions": 2,
        "max_offsets_per_trigger": BATCH_SIZE,
        "stream_name": STREAM_NAME,
        "environ": security_environ(secured),
    }
    on_cluster = Pipeline.create(secured, _folder(tmp_path / "cluster"), conf_dir, **options)
    on_cluster.produce_samples(sample_records(registry, spec))
    local = Pipeline(secured, _folder(tmp_path / "local"), conf_dir, on_cluster.topic, **options)

    # The pytest process's own session set PYSPARK_PYTHON to this .venv: not for the cluster.
    environ = {
        name: value
        for name, value in on_cluster.process_environ().items()
        if not name.startswith("PYSPARK_")
    }
    log_path = tmp_path / "cluster-run.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            on_cluster.cli_run("--available-now", "--master", cluster.master.url),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environ,
            start_new_session=True,
        )
        code = wait_or_kill(process, RUN_TIMEOUT_S)
    assert code == 0, log_path.read_text()[-4000:]
    local.run_available_now(spark)

    expected = snapshot(local)
    assert len(expected["events"]) > 0 and len(expected["windows"]) > 0
    assert_same_tables(snapshot(on_cluster), expected)
    assert_every_record_landed_once(on_cluster)

    # The work was done by executors: the application had one on each worker, and their
    # Python workers fed the state function the records.
    application = cluster.completed_application(STREAM_NAME)
    logs_by_worker = [worker.executor_logs(application["id"]) for worker in cluster.workers]
    assert all(logs_by_worker), f"an executor on every worker, got {logs_by_worker}"
    executor_output = "\n".join(
        path.read_text(errors="replace") for logs in logs_by_worker for path in logs
    )
    fed_batches = [int(count) for count in STATE_FUNCTION_TASK.findall(executor_output)]
    assert sum(fed_batches) > 0, executor_output[-4000:]
    assert secured.password is not None
    assert secured.password not in executor_output + log_path.read_text(errors="replace")


def _folder(path: Path) -> Path:
    path.mkdir(parents=True)
    return path
