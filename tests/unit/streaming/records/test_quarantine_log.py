"""Quarantined records are summarised in the log: one bounded line per batch, rate-limited.

These drive `QuarantineLog` over real Parquet files in a temporary lake, with a clock the test
sets; tests/integration/pipeline/test_quarantine_log.py runs the real stream on 5,000 malformed
records.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import QUARANTINE
from storage.lake.written_files import WrittenFile
from streaming.records.quarantine_log import (
    ERROR_MAX_CHARS,
    NO_TENANT,
    TENANT_READ_MAX_FILES,
    TOP_TENANTS,
    QuarantineLog,
    summary_line,
    tenants_from_stats,
)
from tenants.settings import QuarantineLogSettings, load_settings
from tests.support.quarantine_log_lines import EXAMPLE_PREFIX, parse_summary, quarantine_lines


class Clock:
    """Monotonic seconds the test moves forward."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    """The messages `streaming.records.quarantine_log` logs during the test, as they come."""
    with quarantine_lines(caplog) as messages:
        yield messages


class Lake:
    """Quarantine files as a batch writes them: Parquet under reason=/ingest_date=, with the
    writer's Delta stats (`nullCount`; `minValues`/`maxValues` of `tenant` only if asked)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = 0

    def file(
        self,
        reason: str,
        tenants: list[str | None],
        batch_id: int = 0,
        tenant_min_max: bool = False,
        error: str = "bad input",
    ) -> WrittenFile:
        self.files += 1
        relative = f"reason={reason}/ingest_date=2026-11-24/part-{self.files:05d}.parquet"
        schema = pa.schema([f for f in QUARANTINE.schema if f.name not in QUARANTINE.partition_by])
        rows = [
            {
                "error": error,
                "tenant": tenant,
                "source": None if tenant is None else "web",
                "topic": "events",
                "partition": 0,
                "offset": self.files * 100_000 + i,
                "kafka_timestamp": None,
                "key": None,
                "value": b"{",
                "batch_id": batch_id,
            }
            for i, tenant in enumerate(tenants)
        ]
        path = self.root / QUARANTINE.name / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        named = sorted(t for t in tenants if t is not None)
        stats: dict[str, Any] = {
            "numRecords": len(tenants),
            "nullCount": {"tenant": len(tenants) - len(named)},
            "minValues": {},
            "maxValues": {},
        }
        if tenant_min_max and named:
            stats["minValues"]["tenant"], stats["maxValues"]["tenant"] = named[0], named[-1]
        return WrittenFile(
            table_name=QUARANTINE.name,
            path=relative,
            size=path.stat().st_size,
            partition_values={"reason": reason, "ingest_date": "2026-11-24"},
            modification_time=0,
            stats=json.dumps(stats),
            num_records=len(tenants),
        )


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(tmp_path / "lake")


def _quarantine_log(lake: Lake, clock: Clock, examples: int = 3, interval: str = "10s") -> Any:
    settings = QuarantineLogSettings.model_validate({"examples": examples, "interval": interval})
    return QuarantineLog(DeltaLake(str(lake.root)), settings, clock)


# -- pure parts -----------------------------------------------------------------------------------


def test_stats_decide_the_tenants_of_a_file_without_or_with_one_tenant(lake: Lake) -> None:
    assert tenants_from_stats(lake.file("malformed_json", [None] * 4)) == {None: 4}
    one = lake.file("unknown_source", ["acme", None, "acme"], tenant_min_max=True)
    assert tenants_from_stats(one) == {"acme": 2, None: 1}
    # Several tenants, or no min/max recorded for `tenant`: only a read tells.
    assert tenants_from_stats(lake.file("x", ["a", "b"], tenant_min_max=True)) is None
    assert tenants_from_stats(lake.file("x", ["a", "a"])) is None


def test_a_summary_names_the_top_tenants_and_counts_the_rest() -> None:
    # Unknown tenants t0..t7 (10..17 records each) and 100 records without a tenant.
    by_tenant: dict[str | None, int] = {f"t{i}": 10 + i for i in range(8)}
    by_tenant[None] = 100
    line = summary_line(4, 7, {"malformed_json": 100, "unknown_tenant": 108}, by_tenant, 0)
    summary = parse_summary(line)
    assert summary is not None, line
    assert (summary.first_batch, summary.last_batch, summary.records) == (4, 7, 208)
    assert list(summary.by_reason.items()) == [("unknown_tenant", 108), ("malformed_json", 100)]
    assert list(summary.by_tenant)[: TOP_TENANTS + 1] == [
        NO_TENANT,
        "t7",
        "t6",
        "t5",
        "t4",
        f"{8 - 4} more tenants",
    ]
    assert sum(summary.by_tenant.values()) == summary.records
    assert "not read=7" in summary_line(1, 1, {"x": 10}, {"a": 3}, 7)


# -- QuarantineLog over real files ----------------------------------------------------------------


def test_one_batch_gives_one_summary_and_at_most_the_configured_examples(
    lake: Lake, lines: list[str]
) -> None:
    clock = Clock()
    quarantine_log = _quarantine_log(lake, clock, examples=3)
    files = [
        lake.file("malformed_json", [None] * 4_000),
        lake.file("unknown_tenant", ["ghost"] * 600 + ["spook"] * 400),
        lake.file("unknown_source", ["acme"] * 7, tenant_min_max=True),
    ]
    quarantine_log.batch_committed(12, files)

    summaries = [parse_summary(line) for line in lines if not line.startswith(EXAMPLE_PREFIX)]
    examples = [line for line in lines if line.startswith(EXAMPLE_PREFIX)]
    assert len(summaries) == 1 and summaries[0] is not None, lines
    assert summaries[0].records == 5_007
    assert summaries[0].by_reason == {
        "malformed_json": 4_000,
        "unknown_tenant": 1_000,
        "unknown_source": 7,
    }
    assert summaries[0].by_tenant == {NO_TENANT: 4_000, "ghost": 600, "spook": 400, "acme": 7}
    # One example of each reason, most frequent reason first.
    assert [line.split(", reason ")[1].split(":")[0] for line in examples] == [
        "malformed_json",
        "unknown_tenant",
        "unknown_source",
    ]


def test_examples_zero_logs_the_summary_only(lake: Lake, lines: list[str]) -> None:
    quarantine_log = _quarantine_log(lake, Clock(), examples=0)
    quarantine_log.batch_committed(0, [lake.file("malformed_json", [None] * 50)])
    assert len(lines) == 1 and parse_summary(lines[0]) is not None, lines


def test_a_long_error_is_cut_in_an_example(lake: Lake, lines: list[str]) -> None:
    quarantine_log = _quarantine_log(lake, Clock(), examples=1)
    quarantine_log.batch_committed(0, [lake.file("too_large", ["a"], error="x" * 5_000)])
    example = lines[1]
    assert len(example) < ERROR_MAX_CHARS + 200 and "(5000 characters)" in example


def test_batches_within_the_interval_are_counted_into_the_next_summary(
    lake: Lake, lines: list[str]
) -> None:
    clock = Clock()
    quarantine_log = _quarantine_log(lake, clock, examples=2, interval="10s")
    quarantine_log.batch_committed(0, [lake.file("malformed_json", [None] * 5, batch_id=0)])
    assert len(lines) == 3  # the first summary is logged at once, with its examples
    for batch_id in range(1, 6):
        clock.now += 1
        quarantine_log.batch_committed(batch_id, [lake.file("malformed_json", [None] * 10)])
    assert len(lines) == 3, "batches within the interval must not log"
    clock.now += 10
    # A batch that quarantined nothing still lets the held-back counts out once it is time.
    quarantine_log.batch_committed(6, [])
    summary = parse_summary(lines[3])
    assert summary is not None, lines
    assert (summary.first_batch, summary.last_batch, summary.records) == (1, 5, 50)
    assert len(lines) == 3 + 1 + 2

    clock.now += 1
    quarantine_log.batch_committed(7, [lake.file("unknown_tenant", ["ghost"] * 3)])
    assert len(lines) == 6
    quarantine_log.flush()  # the stream stops: nothing held back is lost from the log
    last = parse_summary(lines[6])
    assert last is not None and (last.first_batch, last.records) == (7, 3), lines
    quarantine_log.flush()
    quarantine_log.batch_committed(8, [])
    assert len(lines) == 6 + 1 + 2, "nothing left to log"


def test_interval_zero_summarises_every_batch(lake: Lake, lines: list[str]) -> None:
    quarantine_log = _quarantine_log(lake, Clock(), examples=0, interval="0s")
    for batch_id in range(3):
        quarantine_log.batch_committed(batch_id, [lake.file("malformed_json", [None])])
    assert [parse_summary(line) is not None for line in lines] == [True] * 3


def test_tenant_reads_are_bounded_and_the_rest_is_said_to_be_unread(
    lake: Lake, lines: list[str]
) -> None:
    quarantine_log = _quarantine_log(lake, Clock(), examples=0, interval="1h")
    # More files than one summary reads, each with two tenants: stats cannot decide them.
    sizes = [10 + i for i in range(TENANT_READ_MAX_FILES + 4)]
    files = [lake.file("unknown_tenant", ["a"] * (n - 1) + ["b"]) for n in sizes]
    quarantine_log.batch_committed(0, files)
    summary = parse_summary(lines[0])
    assert summary is not None, lines
    unread = sum(sorted(sizes)[:4])  # the smallest files are the ones left unread
    assert summary.by_tenant["not read"] == unread
    assert summary.by_tenant["a"] + summary.by_tenant["b"] == sum(sizes) - unread
    assert summary.records == sum(sizes)


def test_a_vanished_file_costs_only_its_tenant_counts_and_example(
    lake: Lake, lines: list[str]
) -> None:
    quarantine_log = _quarantine_log(lake, Clock(), examples=3)
    gone = lake.file("unknown_tenant", ["a", "b"])
    (lake.root / QUARANTINE.name / gone.path).unlink()
    quarantine_log.batch_committed(0, [gone, lake.file("malformed_json", [None] * 2)])
    summary = parse_summary(lines[0])
    assert summary is not None and summary.by_tenant == {NO_TENANT: 2, "not read": 2}, lines
    assert len(lines) == 1 + 2  # the other file's two rows as examples


def test_the_settings_are_read_from_the_environment() -> None:
    settings = load_settings(
        None, environ={"TW_QUARANTINE_LOG__EXAMPLES": "0", "TW_QUARANTINE_LOG__INTERVAL": "1m"}
    )
    assert settings.quarantine_log == QuarantineLogSettings(examples=0, interval_ms=60_000)
