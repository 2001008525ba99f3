"""Endpoints as configured become URLs to POST to: secrets resolved, requests made, nothing leaked.

A `notify` URL is given as the URL itself, `${ENV_VAR}`, or `secret:path` (a file, relative to
the conf dir, e.g. a mounted Kubernetes secret). It is resolved when a delivery is planned, so a
rotated secret is picked up without a restart. The resolved URL stays a `SecretStr`: errors and
logs name the reference (`${ACME_HOOK}`) or the redacted URL, never the URL.
"""

from __future__ import annotations

import http.client
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from streaming.notify.payloads import endpoint_id, redact_endpoint
from tenants.models import (
    ENV_REFERENCE_RE,
    SECRET_FILE_PREFIX,
    NotifyKind,
    NotifyTarget,
    check_endpoint_url,
)

# Answers that may succeed when asked again; any other 4xx is the request's fault: dead-letter.
RETRYABLE_STATUS = frozenset({408, 425, 429})
_RESPONSE_BYTES_READ = 65_536


@dataclass(frozen=True)
class Endpoint:
    endpoint_id: str
    kind: NotifyKind
    url: SecretStr | None
    """None when the reference could not be resolved; `problem` then says why."""
    redacted: str
    timeout_s: float
    problem: str | None = None


@dataclass(frozen=True)
class SendResult:
    status_code: int | None
    error: str | None
    retryable: bool

    @property
    def succeeded(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def resolve_endpoint(
    target: NotifyTarget, conf_dir: Path, environ: Mapping[str, str] | None = None
) -> Endpoint:
    """The endpoint `target` names now; an unresolvable one carries its `problem` instead."""
    reference = target.url.get_secret_value()
    identity = endpoint_id(target.kind, reference)
    timeout_s = target.timeout_ms / 1000
    try:
        url = _resolve(reference, conf_dir, os.environ if environ is None else environ)
    except _UnresolvedError as problem:
        return Endpoint(identity, target.kind, None, str(problem.shown_as), timeout_s, str(problem))
    return Endpoint(
        identity, target.kind, SecretStr(url), redact_endpoint(target.kind, url), timeout_s
    )


class _UnresolvedError(Exception):
    def __init__(self, shown_as: str, problem: str) -> None:
        super().__init__(problem)
        self.shown_as = shown_as


def _resolve(reference: str, conf_dir: Path, environ: Mapping[str, str]) -> str:
    env_match = ENV_REFERENCE_RE.match(reference)
    if env_match is not None:
        shown_as = reference
        value = environ.get(env_match.group(1))
        if not value:
            raise _UnresolvedError(
                shown_as, f"environment variable {env_match.group(1)} is not set"
            )
    elif reference.startswith(SECRET_FILE_PREFIX):
        shown_as = reference
        path = conf_dir / reference[len(SECRET_FILE_PREFIX) :].strip()
        try:
            value = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise _UnresolvedError(
                shown_as, f"secret file {path} cannot be read: {error}"
            ) from None
    else:
        return reference
    try:
        check_endpoint_url(value)
    except ValueError as error:
        raise _UnresolvedError(
            shown_as, f"{shown_as} does not hold a usable URL: {error}"
        ) from None
    return value


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    # A redirect would turn the POST into a GET without its body, or send it elsewhere.
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


# No proxy from the environment: an endpoint is reached directly, as configured.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _RefuseRedirects)


def post(endpoint: Endpoint, idempotency_key: str, body: bytes) -> SendResult:
    """POST `body` once; what the endpoint answered, or why it could not be reached."""
    if endpoint.url is None:
        return SendResult(None, endpoint.problem, retryable=False)
    url = endpoint.url.get_secret_value()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": idempotency_key,
            "User-Agent": "tenant-windows-notifier",
        },
    )
    try:
        with _OPENER.open(request, timeout=endpoint.timeout_s) as response:
            response.read(_RESPONSE_BYTES_READ)
            return SendResult(response.status, None, retryable=False)
    except urllib.error.HTTPError as error:
        error.close()
        retryable = error.code in RETRYABLE_STATUS or error.code >= 500
        return SendResult(error.code, f"HTTP {error.code}", retryable)
    except (ValueError, http.client.InvalidURL) as error:
        # Complaints about a malformed URL quote it: keep only what kind of problem it was.
        return SendResult(None, f"{type(error).__name__}: malformed URL", retryable=False)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        reason = error.reason if isinstance(error, urllib.error.URLError) else error
        text = f"{type(reason).__name__}: {reason}"
        return SendResult(None, text.replace(url, endpoint.redacted), retryable=True)
