"""How a statement is refused or fails: a closed set of codes, each with an HTTP status and one
line. Free of Spark, so the CLI can refuse a statement in the same words before any JVM starts.
"""

from __future__ import annotations

from typing import Literal, get_args

from tenants.models import QueryLimits

QueryErrorCode = Literal[
    "statement_too_large",
    "too_many_concurrent",
    "rate_limited",
    "refused",
    "bad_version",
    "resource_limit",
    "analysis_error",
    "query_failed",
    "statement_timeout",
]
"""Every code a refused or failed statement gets: a closed set, so the query service's metrics
(`infra/service/query_metrics.py`) can label by it without growing with what tenants send."""
QUERY_ERROR_CODES: tuple[QueryErrorCode, ...] = get_args(QueryErrorCode)


class QueryError(Exception):
    """A statement that gets no result: an HTTP status, a stable code and a one-line message."""

    def __init__(
        self,
        status: int,
        code: QueryErrorCode,
        message: str,
        retry_after_s: int | None = None,
        sqlstate: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.retry_after_s = retry_after_s
        self.sqlstate = sqlstate
        """The SQL standard's class of the failure where it is known (`42703`: an unknown
        column, `42P01`: an unknown relation), for the doors that speak SQLSTATEs."""


UNDEFINED_COLUMN, UNDEFINED_TABLE = "42703", "42P01"


def unknown_name(message: str, sqlstate: str) -> QueryError:
    """A statement naming a column or relation that does not exist, said before any engine runs
    with the names it could mean: a mistake in the statement, as Spark's own analysis would
    call it."""
    return QueryError(422, "analysis_error", message, sqlstate=sqlstate)


def check_statement_length(statement: str, limits: QueryLimits) -> None:
    if len(statement) > limits.max_statement_chars:
        raise QueryError(
            413,
            "statement_too_large",
            f"the statement has {len(statement)} characters; the limit is "
            f"{limits.max_statement_chars}",
        )


def statement_timeout(limits: QueryLimits) -> QueryError:
    return QueryError(
        408,
        "statement_timeout",
        f"the statement ran longer than {limits.statement_timeout_ms / 1000:g} s and was cancelled",
    )
