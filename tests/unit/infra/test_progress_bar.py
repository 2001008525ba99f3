"""The progress bar of `run --available-now` on a terminal."""

from __future__ import annotations

import io

from infra.progress_bar import ProgressBar
from tests.support.sample_values import progress_of


def test_the_progress_bar_counts_records_read_against_the_backlog() -> None:
    out = io.StringIO()
    bar = ProgressBar(backlog_records=300, out=out)
    for batch_id in range(3):
        bar(progress_of(batch_id, records_read=100))
    bar.close()
    last = out.getvalue().rsplit("\r", 1)[1]
    assert "100%" in last and "300/300" in last and "batch 2" in last
