"""Read back what the stream logs: quarantine summaries and their quoted examples."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

QUARANTINE_LOGGER = "streaming.records.quarantine_log"
EXAMPLE_PREFIX = "quarantined: "
_SUMMARY = re.compile(
    r"^batch(?:es)? (?P<first>\d+)(?:-(?P<last>\d+))?: (?P<records>\d+) records quarantined; "
    r"by reason: (?P<reasons>[^;]*); by tenant: (?P<tenants>[^;]*); "
    r"all of them are in the quarantine table$"
)


@dataclass(frozen=True)
class QuarantineSummary:
    first_batch: int
    last_batch: int
    records: int
    by_reason: dict[str, int]
    by_tenant: dict[str, int]
    """By tenant name as logged, plus "N more tenants" and "not read" where shown."""


def parse_summary(line: str) -> QuarantineSummary | None:
    """The summary a line holds; None for any other line (an example)."""
    match = _SUMMARY.match(line)
    if match is None:
        return None
    return QuarantineSummary(
        first_batch=int(match["first"]),
        last_batch=int(match["last"] or match["first"]),
        records=int(match["records"]),
        by_reason=_counts(match["reasons"]),
        by_tenant=_counts(match["tenants"]),
    )


def example_coordinates(line: str) -> str:
    """`topic/partition@offset` of an example line."""
    return line.split(" at ", 1)[1].split(",", 1)[0]


def _counts(text: str) -> dict[str, int]:
    pairs = (item.rsplit("=", 1) for item in text.split(", "))
    return {name: int(count) for name, count in pairs}


@contextmanager
def quarantine_lines(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    """The messages `streaming.records.quarantine_log` logs while the block runs, as they come."""
    caplog.set_level(logging.INFO, logger=QUARANTINE_LOGGER)
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name == QUARANTINE_LOGGER:
                messages.append(record.getMessage())

    handler = Collect()
    logging.getLogger(QUARANTINE_LOGGER).addHandler(handler)
    try:
        yield messages
    finally:
        logging.getLogger(QUARANTINE_LOGGER).removeHandler(handler)
