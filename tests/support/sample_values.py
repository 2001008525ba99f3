"""Values of the product's own types for unit tests: a notification pane, a batch's progress."""

from __future__ import annotations

from streaming.notify.payloads import PaneFacts
from streaming.observe.batch_progress import BatchProgress

PANE = PaneFacts(
    tenant="acme",
    source="web",
    window_start_ms=1_767_225_600_000,
    window_end_ms=1_767_225_660_000,
    pane_index=1,
    timing="LATE",
    is_final=True,
    count=7,
    metrics=(("avg_amount", float("nan")), ("errors", 2.0)),
    batch_id=3,
)
"""A late, final pane of acme's web window [00:00, 00:01) on 2026-01-01."""


def progress_of(batch_id: int, records_read: int) -> BatchProgress:
    """Stream "s"'s progress line of a batch that read `records_read` records."""
    return BatchProgress(
        stream="s",
        batch_id=batch_id,
        finished_at="2026-11-23T00:00:00Z",
        records_read=records_read,
        rows={"events": records_read},
        duration_ms=5,
        max_kafka_lag=1,
    )
