"""What executors on a Spark cluster need of this project, packed for Spark to ship from the driver.

A cluster node's Python is assumed to have pyspark, pandas and pyarrow (every PySpark image
does) and nothing of this project. Two artifacts fill the gap, both served by the driver:

- the code: the `tenants`, `streaming` and `storage` packages (pure Python, never `infra`) in a
  zip on `spark.submit.pyFiles`, which executors import from the zip as it is;
- the dependencies the executor-side code imports (the Kafka reader's confluent-kafka, the config
  models' pydantic, the YAML loader's pyyaml, and what they require), copied from the driver's
  own environment into a zip on `spark.archives`. An archive, not pyFiles: pydantic-core is a
  compiled extension, and Python cannot load an extension module from inside a zip, so Spark
  unpacks the archive into each executor's working directory and `spark.executorEnv.PYTHONPATH`
  puts that directory on the path. The copy matches the driver's Python and platform, which
  PySpark already requires of the workers' Python (same minor version); `cache_tag` and
  `platform` in the file name say which it is.

Both are built once per content into a cache directory; `python -m infra.cluster.ship` prints
the `spark-submit` options that use them (see `infra/cluster/submit.sh`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXECUTOR_PACKAGES = ("tenants", "streaming", "storage")
# The closure of kafka-python (with its native CRC-32C: without it every fetched batch is
# checked in pure Python, several times slower), confluent-kafka (the reader; its wheel bundles
# librdkafka), sortedcontainers (the windowing's index of
# open sessions), orjson (key state), pydantic and pyyaml;
# tests/integration/cluster/test_cluster_ship.py checks it against the installed requirement
# metadata.
EXECUTOR_DISTRIBUTIONS = (
    "kafka-python",
    "crc32c",
    "confluent-kafka",
    "sortedcontainers",
    "orjson",
    "pydantic",
    "pydantic-core",
    "typing-extensions",
    "annotated-types",
    "typing-inspection",
    "pyyaml",
)
DEPS_DIR_NAME = "tw_deps"
"""The folder each executor unpacks the dependency archive into (relative to its working dir)."""
_FIXED_ZIP_TIME = (2020, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class ShippedArtifacts:
    code_zip: Path
    deps_zip: Path

    def spark_conf(self) -> dict[str, str]:
        """The session settings that make Spark ship both to every executor."""
        return {
            "spark.submit.pyFiles": str(self.code_zip),
            "spark.archives": f"{self.deps_zip}#{DEPS_DIR_NAME}",
            # Relative: Python workers start in the executor's working dir, where archives are
            # unpacked. Spark puts this ahead of its own entries on the workers' PYTHONPATH.
            "spark.executorEnv.PYTHONPATH": DEPS_DIR_NAME,
        }

    def submit_options(self) -> list[str]:
        """The same as `spark-submit` options."""
        conf = self.spark_conf()
        return [
            "--py-files",
            conf["spark.submit.pyFiles"],
            "--archives",
            conf["spark.archives"],
            "--conf",
            f"spark.executorEnv.PYTHONPATH={conf['spark.executorEnv.PYTHONPATH']}",
        ]


def project_cache_dir() -> Path:
    """Where built artifacts are kept between runs; safe to delete when nothing runs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tenant-windows"


def build_artifacts(cache_dir: Path | None = None) -> ShippedArtifacts:
    """Both artifacts, built unless the cache already holds them for this content."""
    cache_dir = cache_dir or project_cache_dir() / "ship"
    cache_dir.mkdir(parents=True, exist_ok=True)
    return ShippedArtifacts(code_zip=build_code_zip(cache_dir), deps_zip=build_deps_zip(cache_dir))


def build_code_zip(cache_dir: Path) -> Path:
    files = sorted(_code_files())
    digest = hashlib.sha256()
    for relative in files:
        digest.update(relative.encode())
        digest.update((ROOT / relative).read_bytes())
    target = cache_dir / f"tenant-windows-code-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        _write_zip(target, ((ROOT / relative, relative) for relative in files))
    return target


def build_deps_zip(cache_dir: Path) -> Path:
    distributions = [importlib.metadata.distribution(name) for name in EXECUTOR_DISTRIBUTIONS]
    pins = ",".join(f"{dist.metadata['Name']}=={dist.version}" for dist in distributions)
    digest = hashlib.sha256(pins.encode()).hexdigest()[:16]
    tag = f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}"
    target = cache_dir / f"tenant-windows-deps-{tag}-{digest}.zip"
    if not target.exists():
        _write_zip(target, _distribution_files(distributions))
    return target


def _code_files() -> Iterator[str]:
    for package in EXECUTOR_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            yield path.relative_to(ROOT).as_posix()


def _distribution_files(
    distributions: Iterable[importlib.metadata.Distribution],
) -> Iterator[tuple[Path, str]]:
    """(file, name in the archive) of each installed distribution, relative to site-packages."""
    for dist in distributions:
        for file in dist.files or ():
            parts = file.parts
            # Skip scripts installed outside site-packages and byte code the workers recompile.
            if parts[0] == ".." or "__pycache__" in parts or file.suffix == ".pyc":
                continue
            yield Path(str(dist.locate_file(file))), file.as_posix()


def _write_zip(target: Path, entries: Iterable[tuple[Path, str]]) -> None:
    # Written beside the target and renamed: a concurrent run never ships a half-written zip.
    handle, temporary = tempfile.mkstemp(dir=target.parent, suffix=".partial")
    os.close(handle)
    try:
        with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as archive:
            for source, name in entries:
                info = zipfile.ZipInfo(name, date_time=_FIXED_ZIP_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                # Keep the mode: an extension module must stay readable once unpacked.
                info.external_attr = (source.stat().st_mode & 0o777) << 16
                archive.writestr(info, source.read_bytes())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def main() -> int:
    """Print the `spark-submit` options that ship the artifacts, one to a line."""
    for option in build_artifacts().submit_options():
        print(option)
    return 0


if __name__ == "__main__":
    sys.exit(main())
