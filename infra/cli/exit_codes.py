"""Every command's exit codes, and the expected failures that end a command with one line.

A user's mistake or an outage the command cannot fix (a bad config, a held lease, a missing
lake) is one line on stderr and an exit code from this table, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    """The command ran and did not get there: a dependency is down, a wait timed out, dead
    letters remain, a schema is stale."""
    REFUSED = 2
    """Nothing was done: the arguments, the config or the lake's state do not allow it."""


@dataclass(frozen=True)
class ExpectedFailure:
    error: str
    """The error's class as `module:Name`. Naming it, not importing it, keeps every command's
    start free of what only some commands import (pyarrow, delta-rs, Kafka): an error whose
    module was never imported cannot have been raised."""

    def matches(self, error: Exception) -> bool:
        module_name, class_name = self.error.split(":")
        module = sys.modules.get(module_name)
        return module is not None and isinstance(error, getattr(module, class_name))

    exit_code: ExitCode
    message: Callable[[Exception], str]


def _table_not_found(error: Exception) -> str:
    # delta-rs adds a Rust error chain below the one line that says which table.
    return (
        f"{str(error).splitlines()[0]}: is the lake root (--lake-root, lake.root) the one the "
        "stream writes, and has it started once?"
    )


EXPECTED_FAILURES = (
    ExpectedFailure(
        "tenants.registry:ConfigError", ExitCode.REFUSED, lambda error: f"invalid config:\n{error}"
    ),
    ExpectedFailure(
        "streaming.checkpoint.checkpoint_identity:CheckpointMismatchError",
        ExitCode.REFUSED,
        lambda e: f"refusing the checkpoint: {e}",
    ),
    ExpectedFailure(
        "storage.lake.writer_lease:StreamLeaseHeldError",
        ExitCode.REFUSED,
        lambda e: f"not starting: {e}",
    ),
    ExpectedFailure(
        "storage.lake.delta_lake:LakeLayoutError", ExitCode.REFUSED, lambda e: f"not starting: {e}"
    ),
    ExpectedFailure("storage.lake.s3_options:LakeUnavailableError", ExitCode.FAILED, str),
    ExpectedFailure("infra.cli.command_context:DevToolsMissingError", ExitCode.REFUSED, str),
    ExpectedFailure("tenants.api_keys:ApiKeyError", ExitCode.REFUSED, str),
    ExpectedFailure(
        "streaming.kafka.client:KafkaSecurityError",
        ExitCode.REFUSED,
        lambda e: f"not starting: {e}",
    ),
    ExpectedFailure(
        "streaming.kafka.client:KafkaUnreachableError",
        ExitCode.REFUSED,
        lambda e: f"not starting: {e}",
    ),
    # After the ones above, which are kinds of it: a broker that went away mid-command.
    ExpectedFailure("streaming.kafka.client:KafkaUnavailableError", ExitCode.FAILED, str),
    ExpectedFailure("deltalake.exceptions:TableNotFoundError", ExitCode.REFUSED, _table_not_found),
)


def expected_failure(error: Exception) -> ExpectedFailure | None:
    """The table's row for `error`, or None: an unexpected error keeps its traceback."""
    return next((row for row in EXPECTED_FAILURES if row.matches(error)), None)
