"""delta-rs storage options for an `s3://` lake root, with keys kept out of logs and errors."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import yaml
from pydantic import SecretStr

from tenants.registry import ConfigError
from tenants.settings import LakeSettings, S3Settings

# object_store's defaults retry a failing request for up to 3 minutes, with 30 s per attempt:
# an unreachable lake would stall a micro-batch for minutes before the query fails. These bound
# it while still riding out a short blip. Measured against SeaweedFS on loopback: a stopped
# server fails a request in about 1 s (5 retries), a hung one in 20 s (the request timeout).
CLIENT_OPTIONS = {
    "connect_timeout": "5s",
    "timeout": "20s",
    "max_retries": "5",
    "retry_timeout": "15s",
}


def storage_options(lake: LakeSettings) -> dict[str, str] | None:
    """The options delta-rs needs for the lake root; None for a local path."""
    if not lake.root.startswith("s3://"):
        return None
    s3 = lake.s3
    options = {"AWS_REGION": s3.region, **CLIENT_OPTIONS}
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
    try:
        loaded = yaml.safe_load(s3.secrets_file.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        # Only the error's kind: its text could quote the file's content.
        raise ConfigError(s3.secrets_file, [("", f"unreadable ({type(error).__name__})")]) from None
    if not isinstance(loaded, dict):
        raise ConfigError(s3.secrets_file, [("", "must be a YAML mapping")])
    missing = [key for key in ("access_key_id", "secret_access_key") if not loaded.get(key)]
    if missing:
        raise ConfigError(s3.secrets_file, [(key, "missing") for key in missing])
    return SecretStr(str(loaded["access_key_id"])), SecretStr(str(loaded["secret_access_key"]))


class LakeUnavailableError(OSError):
    """The store behind an `s3://` lake root failed a request, after the bounded retries."""


# delta-rs colours its error chain for terminals; logs and alerts want plain text.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@contextmanager
def reaching(root: str, options: dict[str, str] | None) -> Iterator[None]:
    """Turn delta-rs's I/O errors on an S3 lake into one line naming the lake and endpoint.

    delta-rs reports "Generic S3 error" with a multi-line chain; the operator needs which lake,
    at which endpoint, and the innermost cause. Only the root, the endpoint and that cause are
    quoted, never the options themselves (they may hold keys).
    """
    try:
        yield
    except OSError as error:
        if options is None or isinstance(error, LakeUnavailableError):
            raise
        lines = [line.strip(" ↳") for line in _ANSI.sub("", str(error)).splitlines()]
        cause = next((line for line in reversed(lines) if line), type(error).__name__)
        endpoint = options.get("AWS_ENDPOINT_URL", f"AWS S3 ({options.get('AWS_REGION')})")
        raise LakeUnavailableError(
            f"the lake {root} is unreachable at {endpoint}: {cause} (after retries); "
            "the stream resumes from its checkpoint once the store is back"
        ) from error
