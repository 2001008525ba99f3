"""Spark SQL views over the Delta tables, named after the tables.

Without the Delta jars, a view reads exactly the Parquet files of the table's current Delta
snapshot (listed by delta-rs); reading the folder as plain Parquet would also read files Delta
has removed. Where the cluster has delta-spark, `use_delta_spark=True` reads through it.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from storage.delta_lake import DeltaLake
from storage.tables import ALL_TABLES, TableSpec


def register_views(
    spark: SparkSession,
    lake: DeltaLake,
    tenant: str | None = None,
    use_delta_spark: bool = False,
) -> list[str]:
    """Register one temp view per table; with `tenant`, each view holds that tenant's rows only."""
    for spec in ALL_TABLES:
        frame = read_table(spark, lake, spec, use_delta_spark, tenant)
        if tenant is not None:
            frame = frame.where(F.col("tenant") == F.lit(tenant))
        frame.createOrReplaceTempView(spec.name)
    return [spec.name for spec in ALL_TABLES]


def read_table(
    spark: SparkSession,
    lake: DeltaLake,
    spec: TableSpec,
    use_delta_spark: bool = False,
    tenant: str | None = None,
) -> DataFrame:
    """The table's current snapshot; with `tenant`, only the files of that tenant's partitions
    (where the table is partitioned by tenant) are listed, so a scoped query never opens
    another tenant's files. The caller still filters the rows."""
    uri = lake.table_uri(spec)
    if use_delta_spark:
        return spark.read.format("delta").load(uri)
    schema = from_arrow_schema(spec.schema)
    pruned = tenant is not None and "tenant" in spec.partition_by
    partitions = [("tenant", "=", tenant)] if pruned else None
    if not lake.is_local:
        # Spark has no S3 filesystem here (no hadoop-aws jar): read the snapshot with delta-rs
        # and hand Spark the Arrow data. Fine for ad-hoc queries; a cluster with delta-spark
        # and s3a reads at scale with use_delta_spark.
        return spark.createDataFrame(lake.open(spec).to_pyarrow_table(partitions), schema)
    files = lake.open(spec).file_uris(file_pruning_predicate=partitions)
    if not files:
        return spark.createDataFrame([], schema)
    # basePath makes Spark take the partition columns from the Hive-style folder names.
    return spark.read.schema(schema).option("basePath", uri).parquet(*files)
