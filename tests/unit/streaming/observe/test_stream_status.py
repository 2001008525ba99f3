"""What `status` reads from the lake: the latest row of each key."""

from __future__ import annotations

import pyarrow as pa

from streaming.observe.stream_status import latest_per_key


def test_latest_per_key_takes_each_keys_row_of_its_highest_batch() -> None:
    rows = pa.table(
        {
            "tenant": ["a", "a", "b", "a", "b"],
            "source": ["web", "web", "web", "billing", "web"],
            "watermark": [3, 1, 20, 100, 10],
            "max_event_time": [4, 2, 21, 101, 11],
            "open_windows": [1, 2, 3, 4, 5],
            "on_time_records": [30, 10, 200, 1, 100],
            "late_records": [0, 0, 0, 0, 0],
            "too_late_records": [0, 0, 0, 0, 0],
            "quarantined_records": [0, 0, 0, 0, 0],
            "lifecycle": ["active", "configured", "offboarded", None, "active"],
            "batch_id": [3, 1, 7, 0, 5],
        }
    )
    latest = latest_per_key(rows).to_pylist()
    assert [
        (r["tenant"], r["source"], r["batch_id"], r["watermark"], r["lifecycle"]) for r in latest
    ] == [
        ("a", "billing", 0, 100, None),
        ("a", "web", 3, 3, "active"),
        ("b", "web", 7, 20, "offboarded"),
    ]
