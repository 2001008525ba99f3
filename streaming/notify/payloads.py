"""What is sent about a pane, and under which key: pure functions of committed `windows` rows.

A redelivery after a crash must carry the same `Idempotency-Key` and the same body, so both are
built from the pane's committed columns only (no send time, no attempt number), as JSON with
sorted keys. Endpoint URLs may hold secrets (Slack hook tokens, basic-auth users, query tokens);
`redact_endpoint` is the only form of a URL that is ever logged or stored.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, urlsplit

from tenants.models import NotifyKind, NotifyOn

REDACTED = "***"
SLACK_HOST = "hooks.slack.com"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class PaneFacts:
    """One committed `windows` row: the facts a notification carries."""

    tenant: str
    source: str
    window_start_ms: int
    window_end_ms: int
    pane_index: int
    timing: str
    is_final: bool
    count: int
    metrics: tuple[tuple[str, float | None], ...]
    batch_id: int

    @classmethod
    def from_row(cls, row: Mapping[str, object]) -> PaneFacts:
        """From a `windows` row as pyarrow's `to_pylist` gives it (timestamps as datetimes)."""
        metrics = row.get("metrics") or []
        assert isinstance(metrics, list)
        return cls(
            tenant=str(row["tenant"]),
            source=str(row["source"]),
            window_start_ms=_epoch_ms(row["window_start"]),
            window_end_ms=_epoch_ms(row["window_end"]),
            pane_index=int(str(row["pane_index"])),
            timing=str(row["timing"]),
            is_final=bool(row["is_final"]),
            count=int(str(row["count"])),
            metrics=tuple(sorted((str(name), value) for name, value in metrics)),
            batch_id=int(str(row["batch_id"])),
        )


def qualifies(on: NotifyOn, pane: PaneFacts) -> bool:
    return on is NotifyOn.EVERY_PANE or pane.is_final


def idempotency_key(stream: str, pane: PaneFacts) -> str:
    """A stable digest of (stream, tenant, source, window start, pane index)."""
    identity = json.dumps(
        [stream, pane.tenant, pane.source, pane.window_start_ms, pane.pane_index],
        separators=(",", ":"),
    )
    return hashlib.sha256(identity.encode()).hexdigest()


def facts(pane: PaneFacts) -> dict[str, object]:
    """The webhook body's fields."""
    return {
        "tenant": pane.tenant,
        "source": pane.source,
        "window_start": iso_utc(pane.window_start_ms),
        "window_end": iso_utc(pane.window_end_ms),
        "pane_index": pane.pane_index,
        "timing": pane.timing,
        "is_final": pane.is_final,
        "count": pane.count,
        "metrics": _metrics(pane),
    }


def _metrics(pane: PaneFacts) -> dict[str, float | None]:
    # A mean of no values is NaN, which JSON has no literal for.
    return {
        name: None if value is None or math.isnan(value) else value for name, value in pane.metrics
    }


def webhook_body(pane: PaneFacts) -> bytes:
    return _canonical_json(facts(pane))


def slack_body(pane: PaneFacts) -> bytes:
    """A Slack incoming-webhook message: `text` (the notification fallback) and `blocks`."""
    final = "final" if pane.is_final else "not final"
    title = (
        f"{pane.tenant}/{pane.source}: window {iso_utc(pane.window_start_ms)} to "
        f"{iso_utc(pane.window_end_ms)}, pane {pane.pane_index} ({pane.timing}, {final}): "
        f"{pane.count} records"
    )
    fields = [
        ("tenant", pane.tenant),
        ("source", pane.source),
        ("window_start", iso_utc(pane.window_start_ms)),
        ("window_end", iso_utc(pane.window_end_ms)),
        ("pane_index", str(pane.pane_index)),
        ("timing", pane.timing),
        ("is_final", str(pane.is_final).lower()),
        ("count", str(pane.count)),
    ]
    metric_lines = [f"`{name}`: {value}" for name, value in _metrics(pane).items()]
    blocks: list[dict[str, object]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{title}*"}},
        {
            "type": "section",
            "fields": [{"type": "mrkdwn", "text": f"*{name}*\n{value}"} for name, value in fields],
        },
    ]
    if metric_lines:
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(metric_lines)}}
        )
    return _canonical_json({"text": title, "blocks": blocks})


def body_for(kind: NotifyKind, pane: PaneFacts) -> bytes:
    return slack_body(pane) if kind is NotifyKind.SLACK else webhook_body(pane)


def endpoint_id(kind: NotifyKind, url_reference: str) -> str:
    """Names an endpoint as configured (its URL, `${VAR}` or `secret:` reference) in tables,
    without revealing it."""
    return hashlib.sha256(f"{kind.value}\0{url_reference}".encode()).hexdigest()[:16]


def redact_endpoint(kind: NotifyKind, url: str) -> str:
    """`url` with nothing secret: no userinfo, no query values, no fragment, and for Slack hooks
    (whose path is the token) only the path's first segment."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return REDACTED
    path = parts.path
    if kind is NotifyKind.SLACK or host == SLACK_HOST:
        first = path.strip("/").split("/", 1)[0]
        path = f"/{first}/{REDACTED}" if first else f"/{REDACTED}"
    query = "&".join(
        f"{name}={REDACTED}" for name, _value in parse_qsl(parts.query, keep_blank_values=True)
    )
    return f"{parts.scheme}://{host}{port}{path}" + (f"?{query}" if query else "")


def iso_utc(epoch_ms: int) -> str:
    moment = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _epoch_ms(value: object) -> int:
    if isinstance(value, datetime):
        return (value - _EPOCH) // timedelta(milliseconds=1)
    return int(str(value))
