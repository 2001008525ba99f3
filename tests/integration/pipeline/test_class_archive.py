"""The class archive fits this Java and this class path: a JVM told to use it or fail starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streaming.pipeline import class_archive

pytestmark = pytest.mark.integration

SESSION_WITH_ARCHIVE_OR_FAIL = """
import sys
from streaming.pipeline.spark_session import build_spark
spark = build_spark("archive-check", master="local[1]", extra_conf={
    "spark.driver.extraJavaOptions": "-Xss16m -Xshare:on -XX:SharedArchiveFile=" + sys.argv[1],
})
print(spark.range(5).count())
spark.stop()
"""


def test_sessions_map_the_archive_setup_built() -> None:
    path = class_archive.archive_path()
    if not path.is_file():  # infra/setup.sh builds it; a bare checkout builds it here
        class_archive.build()
    # -Xshare:on: a JVM that cannot map the archive (another Java, another class path) exits.
    started = subprocess.run(
        [sys.executable, "-c", SESSION_WITH_ARCHIVE_OR_FAIL, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert started.returncode == 0, started.stderr[-2000:]
    assert started.stdout.strip().splitlines()[-1] == "5"
    assert f"-XX:SharedArchiveFile={path}" in class_archive.java_options()
