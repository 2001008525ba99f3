"""A progress bar on a terminal (tqdm): records read against the backlog at start."""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm

from streaming.observe.batch_progress import BatchProgress


class ProgressBar:
    """Advanced after each micro-batch; `close()` ends the line. Without a known backlog it
    counts records and shows the rate, with no percentage."""

    def __init__(self, backlog_records: int | None, out: TextIO = sys.stderr) -> None:
        self._bar = tqdm(
            total=backlog_records or None,
            unit="rec",
            unit_scale=True,
            file=out,
            dynamic_ncols=True,
            # Redraw on every batch: a batch is seconds apart, never too often.
            mininterval=0,
        )

    def __call__(self, progress: BatchProgress) -> None:
        lag = "" if progress.max_kafka_lag is None else f", lag {progress.max_kafka_lag:,}"
        self._bar.set_postfix_str(
            f"batch {progress.batch_id} ({progress.duration_ms / 1000:.1f}s{lag})", refresh=False
        )
        self._bar.update(progress.records_read)

    def close(self) -> None:
        self._bar.close()
