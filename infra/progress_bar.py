"""A one-line progress bar on a terminal: records read against the backlog at start."""

from __future__ import annotations

import sys
from typing import TextIO

from streaming.progress import BatchProgress

BAR_WIDTH = 30


class ProgressBar:
    """Redrawn in place after each batch; `close()` ends the line."""

    def __init__(self, backlog_records: int | None, out: TextIO = sys.stderr) -> None:
        self.backlog_records = backlog_records
        self.out = out
        self.records_read = 0

    def __call__(self, progress: BatchProgress) -> None:
        self.records_read += progress.records_read
        lag = "" if progress.max_kafka_lag is None else f", lag {progress.max_kafka_lag:,}"
        if self.backlog_records:
            share = min(self.records_read / self.backlog_records, 1.0)
            filled = round(share * BAR_WIDTH)
            bar = f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {share:4.0%} "
            counted = f"{self.records_read:,}/{self.backlog_records:,}"
        else:
            bar, counted = "", f"{self.records_read:,}"
        self.out.write(
            f"\r{bar}{counted} records, batch {progress.batch_id} "
            f"({progress.duration_ms / 1000:.1f}s{lag})\x1b[K"
        )
        self.out.flush()

    def close(self) -> None:
        self.out.write("\n")
        self.out.flush()
