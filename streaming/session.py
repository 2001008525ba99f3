"""The one SparkSession factory: loopback only, with the settings ENVIRONMENT.md measured."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

LOOPBACK = "127.0.0.1"


def build_spark(
    app_name: str = "tenant-windows",
    master: str | None = None,
    shuffle_partitions: int = 4,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """Build (or return the running) session.

    `master=None` keeps what spark-submit gave; without spark-submit it is `local[2]`.
    """
    # Without these Spark binds to the machine's first interface and the Python workers may
    # start another interpreter that lacks pyarrow.
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # PySpark's own pandas serializer trips a pandas FutureWarning on every group; it says
    # nothing about this project's data and drowns real warnings in the workers' stderr.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    builder = SparkSession.builder.appName(app_name)
    if master is None and not _under_spark_submit():
        master = "local[2]"
    if master is not None:
        builder = builder.master(master)
    conf = {
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        # A deep stack avoids a StackOverflowError when a streaming query stops.
        "spark.driver.extraJavaOptions": "-Xss16m",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # Frozen into the checkpoint: the number of state-store partitions for good.
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # AvailableNow with state otherwise keeps asking for empty batches.
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.sql.adaptive.enabled": "false",
    }
    conf.update(extra_conf or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ
