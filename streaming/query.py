"""The streaming query: Kafka -> route -> per-key windows (applyInPandasWithState) -> Delta.

Spark is the thin shell here; the semantics live in `parsing` and `windowing`.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.state import GroupStateTimeout

from storage.delta_lake import DeltaLake
from storage.sink import MicroBatchSink
from streaming import kafka_source
from streaming.keyed_state import OUTPUT_SCHEMA, STATE_SCHEMA, make_key_processor
from streaming.routing import KAFKA_COLUMNS_SQL, ROUTED_SCHEMA, make_router
from tenants.registry import TenantRegistry
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
    )
    if kafka.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(kafka.max_offsets_per_trigger))
    return reader.load()


def windowed_rows(
    kafka_records: DataFrame, registry: TenantRegistry, settings: AppSettings
) -> DataFrame:
    """The union rows of every output table, for one micro-batch of Kafka records."""
    routed = kafka_records.selectExpr(*KAFKA_COLUMNS_SQL).mapInPandas(
        make_router(registry, settings.stream.max_record_bytes), ROUTED_SCHEMA
    )
    return routed.groupBy("tenant", "source").applyInPandasWithState(
        make_key_processor(registry),
        outputStructType=OUTPUT_SCHEMA,
        stateStructType=STATE_SCHEMA,
        outputMode="append",
        timeoutConf=GroupStateTimeout.NoTimeout,
    )


def start_stream(
    spark: SparkSession,
    settings: AppSettings,
    registry: TenantRegistry,
    lake: DeltaLake,
    available_now: bool = False,
) -> StreamingQuery:
    lake.ensure_tables()
    rows = windowed_rows(read_kafka(spark, settings), registry, settings)
    writer = (
        rows.writeStream.queryName(settings.stream.name)
        .option("checkpointLocation", settings.stream.checkpoint_dir)
        .foreachBatch(MicroBatchSink(lake, app_id=settings.stream.name))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(
            processingTime=f"{settings.stream.trigger_interval_ms} milliseconds"
        )
    return writer.start()
