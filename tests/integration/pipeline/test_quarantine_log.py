"""One real run quarantines 5,000 malformed records in one batch: the log says so in a few lines,
and the quarantine table holds all of them. (`QuarantineLog` on its own:
tests/unit/streaming/records/test_quarantine_log.py.)"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streaming.records.quarantine_log import NO_TENANT
from tests.support.pipeline_harness import Pipeline
from tests.support.quarantine_log_lines import (
    EXAMPLE_PREFIX,
    example_coordinates,
    parse_summary,
    quarantine_lines,
)

pytestmark = pytest.mark.integration

MALFORMED = 5_000


@pytest.fixture(scope="module")
def malformed_topic(kafka: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    owner = Pipeline.create(kafka, tmp_path_factory.mktemp("malformed"), conf_dir, partitions=2)
    owner.produce(f"not json {i}".encode() for i in range(MALFORMED))
    return owner.topic


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    """The messages `streaming.records.quarantine_log` logs during the test, as they come."""
    with quarantine_lines(caplog) as messages:
        yield messages


@pytest.mark.parametrize("examples", [3, 0])
def test_a_batch_of_5000_malformed_records_logs_a_few_lines_and_quarantines_all(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    malformed_topic: str,
    tmp_path: Path,
    lines: list[str],
    examples: int,
) -> None:
    pipeline = Pipeline(
        kafka,
        tmp_path,
        conf_dir,
        malformed_topic,
        partitions=2,
        environ={"TW_QUARANTINE_LOG__EXAMPLES": str(examples)},
    )
    pipeline.run_available_now(spark)  # one batch: no limit on records per trigger

    quarantine = pipeline.table("quarantine")
    assert len(quarantine) == MALFORMED
    assert Counter(quarantine["reason"]) == {"malformed_json": MALFORMED}
    assert len(lines) == 1 + examples, lines
    summary = parse_summary(lines[0])
    assert summary is not None, lines
    assert (summary.first_batch, summary.last_batch, summary.records) == (0, 0, MALFORMED)
    assert summary.by_reason == {"malformed_json": MALFORMED}
    assert summary.by_tenant == {NO_TENANT: MALFORMED}
    coordinates = {f"{row.topic}/{row.partition}@{row.offset}" for row in quarantine.itertuples()}
    for example in lines[1:]:
        assert example.startswith(f"{EXAMPLE_PREFIX}tenant=None source=None at ")
        assert example_coordinates(example) in coordinates
