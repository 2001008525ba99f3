"""Every command's exit codes, and the expected failures that end a command with one line.

A user's mistake or an outage the command cannot fix (a bad config, a held lease, a missing
lake) is one line on stderr and an exit code from this table, never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from deltalake.exceptions import TableNotFoundError

from infra.cli.command_context import DevToolsMissingError
from storage.lake.delta_lake import LakeLayoutError
from storage.lake.s3_options import LakeUnavailableError
from storage.lake.writer_lease import StreamLeaseHeldError
from streaming.checkpoint.checkpoint_identity import CheckpointMismatchError
from streaming.kafka.client import KafkaSecurityError
from tenants.api_keys import ApiKeyError
from tenants.registry import ConfigError


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    """The command ran and did not get there: a dependency is down, a wait timed out, dead
    letters remain, a schema is stale."""
    REFUSED = 2
    """Nothing was done: the arguments, the config or the lake's state do not allow it."""


@dataclass(frozen=True)
class ExpectedFailure:
    error: type[Exception]
    exit_code: ExitCode
    message: Callable[[Exception], str]


def _table_not_found(error: Exception) -> str:
    # delta-rs adds a Rust error chain below the one line that says which table.
    return (
        f"{str(error).splitlines()[0]}: is the lake root (--lake-root, lake.root) the one the "
        "stream writes, and has it started once?"
    )


EXPECTED_FAILURES = (
    ExpectedFailure(ConfigError, ExitCode.REFUSED, lambda error: f"invalid config:\n{error}"),
    ExpectedFailure(
        CheckpointMismatchError, ExitCode.REFUSED, lambda e: f"refusing the checkpoint: {e}"
    ),
    ExpectedFailure(StreamLeaseHeldError, ExitCode.REFUSED, lambda e: f"not starting: {e}"),
    ExpectedFailure(LakeLayoutError, ExitCode.REFUSED, lambda e: f"not starting: {e}"),
    ExpectedFailure(LakeUnavailableError, ExitCode.FAILED, str),
    ExpectedFailure(DevToolsMissingError, ExitCode.REFUSED, str),
    ExpectedFailure(ApiKeyError, ExitCode.REFUSED, str),
    ExpectedFailure(KafkaSecurityError, ExitCode.REFUSED, lambda e: f"not starting: {e}"),
    ExpectedFailure(TableNotFoundError, ExitCode.REFUSED, _table_not_found),
)


def expected_failure(error: Exception) -> ExpectedFailure | None:
    """The table's row for `error`, or None: an unexpected error keeps its traceback."""
    return next((row for row in EXPECTED_FAILURES if isinstance(error, row.error)), None)
