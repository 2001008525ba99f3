"""The test session is a local one, built as the stream builds its own (`build_spark`)."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.integration


def _pyspark_file(_: object) -> str:
    import pyspark

    return pyspark.__file__ or ""


def test_spark_python_processes_import_the_installed_pyspark_not_its_zip(spark: Any) -> None:
    import pyspark

    # A module imported from a zip is compiled from source in every process that imports it.
    imported_from = spark.sparkContext.parallelize([0], 1).map(_pyspark_file).collect()
    assert imported_from == [pyspark.__file__]
    assert ".zip" not in imported_from[0]


def _arrow_pool(_: object) -> str:
    import pyarrow as pa

    return pa.default_memory_pool().backend_name


def test_python_workers_and_the_driver_allocate_arrow_buffers_with_the_system_allocator(
    spark: Any,
) -> None:
    # Workers outlive every task: Arrow's own pool kept each one's largest task's memory for
    # good (`streaming.pipeline.native_allocators`).
    pools = spark.sparkContext.parallelize([0, 1], 2).map(_arrow_pool).collect()
    assert pools == ["system", "system"]
    # And the driver, which read the variable before the session set it.
    assert _arrow_pool(None) == "system"
