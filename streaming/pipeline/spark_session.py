"""The one SparkSession factory: loopback by default, local or on a cluster, with the settings
ENVIRONMENT.md measured."""

from __future__ import annotations

import os
import sys

import pyarrow as pa
from pyspark.sql import SparkSession

from streaming.pipeline import class_archive
from streaming.pipeline.native_allocators import ALLOCATOR_ENV, use_long_lived_allocators
from streaming.pipeline.spark_home import session_jars, session_spark_home, spark_home

LOOPBACK = "127.0.0.1"

# A deep stack avoids a StackOverflowError when a streaming query stops.
DRIVER_JAVA_OPTIONS = "-Xss16m"
# The stream's JIT stops at C1 (`quick_jit`): up to a start's first batch, C2 compiled for 6-7 of
# the driver JVM's 16-18 CPU seconds (C1 2.5, GC 0.5), on two cores as much as all the start's
# Python processes together; with C1 alone the JVM took 7.5-9 and a restart after SIGKILL
# 52-65 s against 75-76 s at a load average of 25 (docs/reliability.md, "Start-up time"). A
# local stream's per-record work is in its Python workers.
QUICK_JIT = "-XX:TieredStopAtLevel=1"


def build_spark(
    app_name: str = "tenant-windows",
    master: str | None = None,
    shuffle_partitions: int = 4,
    extra_conf: dict[str, str] | None = None,
    quick_jit: bool = False,
) -> SparkSession:
    """Build (or return the running) session; `quick_jit` for the stream's, whose restart
    time counts (`QUICK_JIT`).

    `master=None` keeps what spark-submit gave; without spark-submit it is `local[N]`
    (`session_master`). On a cluster master (`spark://`, `k8s://`, `yarn`) the executors run
    their node's `python3`, or `PYSPARK_PYTHON` if set, and what they import is shipped through
    `extra_conf`.
    """
    master = session_master(master)
    spark_environment(master)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    # Decided once: the class archive must name the class path the JVM then starts with.
    home = session_spark_home()
    conf = {
        "spark.driver.extraJavaOptions": " ".join(
            option
            for option in (
                DRIVER_JAVA_OPTIONS,
                QUICK_JIT if quick_jit else "",
                class_archive.java_options(jars=session_jars(home)),
            )
            if option
        ),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # Frozen into the checkpoint: the number of state-store partitions for good.
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # AvailableNow with state otherwise keeps asking for empty batches.
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.sql.adaptive.enabled": "false",
        # What the driver keeps of finished work for the UI and its REST API. Kept with the UI
        # off too, and the stream adds two SQL executions, a job or two and their stages and
        # tasks every micro-batch: by default the driver's heap grows until 1,000 executions,
        # 1,000 jobs and 1,000 stages are held (minutes at a 1 s trigger), and with it the JVM's
        # memory. The last few are all a stream's UI needs; more is `extra_conf`'s to ask for.
        "spark.sql.ui.retainedExecutions": "50",
        "spark.ui.retainedJobs": "100",
        "spark.ui.retainedStages": "100",
        "spark.ui.retainedTasks": "10000",
    }
    if master is not None:
        local_ip = os.environ["SPARK_LOCAL_IP"]  # `spark_environment` says why
        conf["spark.driver.host"] = local_ip
        conf["spark.driver.bindAddress"] = local_ip
    if master is not None and is_local_master(master):
        # Workers forked with the batch's modules already imported (`worker_daemon`). Only in
        # this process's JVM: a cluster's executors may not have the project when their daemon
        # starts.
        conf["spark.python.daemon.module"] = "streaming.pipeline.worker_daemon"
    if master is None or not is_local_master(master):
        # Executors elsewhere do not inherit this process's environment.
        for name in ("PYTHONWARNINGS", *ALLOCATOR_ENV):
            conf[f"spark.executorEnv.{name}"] = os.environ[name]
    conf.update(extra_conf or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    with spark_home(home):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


LOCAL_SLOTS_PER_CORE = 2
"""Task slots a local session runs per core it may use. A task is a JVM thread that feeds a
Python worker through a pipe and reads its answer back, so with one slot a core the core idles
whenever a task waits on its worker, and at the end of every stage whose tasks are uneven (a
few tenants' keys fill a few state buckets). On 2 cores, 4 slots ran the 10-tenant stream 8 %
faster and the 100,000-tenant one a third faster than 2 (`docs/sizing.md`)."""


def session_master(master: str | None) -> str | None:
    """`master`, or `local[N]` when none is given outside spark-submit (None: spark-submit's),
    N = `LOCAL_SLOTS_PER_CORE` a core this process may run on."""
    if master is None and not _under_spark_submit():
        return f"local[{LOCAL_SLOTS_PER_CORE * _usable_cores()}]"
    return master


def _usable_cores() -> int:
    """The cores this process may run on (`taskset` narrows them); where the system cannot say
    (`sched_getaffinity` is Linux's), the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def spark_environment(master: str | None) -> None:
    """Set what the session's JVM and Python workers start with, where the user has not.

    Call it before starting threads: a thread that changes the environment while another
    reads it (delta-rs's, a Kafka client's) can crash the process, a `putenv` beside a `getenv`
    (a stream's start once died so, SIGSEGV in `strlen`). Once set, a second call changes
    nothing."""
    master = session_master(master)
    if master is None or is_local_master(master):
        # Local Python workers would otherwise start another interpreter, one that lacks
        # pyarrow. Under spark-submit the launcher sets it (`infra/cluster/submit.sh`).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    elif "PYSPARK_PYTHON" not in os.environ:
        _run_python_workers_as_python3()
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # PySpark's own pandas serializer trips a pandas FutureWarning on every group; it says
    # nothing about this project's data and drowns real warnings in the workers' stderr.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    if master is not None:
        # A JVM this process starts binds to the machine's first interface otherwise. A driver
        # that executors on other machines must reach is started with SPARK_LOCAL_IP set to
        # its routable address; under spark-submit the launcher's settings decide.
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    use_long_lived_allocators()
    if os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "system":
        # A process that allocated before this call (a test calling `run_stream`) keeps its C++
        # default pool; its Python-level default at least follows.
        pa.set_memory_pool(pa.system_memory_pool())


def session_cores(spark: SparkSession) -> int:
    """The cores the session's tasks run on (`task_cores`). Asked when needed: a cluster's
    executors may register after the session starts."""
    context = spark.sparkContext
    assert context.master is not None  # a running context has one
    return task_cores(context.master, context.defaultParallelism)


def task_cores(master: str, slots: int) -> int:
    """The cores under a session's `slots` task slots. A local session's slots run on the
    cores this process may use, and may outnumber them (the default master runs
    `LOCAL_SLOTS_PER_CORE` a core); a cluster's executors run a task a core."""
    if is_local_master(master):
        return max(1, min(slots, _usable_cores()))
    return slots


def is_local_master(master: str) -> bool:
    """Whether executors run inside the driver's JVM, with the driver's Python at hand."""
    return master == "local" or master.startswith("local[")


def _run_python_workers_as_python3() -> None:
    """Executors on a cluster node run `python3` from the node's PATH, PySpark's default: this
    interpreter's path means nothing there. The driver starts Python workers by the same name
    (the Kafka source's offset planning runs on the driver), so `python3` on the driver's PATH
    must be this interpreter, which has the project's dependencies."""
    own_bin = os.path.dirname(sys.executable)
    if os.path.exists(os.path.join(own_bin, "python3")):
        path = os.environ.get("PATH", "")
        os.environ["PATH"] = os.pathsep.join(filter(None, [own_bin, path]))
    os.environ["PYSPARK_PYTHON"] = "python3"


def _under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ
