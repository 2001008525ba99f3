"""A Spark home for the sessions this project starts, whose Python processes import PySpark
compiled.

Spark starts Python processes of its own beside the driver: one to look up data sources, one to
create the Kafka source, one to plan each read, the streaming source's runner, and the workers'
daemon. It puts `$SPARK_HOME/python/lib/pyspark.zip` first on their path, and Python compiles
every module it imports from a zip, from source, in every process: 0.55 s of CPU a process here,
on the critical path of every start. The PySpark wheel is its own Spark home, and that zip holds
the code of the installed package itself, which the interpreter imports from compiled files. So
a session whose Python processes run this interpreter (from its environment, which has PySpark)
starts on a Spark home that links the wheel's `bin`, `conf`, `jars` and `sbin` and leaves
`python/lib` out. A cluster's executors keep their own Spark home.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyspark

log = logging.getLogger(__name__)

LINKED_PARTS = ("bin", "conf", "jars", "sbin")


def session_spark_home() -> Path | None:
    """The Spark home of a session this process starts (`home_without_python_zips`); None where
    an operator chose one, under spark-submit, or where Spark's Python processes on this machine
    run another environment's Python, which may lack PySpark."""
    if "SPARK_HOME" in os.environ or "PYSPARK_GATEWAY_PORT" in os.environ:
        return None
    python = shutil.which(os.environ.get("PYSPARK_PYTHON", sys.executable))
    if python is None or Path(python).absolute().parent != Path(sys.executable).absolute().parent:
        return None
    return home_without_python_zips(Path(pyspark.__file__).parent, environment_dir())


def session_jars(home: Path | None) -> Path:
    """The folder of jars on the class path of a session started on `home` (`session_spark_home`;
    None: where PySpark's launcher finds Spark)."""
    return Path(home or os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent) / "jars"


def home_without_python_zips(pyspark_dir: Path, folder: Path) -> Path | None:
    """The Spark home of the PySpark wheel at `pyspark_dir` without its Python zips, made once
    in `folder`; None where there is none to make or it cannot be made."""
    if not (pyspark_dir / "python" / "lib" / "pyspark.zip").exists():
        return None  # not a wheel's own Spark home: nothing to leave out
    digest = hashlib.sha256(str(pyspark_dir).encode()).hexdigest()[:16]
    home = folder / f"spark-home-{digest}"
    if not home.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            building = Path(tempfile.mkdtemp(prefix=f"{home.name}.", dir=folder))
            for part in LINKED_PARTS:
                (building / part).symlink_to(pyspark_dir / part, target_is_directory=True)
            try:
                building.rename(home)  # atomic: of two starts at once, one wins
            except OSError:
                shutil.rmtree(building, ignore_errors=True)
        except OSError as error:
            log.debug("no Spark home without PySpark's zips in %s: %s", folder, error)
            return None
    return home if _links_to(home, pyspark_dir) else None


def _links_to(home: Path, pyspark_dir: Path) -> bool:
    try:
        return all(Path(os.readlink(home / part)) == pyspark_dir / part for part in LINKED_PARTS)
    except OSError:
        return False


@contextlib.contextmanager
def spark_home(home: Path | None) -> Iterator[None]:
    """`SPARK_HOME` is `home` while the JVM starts (PySpark's launcher reads the environment),
    then what it was."""
    if home is None:
        yield
        return
    before = os.environ.get("SPARK_HOME")
    os.environ["SPARK_HOME"] = str(home)
    try:
        yield
    finally:
        if before is None:
            del os.environ["SPARK_HOME"]
        else:
            os.environ["SPARK_HOME"] = before


def environment_dir() -> Path:
    """Where the project keeps what it derives from this Python environment's installs (the
    Spark home, the class archive): in the environment's prefix, so a virtualenv's go when it
    goes, or in the user's cache where the prefix is read-only."""
    prefix = Path(sys.prefix)
    if os.access(prefix, os.W_OK):
        return prefix / "share" / "tenant-windows"
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(cache) / "tenant-windows"
