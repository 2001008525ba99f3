"""Read a stream's Delta tables back as comparable snapshots, and check what landed where.

A crashed, stopped or faulted run must end with the tables of a run without the fault; these
compare them, and check that every produced record landed exactly once.
"""

from __future__ import annotations

from collections import Counter

import pandas as pd

from storage.lake.tables import ALL_TABLES
from tests.support.pipeline_harness import Pipeline

# Batch timestamps of the batches after a crash differ from the clean run's: not comparable.
WALL_CLOCK_COLUMNS = {"processing_time", "last_record_processing_time"}


def snapshot(pipeline: Pipeline) -> dict[str, pd.DataFrame]:
    """Every table as a multiset of rows, without wall-clock columns."""
    tables = {}
    for spec in ALL_TABLES:
        frame = pipeline.table(spec.name)
        frame = frame.drop(columns=[c for c in frame.columns if c in WALL_CLOCK_COLUMNS])
        # A multiset of rows: sort by every column, as text so maps and lists compare too.
        as_text = frame.astype(str)
        tables[spec.name] = as_text.sort_values(list(as_text.columns)).reset_index(drop=True)
    return tables


def table_versions(pipeline: Pipeline) -> dict[str, int]:
    lake = pipeline.lake
    return {spec.name: lake.open(spec).version() for spec in ALL_TABLES}


def assert_every_record_landed_once(pipeline: Pipeline) -> None:
    """Each produced (partition, offset) is in exactly one row of events, late_events or
    quarantine (the sample config's windows are tumbling: one window per record)."""
    landed: Counter[tuple[int, int]] = Counter()
    for name in ("events", "late_events", "quarantine"):
        frame = pipeline.table(name)
        landed.update(zip(frame["partition"].astype(int), frame["offset"].astype(int), strict=True))
    duplicated = {coordinates: n for coordinates, n in landed.items() if n > 1}
    assert not duplicated, f"records landed more than once: {sorted(duplicated)[:10]}"
    assert set(landed) == pipeline.produced_coordinates()


def assert_same_tables(
    actual: dict[str, pd.DataFrame], expected: dict[str, pd.DataFrame], what: str = "table {}"
) -> None:
    """Each frame of `expected` equals `actual`'s of the same name; a difference names the
    frame as `what` with the name filled in."""
    for name, frame in expected.items():
        pd.testing.assert_frame_equal(actual[name], frame, obj=what.format(name))
