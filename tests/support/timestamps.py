"""The tests' clock: the day the sample records start, and table timestamps in epoch ms."""

from __future__ import annotations

from typing import Any

import pandas as pd

T0_MS = 1_767_225_600_000
"""2026-01-01T00:00:00Z: aligned to every window size the tests use."""


def epoch_ms(value: Any) -> int:
    """A timestamp as a table gives it (pandas, datetime, ISO text) in epoch milliseconds."""
    return int(pd.Timestamp(value).value // 1_000_000)
