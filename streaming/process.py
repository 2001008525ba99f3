"""The stream's process around its query: stop signals, Spark's log levels, outages, shutdown.

`run_stream` (`streaming.app`) wires the application; what the process does around it lives
here: a first SIGTERM/SIGINT asks for a graceful stop and a second one for a stop now
(`StopSignals`), Spark's own log lines that only repeat what the stream reports are quieted
(`quiet_failure_logs`), a failed query caused by an outage is told as one line
(`outage_cause`), and the query and the session stop without a Java trace (`quiet_stopping`,
`stop_spark`).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from pyspark.sql import SparkSession

from storage.lake.s3_options import LakeUnavailableError
from streaming.kafka.client import KafkaUnavailableError

log = logging.getLogger(__name__)

# A failed query caused by one of these is an outage, not a bug: its own one line says what
# failed and what to do, and the Python and Java frames around it say nothing more.
OUTAGES: tuple[type[Exception], ...] = (KafkaUnavailableError, LakeUnavailableError)
# Spark logs a query's failure with Java frames as it happens; `run_stream` reports the failure
# itself when the query ends, so that log only repeats it. Failed tasks keep their warnings:
# on a cluster a retried task is news the operator needs, outage or not.
SPARK_FAILURE_LOGGERS = ("org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",)
# What a stop interrupts logs a Java trace, though nothing is lost (the interrupted batch is
# replayed on the next start): every state store class (`StateStore`, and the providers, e.g.
# `HDFSBackedStateStoreProvider`, whose maintenance logs "Error doing snapshots" when the session
# stops under it), and Hadoop's shell commands, which the checkpoint's local file system runs
# (its "Interrupted while joining" when the query's stop interrupts a batch that just began),
# and a killed task's completion listeners (the state store's abort of its version, cut short).
# The RPC environment, as the session stops, may log a message it could no longer send as an
# "Ignored failure" (`RejectedExecutionException` from its timeout scheduler, already shut down).
STOPPING_LOGGERS = (
    "org.apache.spark.sql.execution.streaming.state",
    "org.apache.hadoop.util.Shell",
    "org.apache.spark.TaskContextImpl",
    "org.apache.spark.rpc.netty.NettyRpcEnv",
)
# py4j's callback server logs every error `foreachBatch` raises, with its Java trace. A stop that
# lands while a batch waits for a Spark job interrupts that wait (`InterruptedException`), which
# Spark takes for the stop it is; the error itself reaches Spark either way, and a batch that
# fails for any other reason as the stream stops is told by `StreamApp.stop`.
CALLBACK_LOGGER = "py4j.clientserver"


class StopSignals:
    """SIGTERM and SIGINT as two flags: the first sets `requested` (stop once the batch in
    progress is committed, at most `grace_s`), a second one `now` (stop at once).

    The handler only sets flags: stopping the query inside it would interrupt the py4j call
    the main thread is blocked in.
    """

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.requested = threading.Event()
        self.now = threading.Event()

    def install(self) -> StopSignals:
        """Handle SIGTERM and SIGINT in this (the main) thread from now on."""
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.requested.is_set():
            log.info("signal %d again: stopping the stream now", signum)
            self.now.set()
            return
        log.info(
            "signal %d: stopping the stream once the batch in progress is committed (at most "
            "%.0fs; a second signal stops it now)",
            signum,
            self.grace_s,
        )
        self.requested.set()


def quiet_failure_logs(spark: SparkSession) -> None:
    """Silence Spark's own report of a failed query: `run_stream` reports it when it ends."""
    _set_spark_log_level(spark, SPARK_FAILURE_LOGGERS, "OFF")


@contextmanager
def quiet_stopping(spark: SparkSession) -> Iterator[None]:
    """Around the query's and the session's stop: what the stop interrupts says nothing
    (`STOPPING_LOGGERS`, `CALLBACK_LOGGER`); py4j's logger speaks again after it, for a later
    session in this process.

    Never raises of its own: the stop inside (the lease's release above all) must run even if
    the driver's JVM is gone.
    """
    callback_logger = logging.getLogger(CALLBACK_LOGGER)
    level = callback_logger.level
    callback_logger.setLevel(logging.CRITICAL)
    try:
        _set_spark_log_level(spark, STOPPING_LOGGERS, "OFF")
    except Exception as error:  # only a quieter stop is at stake
        log.debug("the stop's loggers were not quieted: %s", error)
    try:
        yield
    finally:
        callback_logger.setLevel(level)


def stop_spark(spark: SparkSession) -> None:
    """Stop the session after its queries stopped (inside `quiet_stopping`), without a Java trace.

    State store maintenance runs in a background pool of the driver's JVM. Stopped first, it
    cannot race the session's stop: otherwise a snapshot it takes as the RPC environment goes
    away fails and logs a 27-line trace (`RpcEnvStoppedException`). A maintenance skipped at
    exit costs nothing: the next start runs it again.

    The pool is stopped before the state store, not by it: Spark's `StateStore.stop()` holds the
    providers' lock while it waits for the pool, and maintenance in flight waits for that lock,
    so a stop that landed as maintenance ran waited out both of the pool's timeouts
    (`stream_session.STATE_STORE_STOP_CONF`; a SIGTERM once took over 300 s so), then printed
    the interrupted task's trace.
    """
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a classic session: the driver's JVM is at hand
    # Scala's `object StateStore`.
    state_store = jvm.org.apache.spark.sql.execution.streaming.state.StateStore
    try:
        # Waits for the maintenance in flight, which may take the providers' lock meanwhile.
        state_store.stopMaintenanceTaskWithoutLock()
        # Unloads every provider; no maintenance is left to wait for.
        state_store.stop()
    except Exception as error:  # only a quieter exit is at stake
        log.debug("state store maintenance not stopped before the session: %s", error)
    spark.stop()


def outage_cause(failure: str, outages: tuple[type[Exception], ...] = OUTAGES) -> str | None:
    """The one line of a failed query's error (`failure`: Spark's text, Python tracebacks and
    Java frames inside) that states an outage, as `Class: message`; None if no outage caused
    it. The last such line is the outermost error of the last traceback: the one raised."""
    names = {
        f"{kind.__module__}.{kind.__qualname__}": kind.__name__
        for outage in outages
        for kind in _with_subclasses(outage)
    }
    cause = None
    for line in failure.splitlines():
        qualified, separator, message = line.partition(": ")
        if separator and qualified in names:
            cause = f"{names[qualified]}: {message}"
    return cause


def _with_subclasses(kind: type[Exception]) -> list[type[Exception]]:
    return [kind, *(sub for direct in kind.__subclasses__() for sub in _with_subclasses(direct))]


def _set_spark_log_level(spark: SparkSession, loggers: tuple[str, ...], level: str) -> None:
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a classic session: the driver's JVM is at hand
    log4j_level = jvm.org.apache.logging.log4j.Level.getLevel(level)
    for logger in loggers:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(logger, log4j_level)
