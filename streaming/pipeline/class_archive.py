"""The driver JVM's class archive: Spark's classes mapped from one file at start-up.

A Spark driver loads and verifies about 10,000 classes from 300 jars before its first batch.
Java 17 can write the classes a run loaded into an archive (application class-data sharing,
`-XX:ArchiveClassesAtExit`) and map them from it in later JVMs (`-XX:SharedArchiveFile`). Here
that took the session's start from 3.7 s to 2.4 s, and a restart to its first batch from 15-17 s
to 11-12 s (docs/scale.md).

The archive belongs to one Java build and one class path: the file name carries a digest of
both, and a JVM that finds them different ignores the archive and starts as before, silently
(the `-Xlog` options). `python -m streaming.pipeline.class_archive` builds it into
`archive_dir()` (`infra/setup.sh` does). Until then, and under `spark-submit`, where the launcher
decides the driver's options, sessions start without it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyspark

from streaming.pipeline.spark_home import environment_dir, session_jars, session_spark_home

log = logging.getLogger(__name__)

SUFFIX = ".jsa"
# An archive that does not fit this JVM is skipped without a warning on every start.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
BUILD_TIMEOUT_S = 300


def archive_dir() -> Path:
    """Where archives are kept (`environment_dir`)."""
    return environment_dir() / "jvm"


def archive_path(directory: Path | None = None, jars: Path | None = None) -> Path:
    """This Java build's and this class path's archive (it may not exist yet); `jars` is the
    class path's folder of jars (None: that of a session this process would start)."""
    jars = jars or session_jars(session_spark_home())
    return (
        directory or archive_dir()
    ) / f"spark-{pyspark.__version__}-{_fingerprint(jars)}{SUFFIX}"


def java_options(directory: Path | None = None, jars: Path | None = None) -> str:
    """The driver's JVM options that map the archive; empty if it has not been built."""
    path = archive_path(directory, jars)
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path.is_file() else ""


def build(directory: Path | None = None) -> Path:
    """Run a small streaming query shaped like the product's in a JVM that writes the classes it
    loaded at exit; keep the archive once that JVM has ended. Replaces the other archives in the
    folder: they were for a Java or a Spark no longer installed here."""
    target = archive_path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tw-class-archive-") as work:
        partial = Path(work) / target.name
        finished = subprocess.run(
            [sys.executable, "-m", "streaming.pipeline.archive_workload", str(partial), work],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
        if finished.returncode != 0 or not partial.is_file():
            raise RuntimeError(
                f"the JVM class archive was not written (exit {finished.returncode}):\n"
                + "\n".join(finished.stderr.splitlines()[-20:])
            )
        for older in target.parent.glob(f"*{SUFFIX}"):
            older.unlink()
        # Same file system as the target only after the copy: rename there, whole or nothing.
        staged = target.with_suffix(".partial")
        shutil.copyfile(partial, staged)
        staged.replace(target)
    return target


def _fingerprint(jars: Path) -> str:
    """A digest of what a JVM checks an archive against: its Java build and its class path."""
    digest = hashlib.sha256()
    for part in _class_path_parts(jars):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _class_path_parts(jars: Path) -> Iterator[str]:
    java = shutil.which("java", path=_java_bin_path())
    if java is None:
        yield "no java"
    else:
        binary = os.path.realpath(java)
        yield binary
        yield str(os.stat(binary).st_mtime_ns)
    # The launcher puts the configuration folder first on the class path, then every jar.
    yield os.environ.get("SPARK_CONF_DIR", "")
    # As the JVM sees it: the archive records the class path's folders by name.
    yield str(jars)
    yield from sorted(path.name for path in jars.glob("*.jar"))


def _java_bin_path() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    return os.path.join(java_home, "bin") if java_home else None


def main(argv: list[str] | None = None) -> int:
    """`python -m streaming.pipeline.class_archive [--if-missing]`; 1 if no archive was built
    (a session then only starts slower)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if "--if-missing" in (sys.argv[1:] if argv is None else argv) and archive_path().is_file():
        return 0
    try:
        path = build()
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        log.warning("no JVM class archive; sessions start as before: %s", error)
        return 1
    log.info("JVM class archive: %s (%d MB)", path, path.stat().st_size // 2**20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
