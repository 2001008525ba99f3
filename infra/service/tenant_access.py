"""Who may ask a tenant's question and within what limits, for every door (HTTP and Postgres):
API keys verified and remembered for a while, the operator's key, and each tenant's query
limits read from its config."""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

from tenants.api_keys import Caller, verify_key
from tenants.conf_reader import ConfReader
from tenants.models import SECRET_FILE_PREFIX, QueryLimits, WindowRules
from tenants.registry import ConfigError, TenantRegistry
from tenants.settings import AppSettings

log = logging.getLogger(__name__)


@dataclass
class KeyCheck:
    """Verified keys remembered for `recheck_s`: a revoked key stops working within it, and a
    request does not pay for scrypt each time."""

    conf_dir: Path
    operator_key: SecretStr | None
    recheck_s: float
    _verified: dict[bytes, tuple[Caller, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def caller(self, authorization: str | None) -> Caller | None:
        """The caller a `Bearer` header proves; tenant None is the operator."""
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.caller_of_key(presented.strip())

    def caller_of_key(self, presented: str) -> Caller | None:
        """The caller a key proves (the Postgres door's password); tenant None: the operator."""
        if not presented:
            return None
        operator = self.operator_key.get_secret_value() if self.operator_key else ""
        if operator and hmac.compare_digest(presented.encode(), operator.encode()):
            return Caller(tenant=None, key_name="operator")
        digest = hashlib.sha256(presented.encode()).digest()
        now = time.monotonic()
        with self._lock:
            remembered = self._verified.get(digest)
        if remembered is not None and now - remembered[1] < self.recheck_s:
            return remembered[0]
        caller = verify_key(self.conf_dir, presented)
        with self._lock:
            if caller is None:
                self._verified.pop(digest, None)
            else:
                self._verified[digest] = (caller, now)
        return caller


@dataclass
class TenantLimits:
    """Each tenant's `QueryLimits`: the app's, with its own file's `query:` overrides; and its
    window rules per source, for `/v1/status`. The tenant config is read again at most every
    `recheck_s` (only changed files), so an edit takes effect without a restart; an invalid edit
    keeps the last good config."""

    defaults: QueryLimits
    reader: ConfReader
    recheck_s: float
    _registry: TenantRegistry | None = None
    _read_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, tenant: str | None) -> QueryLimits:
        if tenant is None:
            return self.defaults
        config = self._current().tenants.get(tenant)
        return self.defaults.with_overrides(config.query) if config is not None else self.defaults

    def window_rules(self, tenant: str) -> dict[str, WindowRules]:
        """The rules the stream windows each of the tenant's sources with (none if unknown)."""
        registry = self._current()
        if not registry.knows_tenant(tenant):
            return {}
        return {
            source: found.rules
            for source in registry.source_ids(tenant)
            if (found := registry.resolve(tenant, source)) is not None
        }

    def _current(self) -> TenantRegistry:
        with self._lock:
            now = time.monotonic()
            if self._registry is None or now - self._read_at >= self.recheck_s:
                try:
                    self._registry = self.reader.load()
                except ConfigError as error:
                    if self._registry is None:
                        raise
                    log.warning("tenant config refused, keeping the last good one: %s", error)
                self._read_at = now
            return self._registry


def resolved_operator_key(settings: AppSettings) -> SecretStr | None:
    """`query.operator_key` as given, or read from `secret:FILE` (relative to the conf dir)."""
    key = settings.query.operator_key
    text = key.get_secret_value().strip() if key is not None else ""
    if not text.startswith(SECRET_FILE_PREFIX):
        return SecretStr(text) if text else None
    path = settings.conf_dir / text[len(SECRET_FILE_PREFIX) :].strip()
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(path, [("query.operator_key", f"cannot be read: {error}")]) from None
    if not text:
        raise ConfigError(path, [("query.operator_key", "the secret file is empty")])
    return SecretStr(text)
