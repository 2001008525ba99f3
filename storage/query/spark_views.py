"""Spark SQL views over the Delta tables, named after the tables, plus `window_contents`.

A tenant's views are the stream's output tables. The operator's also hold `deliveries`, the
notification outbox: its files are shared by every tenant and its rows name their endpoints
(redacted), so it is not part of a tenant's scope.

Without the Delta jars, a view reads exactly the Parquet files of the table's Delta snapshot
(listed by delta-rs); reading the folder as plain Parquet would also read files Delta has
removed. Where the cluster has delta-spark, `use_delta_spark=True` reads through it.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from storage.lake.delta_lake import DeltaLake
from storage.lake.snapshot_reader import partition_columns, read_snapshot
from storage.lake.table_files import tenant_files
from storage.lake.tables import ALL_TABLES, DELIVERIES, EVENTS, LAKE_TABLES, WINDOWS, TableSpec
from storage.query.view_catalog import (
    WINDOW_CONTENTS,
    TableVersionError,
    check_version,
    lake_not_written,
)


def register_views(
    spark: SparkSession,
    lake: DeltaLake,
    tenant: str | None = None,
    use_delta_spark: bool = False,
    versions: Mapping[str, int] | None = None,
) -> dict[str, DataFrame]:
    """Register one temp view per table and `window_contents`; with `tenant`, each view holds
    that tenant's rows only. `versions` reads a table at that Delta version instead of its
    current one (time travel). Returns the views' frames by name."""
    tables = ALL_TABLES if tenant is not None else LAKE_TABLES
    unknown = set(versions or {}) - {spec.name for spec in tables}
    if unknown:
        raise TableVersionError(
            f"no table named {', '.join(sorted(unknown))}; the tables are "
            f"{', '.join(spec.name for spec in tables)}"
        )
    frames: dict[str, DataFrame] = {}
    for spec in tables:
        version = (versions or {}).get(spec.name)
        try:
            frame = read_table(spark, lake, spec, use_delta_spark, tenant, version)
        except TableNotFoundError:
            if spec is not DELIVERIES:
                raise lake_not_written(lake.root, spec) from None
            # A lake last written by a release without notifications: nothing was delivered.
            frame = spark.createDataFrame([], from_arrow_schema(spec.schema))
        if tenant is not None:
            frame = frame.where(F.col("tenant") == F.lit(tenant))
        frames[spec.name] = frame
    frames[WINDOW_CONTENTS] = window_contents(frames[WINDOWS.name], frames[EVENTS.name])
    for name, frame in frames.items():
        frame.createOrReplaceTempView(name)
    return frames


def read_table(
    spark: SparkSession,
    lake: DeltaLake,
    spec: TableSpec,
    use_delta_spark: bool = False,
    tenant: str | None = None,
    version: int | None = None,
) -> DataFrame:
    """The table's current snapshot, or the one at `version`; with `tenant`, only the files that
    may hold that tenant's rows are listed (`table_files.tenant_files`: its partition and
    the staged files its statistics do not rule out), so a scoped query never opens another
    tenant's settled files. The caller still filters the rows."""
    uri = lake.table_uri(spec)
    if use_delta_spark:
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(uri).select(*spec.schema.names)
    table = lake.open(spec)
    if version is not None:
        check_version(spec, table.version(), version)
        table.load_as_version(version)
    files = table.file_uris() if tenant is None else tenant_files(table, tenant)
    schema = from_arrow_schema(spec.schema)
    if not lake.is_local:
        # Spark has no S3 filesystem here (no hadoop-aws jar): read the snapshot with pyarrow
        # and hand Spark the Arrow data. Fine for ad-hoc queries; a cluster with delta-spark
        # and s3a reads at scale with use_delta_spark.
        rows = read_snapshot(table, spec.schema, lake.storage_options, files=files)
        return spark.createDataFrame(rows, schema)
    if not files:
        return spark.createDataFrame([], schema)
    # The partition columns (the table's own: this release's layout columns, or `tenant` in a
    # lake from before it) are named in the schema so that Spark takes them from the
    # Hive-style folder names under basePath; the view shows the rows' own columns only.
    layout = [f for f in partition_columns(table) if f.name not in spec.schema.names]
    read_schema = from_arrow_schema(pa.schema([*spec.schema, *layout]))
    frame = spark.read.schema(read_schema).option("basePath", uri).parquet(*files)
    return frame.select(*spec.schema.names)


def window_contents(windows: DataFrame, events: DataFrame) -> DataFrame:
    """Each emitted pane with the records it counts, one row per (pane, record).

    Panes count cumulatively from the window's first record (contract §4): an `events` row carries
    the pane it was first counted in, so pane P of a window holds the window's records with
    `pane_index <= P`. A session that absorbed others (`merged_window_ids`) also holds their
    records, which keep their own `window_id` and pane numbering. For a discarding window the
    pane's own new records are those with `record_window_id = window_id AND record_pane_index =
    pane_index`.
    """
    pane = windows.alias("pane")
    record = events.alias("record")
    own = (F.col("record.window_id") == F.col("pane.window_id")) & (
        F.col("record.pane_index") <= F.col("pane.pane_index")
    )
    absorbed = F.array_contains(F.col("pane.merged_window_ids"), F.col("record.window_id"))
    same_key = (F.col("record.tenant") == F.col("pane.tenant")) & (
        F.col("record.source") == F.col("pane.source")
    )
    return pane.join(record, same_key & (own | absorbed), "inner").select(
        *(
            F.col(f"pane.{name}")
            for name in ("tenant", "source", "window_id", "window_start", "window_end")
        ),
        F.col("pane.window_date"),
        F.col("pane.pane_index"),
        F.col("pane.timing").alias("pane_timing"),
        F.col("pane.is_final"),
        F.col("pane.count").alias("pane_count"),
        F.col("record.window_id").alias("record_window_id"),
        F.col("record.pane_index").alias("record_pane_index"),
        F.col("record.timing").alias("record_timing"),
        F.col("record.event_time"),
        F.col("record.event_id"),
        F.col("record.topic"),
        F.col("record.partition"),
        F.col("record.offset"),
        F.col("record.payload"),
        F.col("record.batch_id").alias("record_batch_id"),
    )
