"""delta-rs storage options for an `s3://` lake root, with keys kept out of logs and errors."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import SecretStr

from storage.lake.lake_filesystem import lake_endpoint
from tenants.settings import LakeSettings, S3Settings, read_secrets_file

# object_store's defaults retry a failing request for up to 3 minutes, with 30 s per attempt:
# an unreachable lake would stall a micro-batch for minutes before the query fails. These bound
# it by `lake.s3.timeout` while still riding out a short blip: a stopped server fails a request
# in about 1 s (5 quick retries, measured against SeaweedFS on loopback); a server that accepts
# connections and then stalls fails it after one timeout, because no retry starts once the
# retry budget (the same timeout) is spent.
MAX_CONNECT_TIMEOUT_MS = 5_000
MAX_RETRIES = 5


def client_options(timeout_ms: int) -> dict[str, str]:
    """object_store's client options (delta-rs) for a per-request timeout of `timeout_ms`.

    `storage.lake.lake_filesystem.filesystem_of` reads `timeout` and `connect_timeout` back, so
    pyarrow's S3 client on executors uses the same bounds.
    """
    return {
        "connect_timeout": f"{min(timeout_ms, MAX_CONNECT_TIMEOUT_MS)}ms",
        "timeout": f"{timeout_ms}ms",
        "max_retries": str(MAX_RETRIES),
        "retry_timeout": f"{timeout_ms}ms",
    }


def storage_options(lake: LakeSettings) -> dict[str, str] | None:
    """The options delta-rs needs for the lake root; None for a local path."""
    if not lake.root.startswith("s3://"):
        return None
    s3 = lake.s3
    options = {"AWS_REGION": s3.region, **client_options(s3.timeout_ms)}
    if s3.endpoint_url:
        options["AWS_ENDPOINT_URL"] = s3.endpoint_url
    if s3.allow_http:
        options["AWS_ALLOW_HTTP"] = "true"
    access_key_id, secret_access_key = _keys(s3)
    if access_key_id is not None and secret_access_key is not None:
        options["AWS_ACCESS_KEY_ID"] = access_key_id.get_secret_value()
        options["AWS_SECRET_ACCESS_KEY"] = secret_access_key.get_secret_value()
    return options


def _keys(s3: S3Settings) -> tuple[SecretStr | None, SecretStr | None]:
    if s3.access_key_id is not None or s3.secrets_file is None:
        return s3.access_key_id, s3.secret_access_key
    keys = read_secrets_file(s3.secrets_file, ("access_key_id", "secret_access_key"))
    return keys["access_key_id"], keys["secret_access_key"]


class LakeUnavailableError(OSError):
    """The store behind an `s3://` lake root failed a request, after the bounded retries."""


# delta-rs colours its error chain for terminals; logs and alerts want plain text.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@contextmanager
def reaching(
    root: str, options: dict[str, str] | None, doing: str = "opening a table"
) -> Iterator[None]:
    """Turn delta-rs's I/O errors on an S3 lake into one line naming the lake and endpoint.

    delta-rs reports "Generic S3 error" with a multi-line chain; the operator needs which lake,
    at which endpoint, doing what, and the innermost cause. Only the root, the endpoint and that
    cause are quoted, never the options themselves (they may hold keys).
    """
    try:
        yield
    except OSError as error:
        if options is None or isinstance(error, LakeUnavailableError):
            raise
        lines = [line.strip(" ↳") for line in _ANSI.sub("", str(error)).splitlines()]
        cause = next((line for line in reversed(lines) if line), type(error).__name__)
        raise LakeUnavailableError(
            f"the lake {root} is unreachable at {lake_endpoint(options)} while {doing}: "
            f"{cause} (after retries); "
            "the stream resumes from its checkpoint once the store is back"
        ) from error
