"""Shared fixtures: one real broker and one SparkSession for the whole run (each costs seconds)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support.sample_conf import SAMPLE_CONF

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Every Spark the tests start (this process's and each `tenant-windows` subprocess's) is short
# and small, so its JVM compiles with the quick JIT only and collects with one thread: a Spark
# start-up then costs about 4.5 CPU seconds instead of 7 here, on a machine whose two cores the
# suite's workers keep busy. Production JVMs keep the JDK's defaults.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
# No per-example deadline for the property tests: beside the suite's Spark workers an example
# once took 257 ms against Hypothesis' default 200 ms, a measure of the machine, not the code.
# Loaded here, before any test module builds its `@settings`.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


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


# With several workers (`-n N --dist loadgroup`, as infra/test.sh runs), the tests of a module
# that share a module- or class-scoped fixture (a running stream, a server, a secured broker) stay
# on one worker, so the fixture is built once; every other test goes wherever a worker is free.
_SHARED_SCOPES = {"module", "class", "package"}


# Session fixtures that tests of several modules share (tests/integration/query/conftest.py's
# served lake): every test that uses one runs in one group named after it, on one worker, so
# the fixture is built once rather than on each worker that drew one of its tests.
_GROUPED_SESSION_FIXTURES = frozenset({"served_lake"})


def _shares_a_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definition.scope in _SHARED_SCOPES
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
    )


def _group_of(item: pytest.Item) -> str | None:
    shared = sorted(_GROUPED_SESSION_FIXTURES & set(getattr(item, "fixturenames", ())))
    if shared:
        return shared[0]
    if _shares_a_fixture(item):
        return item.nodeid.split("::")[0]
    return None


# The groups and modules that keep a worker busy longest, longest first (from `--durations`
# of a full run; a group is named by its module or its grouped session fixture). Under
# loadgroup they are handed out first, then the other integration tests, then the unit tests,
# which are short and so fill the end evenly: in collection order, a long module that came
# late (recovery/, notify/) ran alone on one worker while the others had finished.
_LONGEST_FIRST = (
    "tests/integration/recovery/test_crash_recovery.py",
    "tests/integration/operations/test_docs_commands.py",
    "tests/integration/lake/test_seaweedfs_lake.py",
    "tests/integration/notify/test_notify_stream.py",
    "served_lake",
    "tests/integration/recovery/test_hung_dependencies.py",
    "tests/integration/kafka/test_deferral_stream.py",
    "tests/integration/operations/test_benchmark_smoke.py",
    "tests/integration/pipeline/test_class_archive.py",
    "tests/integration/cluster/test_cluster.py",
    "tests/integration/recovery/test_one_writer.py",
    "tests/integration/operations/test_cli.py",
    "tests/integration/kafka/test_kafka_tls.py",
    "tests/integration/recovery/test_graceful_stop.py",
    "tests/integration/query/test_prometheus_scrape.py",
    "tests/integration/operations/test_readme.py",
    "tests/integration/recovery/test_standby_failover.py",
    "tests/integration/query/test_local_sql.py",
    "tests/integration/kafka/test_broker_at_start.py",
)


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("dist", "no") == "loadgroup":
        # xdist would otherwise hand out the groups with the most tests first, whatever
        # their length, and the rest in collection order, undoing _start_rank's order.
        config.option.loadscopereorder = False


def _start_rank(item: pytest.Item) -> int:
    group = _group_of(item) or item.nodeid.split("::")[0]
    if group in _LONGEST_FIRST:
        return _LONGEST_FIRST.index(group)
    return len(_LONGEST_FIRST) + (item.get_closest_marker("integration") is None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    grouping = bool(getattr(config.option, "loadgroup", False))  # xdist workers under loadgroup
    for item in items:
        if _INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        group = _group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            if grouping and not item.nodeid.endswith(f"@{group}"):
                _group_in_node_id(item, group)
    if grouping:
        # Stable: within a rank, collection order; every worker sorts alike, as xdist requires.
        items.sort(key=_start_rank)


def _group_in_node_id(item: pytest.Item, group: str) -> None:
    """`--dist loadgroup` schedules by the `@group` suffix of each node id a worker collected.
    xdist 3.8 adds it by setting `item._nodeid`, which pytest 9 no longer reads (the id is
    `item._id`), and from a hook that ran before this one marked anything: no test was grouped,
    and each worker that drew a test of such a module built the module's fixture again (a
    stream, a lake, a server: up to three times each)."""
    from _pytest.nodeid import coerce_node_id

    item._id = coerce_node_id(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]
