"""Bucket numbers that Spark's hash partitioning spreads evenly over the stateful tasks
(`bucket_placement`). That Spark really sends them so: tests/integration/pipeline/
test_bucket_placement.py."""

from __future__ import annotations

from collections import Counter

import pytest

from streaming.state.bucket_placement import (
    balanced_bucket_ids,
    bucket_expression,
    spark_hash_long,
    spark_partition,
)

# `SELECT hash(CAST(v AS BIGINT))` in Spark 4.2.
SPARK_HASHES = {
    0: -1670924195,
    1: -1712319331,
    5: 1607884268,
    63: -1903872750,
    -1: -939490007,
    2**40 + 7: 995648648,
    -(2**63): -853646085,
    2**63 - 1: -1604625029,
}


def test_the_hash_is_sparks() -> None:
    assert {value: spark_hash_long(value) for value in SPARK_HASHES} == SPARK_HASHES


@pytest.mark.parametrize(("buckets", "tasks"), [(16, 4), (64, 4), (10, 4), (32, 8), (7, 1)])
def test_each_task_gets_as_many_buckets_as_any_other(buckets: int, tasks: int) -> None:
    ids = balanced_bucket_ids(buckets, tasks)
    assert len(set(ids)) == buckets
    per_task = Counter(spark_partition(bucket, tasks) for bucket in ids)
    assert max(per_task.values()) - min(per_task.values()) <= 1
    assert sum(per_task.values()) == buckets and len(per_task) == min(buckets, tasks)


def test_numbers_taken_as_they_are_land_unevenly_which_is_why() -> None:
    per_task = Counter(spark_partition(bucket, 4) for bucket in range(16))
    assert max(per_task.values()) > 4


def test_a_checkpoint_from_before_keeps_its_buckets_numbered_by_slot() -> None:
    assert bucket_expression(64, None) == "pmod(xxhash64(tenant, source), 64) AS bucket"
    balanced = bucket_expression(16, 4)
    assert balanced.startswith("element_at(array(")
    assert "pmod(xxhash64(tenant, source), 16)" in balanced
