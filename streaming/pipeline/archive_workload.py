"""What the class archive's JVM runs: a streaming query shaped like the product's, briefly.

`python -m streaming.pipeline.archive_workload ARCHIVE WORKDIR` (`class_archive.build` runs it).
The classes the product's driver loads come from the same Spark paths: a Python stream reader,
`mapInArrow`, a shuffle into `applyInPandasWithState` with a processing-time timeout, and a
`foreachBatch` that collects from `mapInArrow`. Two micro-batches of a read limit, then the JVM
exits and writes the archive.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from streaming.pipeline.class_archive import QUIET
from streaming.pipeline.spark_session import build_spark

BATCHES = 2
ROWS_PER_BATCH = 8


class _CountingSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tw_archive_workload"

    def schema(self) -> str:
        return "key string, value long"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802 (Spark's API)
        return _CountingReader()


class _CountingReader(DataSourceStreamReader):
    def initialOffset(self) -> dict[str, int]:  # noqa: N802
        return {"rows": 0}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(ROWS_PER_BATCH)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        # The product's reader takes the same path: a limited read, a batch at a time.
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else ROWS_PER_BATCH
        return {"rows": min(start["rows"] + rows, BATCHES * ROWS_PER_BATCH)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [InputPartition((start["rows"], end["rows"]))]

    def read(self, partition: InputPartition) -> Iterator[tuple[str, int]]:
        first, last = partition.value
        for number in range(first, last):
            yield (f"k{number % 3}", number)


def _route(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        doubled = pc.multiply(batch.column("value"), 2)
        yield pa.RecordBatch.from_arrays([batch.column("key"), doubled], ["key", "value"])


def _count(
    key: tuple[str], frames: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    seen = (state.get[0] if state.exists else 0) + sum(len(frame) for frame in frames)
    state.update((seen,))
    state.setTimeoutDuration(60_000)
    yield pd.DataFrame({"key": [key[0]], "seen": [seen]})


def _files(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


def _sink(batch: DataFrame, _batch_id: int) -> None:
    batch.mapInArrow(_files, "rows long").collect()


def main(archive: str, workdir: str) -> None:
    spark = build_spark(
        "tenant-windows class archive",
        extra_conf={
            "spark.driver.extraJavaOptions": f"-Xss16m -XX:ArchiveClassesAtExit={archive} {QUIET}"
        },
    )
    spark.dataSource.register(_CountingSource)
    counts = (
        spark.readStream.format(_CountingSource.name())
        .load()
        .mapInArrow(_route, "key string, value long")
        .groupBy("key")
        .applyInPandasWithState(
            _count,
            outputStructType="key string, seen long",
            stateStructType="seen long",
            outputMode="append",
            timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
        )
    )
    query = (
        counts.writeStream.option("checkpointLocation", f"{workdir}/checkpoint")
        .foreachBatch(_sink)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(timeout=120)
    query.stop()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
