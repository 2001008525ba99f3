"""One statement's audit line and its count in the metrics, whichever door it came through: the
JSON audit line (tenant, key name, statement digest, outcome, rows, truncated, elapsed time;
never the key)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from infra.service.query_metrics import Outcome, QueryMetrics

audit_log = logging.getLogger("tenant_windows.audit")


@dataclass
class QueryAudit:
    """What the handling of one query request learned, for its audit line and its metrics.

    Whatever answers the request fills it in: the handler (`ok`, `unauthorized`, a
    `QueryError`'s code, `internal`) or the body's validation (`bad_request`, before any key is
    checked, so without a tenant). `QueryAccounting` writes it out once, after the answer.
    """

    tenant: str | None = None
    key_name: str | None = None
    statement_sha256: str | None = None
    outcome: Outcome | None = None
    rows: int = 0
    truncated: bool = False


def account_query(
    metrics: QueryMetrics, audit: QueryAudit, outcome: Outcome, elapsed_s: float
) -> None:
    """One statement's audit line and its count in `metrics`, whichever door it came through."""
    # A result whose answer then failed (`internal`) reached no one: no rows to count.
    rows = audit.rows if outcome == "ok" else 0
    truncated = audit.truncated and outcome == "ok"
    audit_log.info(
        json.dumps(
            {
                "tenant": audit.tenant,
                "key_name": audit.key_name,
                "statement_sha256": audit.statement_sha256,
                "outcome": outcome,
                "rows": rows,
                "truncated": truncated,
                "elapsed_ms": int(elapsed_s * 1000),
            }
        )
    )
    metrics.record(outcome, elapsed_s, rows, truncated)
