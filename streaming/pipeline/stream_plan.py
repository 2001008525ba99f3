"""The streaming query: Kafka -> route -> per-key windows (applyInPandasWithState) -> sink.

Spark is the thin shell here; the semantics live in `records.parsing` and `windowing`, the wiring in
`app`.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.state import GroupStateTimeout

from streaming.checkpoint.checkpoint_identity import StreamIdentity
from streaming.fault_points import NO_FAULTS, FaultHook
from streaming.kafka.client import KafkaSecurity
from streaming.kafka.deferral import Deferral
from streaming.kafka.source import register as register_tw_kafka
from streaming.pipeline.batch_sink import MicroBatchSink
from streaming.records.routing import KAFKA_COLUMNS_SQL, ROUTED_SCHEMA, make_router
from streaming.state.bucket_placement import BUCKET_COLUMN, bucket_expression
from streaming.state.bucket_processor import KeySummaries, make_bucket_processor
from streaming.state.state_layouts import LAYOUTS
from streaming.state.union_rows import PACKED_OUTPUT_SCHEMA
from tenants.config_store import ConfigSnapshots
from tenants.settings import AppSettings


def read_kafka(
    spark: SparkSession,
    settings: AppSettings,
    fault_hook: FaultHook = NO_FAULTS,
    deferral: Deferral | None = None,
) -> DataFrame:
    """The topic's records; with `deferral` (`tw_kafka` only), those admitted by quota and fair
    share, and the deferred ones released."""
    kafka = settings.kafka
    security = KafkaSecurity.of(kafka)
    if kafka.source_format == "tw_kafka":
        register_tw_kafka(spark, fault_hook, deferral, security)
    reader = (
        spark.readStream.format(kafka.source_format)
        .options(**(security.spark_options() if kafka.source_format == "kafka" else {}))
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", kafka.topic)
        .option("startingOffsets", kafka.starting_offsets)
        # Executors: the longest read without progress; the driver: the longest offset lookup.
        .option("pollTimeoutMs", str(kafka.broker_timeout_ms))
        .option("fetchOffset.timeoutMs", str(kafka.broker_timeout_ms))
    )
    if kafka.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(kafka.max_offsets_per_trigger))
    if kafka.source_format == "tw_kafka":
        reader = reader.option(
            "triggerIntervalMs", str(settings.stream.trigger_interval_ms)
        ).option("triggerPhaseMs", str(settings.stream.effective_trigger_phase_ms))
    return reader.load()


def windowed_rows(
    kafka_records: DataFrame,
    snapshots: ConfigSnapshots,
    settings: AppSettings,
    identity: StreamIdentity,
    fault_hook: FaultHook = NO_FAULTS,
    key_summaries: KeySummaries | None = None,
) -> DataFrame:
    """The union rows of every output table, packed (`storage.lake.packed_rows`), for one
    micro-batch of Kafka records, in the state buckets of the checkpoint's `identity`; each
    bucket reports its keys to `key_summaries`, if given (the metrics)."""
    routed = kafka_records.selectExpr(*KAFKA_COLUMNS_SQL).mapInArrow(
        make_router(snapshots, settings.stream.max_record_bytes), ROUTED_SCHEMA
    )
    assert identity.state_buckets is not None  # `check_checkpoint` settles it
    bucketed = routed.selectExpr(
        "*", bucket_expression(identity.state_buckets, identity.balanced_for_tasks)
    )
    # `check_checkpoint` refuses a layout this version does not read.
    layout = LAYOUTS[identity.state_layout]
    return bucketed.groupBy(BUCKET_COLUMN).applyInPandasWithState(
        make_bucket_processor(
            layout, snapshots, settings.stream.config_recheck_interval_ms, fault_hook, key_summaries
        ),
        outputStructType=PACKED_OUTPUT_SCHEMA,
        stateStructType=layout.schema,
        outputMode="append",
        # A bucket is called back when its first idle key's `idle_timeout` passes, or to look
        # for offboarded keys (`config_recheck_interval`).
        timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
    )


def windowed_stream(
    spark: SparkSession,
    settings: AppSettings,
    snapshots: ConfigSnapshots,
    identity: StreamIdentity,
    fault_hook: FaultHook = NO_FAULTS,
    deferral: Deferral | None = None,
    key_summaries: KeySummaries | None = None,
) -> DataFrame:
    """The query's plan, not started: building it registers the Kafka Data Source and has Spark
    create it in Python, which a standby does while it waits."""
    records = read_kafka(spark, settings, fault_hook, deferral)
    return windowed_rows(records, snapshots, settings, identity, fault_hook, key_summaries)


def start_query(
    rows: DataFrame,
    settings: AppSettings,
    sink: MicroBatchSink,
    available_now: bool,
) -> StreamingQuery:
    """Start `rows` (`windowed_stream`) into `sink`, on the stream's checkpoint and trigger."""
    # Idle timeouts need batches without data, but AvailableNow would then never end: with it,
    # timeouts fire only in batches that have data.
    rows.sparkSession.conf.set(
        "spark.sql.streaming.noDataMicroBatches.enabled", str(not available_now).lower()
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
    return writer.start()
