"""delta-rs storage options for an `s3://` lake root, with keys kept out of logs and errors."""

from __future__ import annotations

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
