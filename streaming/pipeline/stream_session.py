"""The Spark session a stream runs in, and its start in a thread of its own.

A start is on the clock of every restart after a crash. Its JVM takes 2-3 s to launch and build
the session, and the stream's own modules take most of a second to import, on one core: so the
command line starts the session first, from this module, which imports none of them, and imports
the rest while the JVM starts (`start_stream_session`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from storage.upkeep.work_thread import WorkThread
from streaming.pipeline.spark_session import build_spark, spark_environment
from tenants.settings import AppSettings

COMPACTION_POOL = "compaction"
"""The FAIR scheduler pool of compaction jobs; the batches' jobs stay in Spark's `default`."""
BATCHES_MIN_SHARE = 1_000_000
"""More cores than any cluster has: the `default` pool always comes first for a free core."""
# How long the stop waits for state store maintenance in flight (`process.stop_spark`), then for
# it to give in to an interrupt: 300 s and 60 s by default. Maintenance cut short costs nothing
# (the next start runs it again); an interrupted one may print a Java trace, so the first wait is
# long enough for a snapshot to finish.
STATE_STORE_STOP_CONF = {
    "spark.sql.streaming.stateStore.maintenanceShutdownTimeout": "10s",
    "spark.sql.streaming.stateStore.maintenanceForceShutdownTimeout": "1s",
}

StartingSession = WorkThread[tuple[SparkSession, float]]
"""A stream's session being started: the session, and the seconds its start took."""


def start_stream_session(
    settings: AppSettings,
    master: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
) -> StartingSession:
    """Start `stream_session` in a thread of its own. The environment is set first, in the
    caller's thread, while no other thread reads it (`spark_environment`)."""
    spark_environment(master)

    def timed() -> tuple[SparkSession, float]:
        started = time.monotonic()
        spark = stream_session(settings, master, spark_conf)
        return spark, time.monotonic() - started

    return WorkThread(timed, "spark-session")


def stream_session(
    settings: AppSettings,
    master: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """The session a stream runs in: its scheduler pools, a JIT that stops at C1
    (`spark_session.QUICK_JIT` says why), and a state store that stops within seconds
    (`STATE_STORE_STOP_CONF`)."""
    # Spark reads the scheduler pools' file when the session starts: it need not outlive it.
    with tempfile.TemporaryDirectory(prefix="tw-run-") as pools_dir:
        return build_spark(
            settings.stream.name,
            master,
            settings.stream.shuffle_partitions,
            {**scheduler_conf(Path(pools_dir)), **STATE_STORE_STOP_CONF, **(spark_conf or {})},
            quick_jit=True,
        )


def scheduler_conf(directory: Path) -> dict[str, str]:
    """Spark settings for a stream's session: FAIR scheduling in which the batches' pool always
    gets a free core first and compaction takes the rest. Spark reads the allocation file,
    written to `directory`, once, when the session starts."""
    path = directory / "stream-pools.xml"
    path.write_text(
        '<?xml version="1.0"?>\n<allocations>\n'
        f'  <pool name="default"><schedulingMode>FIFO</schedulingMode><weight>1</weight>'
        f"<minShare>{BATCHES_MIN_SHARE}</minShare></pool>\n"
        f'  <pool name="{COMPACTION_POOL}"><schedulingMode>FIFO</schedulingMode>'
        "<weight>1</weight><minShare>0</minShare></pool>\n"
        "</allocations>\n",
        encoding="utf-8",
    )
    return {"spark.scheduler.mode": "FAIR", "spark.scheduler.allocation.file": str(path)}
