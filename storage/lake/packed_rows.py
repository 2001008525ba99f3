"""Union rows packed as Arrow IPC blobs, for their way through Spark from the stateful stage to
the sink's writer.

Both ends are Python: the state function builds the union rows as an Arrow table, and the
writer (`file_writer.write_task_files`) reads them as one. Handed over column by column, every
row would cross twice (pandas to Arrow to Spark's rows in the JVM, and back to Arrow for
`mapInArrow`), converted field by field in each direction, though Spark never looks inside
them. Packed, Spark carries a few binary values per bucket call instead: a copy, not a
conversion. At 100,000 tenants a batch has a `tenant_status` row per key, so this cost grew with
the tenants (docs/scale.md).

Runs on executors: pyarrow only.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

PACKED_COLUMN = "union_rows_ipc"
"""The one column Spark sees: an Arrow IPC stream of union rows per value."""
ROWS_PER_BLOB = 16_384
"""Rows per packed value: a bucket's batch of any size stays well inside what one Spark value
and one Arrow buffer take (a few MB here, against their 2 GB)."""


def packed(table: pa.Table, rows_per_blob: int = ROWS_PER_BLOB) -> list[bytes]:
    """`table` as Arrow IPC streams of at most `rows_per_blob` rows; none for an empty table."""
    blobs = []
    for start in range(0, table.num_rows, rows_per_blob):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(start, rows_per_blob))
        blobs.append(sink.getvalue().to_pybytes())
    return blobs


def packed_table(table: pa.Table, rows_per_blob: int = ROWS_PER_BLOB) -> pa.Table:
    """`packed` as the one-column table Spark carries."""
    return pa.table({PACKED_COLUMN: pa.array(packed(table, rows_per_blob), pa.binary())})


def unpacked(batches: Iterable[pa.RecordBatch]) -> pa.Table | None:
    """The union rows in `batches` of packed values, in order; None when there are none."""
    tables = [
        # `as_buffer` reads the blob where it lies, without copying it into a Python object.
        pa.ipc.open_stream(blob.as_buffer()).read_all()
        for batch in batches
        for blob in batch.column(PACKED_COLUMN)
        if blob.is_valid
    ]
    if not tables:
        return None
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
