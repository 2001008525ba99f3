"""Spark really sends balanced bucket numbers evenly over the stateful stage's tasks: the shuffle
that `applyInPandasWithState` plans (hash partitioning by bucket) puts as many buckets in each
task, with the keys of thousands of tenants."""

from __future__ import annotations

from collections import Counter

import pytest
from pyspark.sql import SparkSession

from streaming.state.bucket_placement import BUCKET_COLUMN, bucket_expression

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("buckets", "tasks"), [(16, 4), (64, 4), (12, 8)])
def test_every_task_runs_as_many_buckets(spark: SparkSession, buckets: int, tasks: int) -> None:
    keys = spark.range(20_000).selectExpr(
        "concat('t', id % 10000) AS tenant", "IF(id % 2 = 0, 'web', 'billing') AS source"
    )
    placed = (
        keys.selectExpr("*", bucket_expression(buckets, tasks))
        .repartition(tasks, BUCKET_COLUMN)
        .selectExpr("spark_partition_id() AS task", BUCKET_COLUMN)
        .distinct()
        .collect()
    )
    assert len({row[BUCKET_COLUMN] for row in placed}) == buckets
    per_task = Counter(row.task for row in placed)
    assert len(per_task) == min(tasks, buckets)
    assert max(per_task.values()) - min(per_task.values()) <= 1
