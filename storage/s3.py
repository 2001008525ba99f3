"""delta-rs storage options for an `s3://` lake root, with keys kept out of logs and errors."""

from __future__ import annotations

import yaml
from pydantic import SecretStr

from tenants.registry import ConfigError
from tenants.settings import LakeSettings, S3Settings


def storage_options(lake: LakeSettings) -> dict[str, str] | None:
    """The options delta-rs needs for the lake root; None for a local path."""
    if not lake.root.startswith("s3://"):
        return None
    s3 = lake.s3
    options = {"AWS_REGION": s3.region}
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
