"""What `tenant-windows run --master spark://...` ships to executors (fast; the cluster run itself
is in tests/integration/cluster/test_cluster.py)."""

from __future__ import annotations

import importlib.metadata
import sys
import sysconfig
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from infra.cluster.ship import EXECUTOR_DISTRIBUTIONS, build_artifacts
from tests.support.paths import ROOT

# What the executor-side modules import beyond pyspark, pandas and pyarrow: the Kafka reader's
# client and its native CRC-32C, the windowing's sorted containers, the key state's JSON codec,
# the config models, the YAML loader of the config registry.
EXECUTOR_IMPORTS = (
    "kafka-python",
    "crc32c",
    "confluent-kafka",
    "sortedcontainers",
    "orjson",
    "pydantic",
    "pyyaml",
)


def _requirement_closure(roots: tuple[str, ...]) -> set[str]:
    found: set[str] = set()
    pending = list(roots)
    while pending:
        name = canonicalize_name(pending.pop())
        if name in found:
            continue
        found.add(name)
        for line in importlib.metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return found


def test_the_shipped_dependencies_are_the_requirement_closure_of_what_executors_import() -> None:
    shipped = {canonicalize_name(name) for name in EXECUTOR_DISTRIBUTIONS}
    assert shipped == _requirement_closure(EXECUTOR_IMPORTS)


def test_the_code_zip_holds_the_executor_packages_and_nothing_of_infra(tmp_path: Path) -> None:
    artifacts = build_artifacts(tmp_path)
    with zipfile.ZipFile(artifacts.code_zip) as archive:
        names = set(archive.namelist())
    expected = {
        path.relative_to(ROOT).as_posix()
        for package in ("tenants", "streaming", "storage")
        for path in (ROOT / package).rglob("*.py")
    }
    assert names == expected
    assert "streaming/kafka/reader.py" in names


def test_the_dependency_archive_holds_the_compiled_extension_for_this_python(
    tmp_path: Path,
) -> None:
    artifacts = build_artifacts(tmp_path)
    assert f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}" in artifacts.deps_zip.name
    with zipfile.ZipFile(artifacts.deps_zip) as archive:
        names = archive.namelist()
    extension_suffix = sysconfig.get_config_var("EXT_SUFFIX")
    assert any(
        name.startswith("pydantic_core/") and name.endswith(extension_suffix) for name in names
    )
    assert {"kafka/__init__.py", "pydantic/__init__.py", "yaml/__init__.py"} <= set(names)
    conf = artifacts.spark_conf()
    assert conf["spark.archives"] == f"{artifacts.deps_zip}#tw_deps"
    assert conf["spark.executorEnv.PYTHONPATH"] == "tw_deps"


def test_a_second_build_reuses_the_artifacts(tmp_path: Path) -> None:
    first = build_artifacts(tmp_path)
    modified = {path: path.stat().st_mtime_ns for path in (first.code_zip, first.deps_zip)}
    second = build_artifacts(tmp_path)
    assert second == first
    assert {path: path.stat().st_mtime_ns for path in modified} == modified
