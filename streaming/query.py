"""The streaming query: Kafka -> route -> per-key windows (applyInPandasWithState) -> Delta.

Spark is the thin shell here; the semantics live in `parsing` and `windowing`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.state import GroupStateTimeout

from storage.delta_lake import DeltaLake
from storage.sink import MicroBatchSink
from storage.writer_lease import WriterLease
from streaming import kafka_source
from streaming.checkpoint_identity import StreamIdentity, check_checkpoint, claim_checkpoint
from streaming.keyed_state import OUTPUT_SCHEMA, STATE_SCHEMA, make_key_processor
from streaming.routing import KAFKA_COLUMNS_SQL, ROUTED_SCHEMA, make_router
from tenants.config_store import ConfigSnapshots, ConfigWatcher
from tenants.registry import load_registry
from tenants.settings import AppSettings


def read_kafka(spark: SparkSession, settings: AppSettings) -> DataFrame:
    kafka = settings.kafka
    if kafka.source_format == "tw_kafka":
        kafka_source.register(spark)
    reader = (
        spark.readStream.format(kafka.source_format)
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", kafka.topic)
        .option("startingOffsets", kafka.starting_offsets)
        # Executors: the longest read without progress; the driver: the longest offset lookup.
        .option("pollTimeoutMs", str(kafka.broker_timeout_ms))
        .option("fetchOffset.timeoutMs", str(kafka.broker_timeout_ms))
    )
    if kafka.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(kafka.max_offsets_per_trigger))
    return reader.load()


def windowed_rows(
    kafka_records: DataFrame, snapshots: ConfigSnapshots, settings: AppSettings
) -> DataFrame:
    """The union rows of every output table, for one micro-batch of Kafka records."""
    routed = kafka_records.selectExpr(*KAFKA_COLUMNS_SQL).mapInPandas(
        make_router(snapshots, settings.stream.max_record_bytes), ROUTED_SCHEMA
    )
    return routed.groupBy("tenant", "source").applyInPandasWithState(
        make_key_processor(snapshots),
        outputStructType=OUTPUT_SCHEMA,
        stateStructType=STATE_SCHEMA,
        outputMode="append",
        # Idle keys are called back after their `idle_timeout` to advance their watermark.
        timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
    )


CONFIG_POLL_INTERVAL_S = 1.0


def config_snapshots(settings: AppSettings) -> ConfigSnapshots:
    return ConfigSnapshots(f"{settings.stream.checkpoint_dir.rstrip('/')}/tenant_config")


@dataclass(frozen=True)
class RunningStream:
    """A started query and the writer lease it runs under."""

    query: StreamingQuery
    lease: WriterLease

    def stop(self) -> None:
        """Stop the query, then release the stream so the next instance can start at once."""
        self.query.stop()
        self.lease.release()


def start_stream(
    spark: SparkSession,
    settings: AppSettings,
    lake: DeltaLake,
    available_now: bool = False,
) -> RunningStream:
    """Claim the stream and start its query; `conf/` must be valid now, and is re-read later."""
    # A foreign checkpoint, and then a second instance of the stream, stop before any write.
    check_checkpoint(settings.stream.checkpoint_dir, _identity(settings))
    lake.ensure_tables()
    lease = lake.writer_lease(settings.stream)
    writer_epoch = lease.acquire()
    try:
        query = _start_query(spark, settings, lake, writer_epoch, available_now)
    except BaseException:
        lease.release()
        raise
    lease.keep_alive(lambda: query.isActive, on_lost=query.stop)
    return RunningStream(query, lease)


def _start_query(
    spark: SparkSession,
    settings: AppSettings,
    lake: DeltaLake,
    writer_epoch: int,
    available_now: bool,
) -> StreamingQuery:
    claim_checkpoint(settings.stream.checkpoint_dir, _identity(settings))
    snapshots = config_snapshots(settings)
    registry = load_registry(settings.conf_dir)  # an invalid config at start is fatal
    first_start = snapshots.latest_fingerprint() is None
    snapshots.publish(registry, effective_from_ms=0 if first_start else _now_ms())
    watcher = ConfigWatcher(settings.conf_dir, snapshots)
    watcher.refresh(_now_ms())

    rows = windowed_rows(read_kafka(spark, settings), snapshots, settings)
    # Idle timeouts need batches without data, but AvailableNow would then never end: with it,
    # timeouts fire only in batches that have data.
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", str(not available_now).lower())
    sink = MicroBatchSink(
        lake,
        app_id=settings.stream.name,
        writer_epoch=writer_epoch,
        after_batch=lambda _batch_id: _refresh(watcher),
    )
    writer = (
        rows.writeStream.queryName(settings.stream.name)
        .option("checkpointLocation", settings.stream.checkpoint_dir)
        .foreachBatch(sink)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(
            processingTime=f"{settings.stream.trigger_interval_ms} milliseconds"
        )
    query = writer.start()
    # Polled while the query runs, and checked again right after each batch's commits, so a
    # change is in force from the next micro-batch.
    watcher.watch(lambda: query.isActive, interval_s=CONFIG_POLL_INTERVAL_S)
    return query


def _identity(settings: AppSettings) -> StreamIdentity:
    return StreamIdentity(
        stream_name=settings.stream.name, topic=settings.kafka.topic, lake_root=settings.lake.root
    )


def _refresh(watcher: ConfigWatcher) -> None:
    watcher.refresh(_now_ms())


def _now_ms() -> int:
    # Only stamps when a new tenant config takes effect; the data path uses batch timestamps.
    return time.time_ns() // 1_000_000
