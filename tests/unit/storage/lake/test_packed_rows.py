"""Union rows packed for their way through Spark come out as they went in."""

from __future__ import annotations

import pyarrow as pa

from storage.lake.packed_rows import PACKED_COLUMN, packed, packed_table, unpacked
from streaming.state.union_rows import OUTPUT_ARROW_SCHEMA, union_table


def _rows(count: int) -> pa.Table:
    return union_table(
        {
            "kind": ["events"] * count,
            "tenant": [f"t{n % 7}" for n in range(count)],
            "source": ["web"] * count,
            "offset": list(range(count)),
            "pane_index": [None if n % 3 else n for n in range(count)],
            "value": [bytes([n % 256]) * (n % 5) for n in range(count)],
        },
        count,
    )


def test_rows_packed_in_several_values_unpack_to_the_same_rows_in_order() -> None:
    rows = _rows(1_000)
    table = packed_table(rows, rows_per_blob=128)
    assert table.num_rows == 8  # ceil(1,000 / 128): a bucket's rows cross as a few values
    batches = table.to_batches(max_chunksize=3)  # Spark may hand them over in any batching
    union = unpacked(iter(batches))
    assert union is not None
    assert union.schema == OUTPUT_ARROW_SCHEMA
    assert union.equals(rows)


def test_no_rows_pack_to_no_values_and_unpack_to_none() -> None:
    assert packed(_rows(0)) == []
    assert unpacked(iter([])) is None
    nulls = pa.record_batch({PACKED_COLUMN: pa.array([None], pa.binary())})
    assert unpacked(iter([nulls])) is None
