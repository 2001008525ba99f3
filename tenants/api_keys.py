"""Tenants' API keys for the query service: issued, revoked and verified (issue 19, contract §6).

A key reads `tw.<tenant>.<key id>.<secret>`. The tenant and the key id are not secret: they name
the file and the entry to check, so verifying a key costs one file read and one scrypt, never a
scan of every tenant's keys (100,000 tenants). Only a salted scrypt hash of the whole key is
stored, with the key's name and creation time, in `conf/api_keys/<tenant>.json`; the key itself
exists only on the issuer's stdout. Hashes are compared in constant time.

A revoked key keeps its entry (name, creation and revocation time) so an audit can still say
whose it was; its name can then be used again.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import os
import re
import secrets
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tenants.models import ID_PATTERN

KEYS_DIR = "api_keys"
KEY_PREFIX = "tw"
# scrypt at n=2**14, r=8 costs about 16 MiB and a few tens of ms: enough to make guessing a
# stolen hash file's keys expensive, cheap enough for a server that remembers verified keys.
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P, _HASH_BYTES = 2**14, 8, 1, 32


class ApiKeyError(ValueError):
    """A key could not be issued or revoked; the message says why."""


class StoredApiKey(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=ID_PATTERN)
    key_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    salt_hex: str
    scrypt_hex: str
    created_at: datetime
    revoked_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class TenantKeys(BaseModel):
    """The content of one tenant's key file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: str = Field(pattern=ID_PATTERN)
    keys: tuple[StoredApiKey, ...] = ()


class Caller(BaseModel):
    """Who a verified key belongs to; tenant None is the operator."""

    model_config = ConfigDict(frozen=True)

    tenant: str | None
    key_name: str


def issue_key(conf_dir: Path, tenant: str, name: str | None = None) -> str:
    """A new key for `tenant`; only its hash is stored. `name` must not name an active key."""
    stored = read_tenant_keys(conf_dir, tenant)
    if name is not None and not _is_identifier(name):
        raise ApiKeyError(f"key name {name!r} must match {ID_PATTERN}")
    if name is None:
        used = {key.name for key in stored.keys}
        name = next(f"key-{n}" for n in itertools.count(1) if f"key-{n}" not in used)
    if any(key.name == name and key.active for key in stored.keys):
        raise ApiKeyError(f"tenant {tenant!r} already has an active key named {name!r}")
    key_id = secrets.token_hex(8)
    key = f"{KEY_PREFIX}.{tenant}.{key_id}.{secrets.token_urlsafe(32)}"
    salt = secrets.token_bytes(16)
    entry = StoredApiKey(
        name=name,
        key_id=key_id,
        salt_hex=salt.hex(),
        scrypt_hex=_scrypt(key, salt).hex(),
        created_at=datetime.now(UTC),
    )
    _write(conf_dir, stored.model_copy(update={"keys": (*stored.keys, entry)}))
    return key


def revoke_key(conf_dir: Path, tenant: str, name: str) -> None:
    stored = read_tenant_keys(conf_dir, tenant)
    if not any(key.name == name and key.active for key in stored.keys):
        raise ApiKeyError(f"tenant {tenant!r} has no active key named {name!r}")
    now = datetime.now(UTC)
    keys = tuple(
        key.model_copy(update={"revoked_at": now}) if key.name == name and key.active else key
        for key in stored.keys
    )
    _write(conf_dir, stored.model_copy(update={"keys": keys}))


def verify_key(conf_dir: Path, presented: str) -> Caller | None:
    """The tenant and key name of an active key, or None for any other string."""
    parts = presented.split(".")
    if len(parts) != 4 or parts[0] != KEY_PREFIX:
        return None
    _, tenant, key_id, _ = parts
    try:
        stored = read_tenant_keys(conf_dir, tenant)
    except ApiKeyError:
        return None
    for key in stored.keys:
        # Key ids are public; the hash is what proves the key.
        if key.key_id == key_id and key.active:
            digest = _scrypt(presented, bytes.fromhex(key.salt_hex))
            if hmac.compare_digest(digest, bytes.fromhex(key.scrypt_hex)):
                return Caller(tenant=tenant, key_name=key.name)
    return None


def key_file(conf_dir: Path, tenant: str) -> Path:
    return conf_dir / KEYS_DIR / f"{tenant}.json"


def read_tenant_keys(conf_dir: Path, tenant: str) -> TenantKeys:
    """The tenant's key file, or no keys; a malformed file is refused with its path and field."""
    if not _is_identifier(tenant):
        raise ApiKeyError(f"{tenant!r} is not a tenant id")
    path = key_file(conf_dir, tenant)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return TenantKeys(tenant=tenant)
    try:
        stored = TenantKeys.model_validate_json(text)
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in problem["loc"]) or "(file)"
        raise ApiKeyError(f"{path}: {where}: {problem['msg']}") from None
    if stored.tenant != tenant:
        raise ApiKeyError(f"{path}: tenant: is {stored.tenant!r}, the file name says {tenant!r}")
    return stored


def _write(conf_dir: Path, stored: TenantKeys) -> None:
    path = key_file(conf_dir, stored.tenant)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed, so a reader sees the old file or the new one, never half.
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    scratch.write_text(json.dumps(stored.model_dump(mode="json"), indent=2) + "\n")
    scratch.chmod(0o600)
    scratch.replace(path)


def _scrypt(key: str, salt: bytes) -> bytes:
    return hashlib.scrypt(
        key.encode(), salt=salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P, dklen=_HASH_BYTES
    )


def _is_identifier(text: str) -> bool:
    return re.fullmatch(ID_PATTERN, text) is not None
