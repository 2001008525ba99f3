"""Frozen config models for sources, tenants and their window rules (contract §3, §6).

A source defines where its event time lives and its default window rules; a tenant enables
sources and may override the rules per source. `EffectiveRules` is what the windowing code sees.
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    WithJsonSchema,
    field_serializer,
    field_validator,
    model_validator,
)

# An id is used as a Delta partition value and a path component, so nothing else is accepted.
ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_DURATION_RE = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(value: object) -> int:
    """Turn `"90s"`, `"1m"`, `"500ms"` or an int of milliseconds into milliseconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a string like '10s', '1m', '2h' or an int of ms")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match:
            return int(match.group(1)) * _UNIT_MS[match.group(2)]
    raise ValueError(
        f"invalid duration {value!r}: use a number with a unit ms, s, m, h or d, e.g. '10s'"
    )


def _duration_json_schema(positive: bool) -> WithJsonSchema:
    """What a YAML file may write for a duration, for editors: the text form or an int of ms
    (the validator turns both into ms, so pydantic alone would only say "integer")."""
    number = r"0*[1-9]\d*" if positive else r"\d+"
    return WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": rf"^\s*{number}\s*(ms|s|m|h|d)\s*$"},
                {"type": "integer", **({"exclusiveMinimum": 0} if positive else {"minimum": 0})},
            ]
        }
    )


PositiveDurationMs = Annotated[
    int, BeforeValidator(parse_duration_ms), Field(gt=0), _duration_json_schema(positive=True)
]
NonNegativeDurationMs = Annotated[
    int, BeforeValidator(parse_duration_ms), Field(ge=0), _duration_json_schema(positive=False)
]
Identifier = Annotated[str, Field(pattern=ID_PATTERN)]
# How a notify URL may be given: `${ENV_VAR}`, `secret:path/to/file` (relative to the conf dir),
# or the URL itself. Only the URL itself can be checked here; the others when they are resolved.
ENV_REFERENCE_RE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
SECRET_FILE_PREFIX = "secret:"
URL_SCHEMES = ("http", "https")


class _Frozen(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True
    )


class EventTimeFormat(StrEnum):
    ISO8601 = "iso8601"
    EPOCH_MS = "epoch_ms"
    EPOCH_S = "epoch_s"


class EventTimeSpec(_Frozen):
    """Where a source's event time lives in the JSON record."""

    field: str = Field(min_length=1, description="Dot path into the record, e.g. `meta.ts`.")
    format: EventTimeFormat = Field(description="`iso8601`, `epoch_ms` or `epoch_s`.")

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.field.split("."))


class TumblingWindow(_Frozen):
    """Fixed, non-overlapping windows aligned to the UTC epoch."""

    kind: Literal["tumbling"] = "tumbling"
    size_ms: PositiveDurationMs = Field(alias="size", description="Window length.")


class SlidingWindow(_Frozen):
    """Overlapping windows of `size`, one starting every `slide`, aligned to the UTC epoch."""

    kind: Literal["sliding"] = "sliding"
    size_ms: PositiveDurationMs = Field(alias="size", description="Window length.")
    slide_ms: PositiveDurationMs = Field(alias="slide", description="Distance between starts.")

    @model_validator(mode="after")
    def _size_is_a_multiple_of_slide(self) -> SlidingWindow:
        # Otherwise windows would not align to the epoch the way Spark SQL's window() does.
        if self.size_ms % self.slide_ms != 0:
            raise ValueError(
                f"size ({self.size_ms} ms) must be a multiple of slide ({self.slide_ms} ms)"
            )
        return self


class SessionWindow(_Frozen):
    """Activity sessions: a window closes after `gap` without records; bridging records merge."""

    kind: Literal["session"] = "session"
    gap_ms: PositiveDurationMs = Field(alias="gap", description="Inactivity that ends a session.")


WindowSpec = Annotated[TumblingWindow | SlidingWindow | SessionWindow, Field(discriminator="kind")]


class Accumulation(StrEnum):
    ACCUMULATING = "accumulating"
    DISCARDING = "discarding"


class Emit(StrEnum):
    EVERY_PANE = "every_pane"
    FINAL_ONLY = "final_only"


class MetricKind(StrEnum):
    COUNT = "count"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    MEAN = "mean"


Scalar = str | int | float | bool


class MetricSpec(_Frozen):
    """A named aggregate per window besides `count`.

    `count` with `field` and `equals` counts records whose field equals the value (e.g. ERROR
    lines); `sum`, `min`, `max` and `mean` aggregate a numeric field, skipping records that
    lack it, like SQL skips nulls.
    """

    kind: MetricKind
    field: str | None = Field(default=None, min_length=1, description="Dot path into the record.")
    equals: Scalar | None = Field(default=None, description="`count` only: the value to match.")

    @model_validator(mode="after")
    def _fields_fit_the_kind(self) -> MetricSpec:
        if self.kind is MetricKind.COUNT:
            if (self.field is None) != (self.equals is None):
                raise ValueError("a filtered count needs both `field` and `equals`")
        else:
            if self.field is None:
                raise ValueError(f"`{self.kind}` needs a numeric `field`")
            if self.equals is not None:
                raise ValueError("`equals` only applies to `count`")
        return self

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.field.split(".")) if self.field else ()


class NotifyKind(StrEnum):
    WEBHOOK = "webhook"
    SLACK = "slack"


class NotifyOn(StrEnum):
    FINAL = "final"
    EVERY_PANE = "every_pane"


def check_endpoint_url(url: str) -> str:
    """Raise unless `url` is an absolute http(s) URL with a host; the error never quotes it."""
    if any(character.isspace() or not character.isprintable() for character in url):
        raise ValueError("the URL contains spaces or control characters")
    try:
        parts = urlsplit(url)
        has_host = bool(parts.hostname)
        parts.port  # noqa: B018 - raises for a port that is not a number in range
    except ValueError:
        raise ValueError("not a valid URL (check the host and port)") from None
    if parts.scheme.lower() not in URL_SCHEMES:
        raise ValueError(
            f"only http and https URLs are accepted (got scheme {parts.scheme or 'none'!r})"
        )
    if not has_host:
        raise ValueError("the URL has no host")
    return url


class NotifyTarget(_Frozen):
    """An endpoint told about a key's panes once they are committed (docs/notifications.md)."""

    kind: NotifyKind = Field(
        description="`webhook`: a JSON POST of the pane; `slack`: a Slack incoming-webhook message."
    )
    url: SecretStr = Field(
        description="An http(s) URL, `${ENV_VAR}` or `secret:path/to/file` (relative to the "
        "conf dir); a secret: never logged, stored or shown."
    )
    on: NotifyOn = Field(
        default=NotifyOn.FINAL,
        description="`final`: only a window's final pane; `every_pane`: each pane.",
    )
    timeout_ms: PositiveDurationMs = Field(
        default=5_000, alias="timeout", description="How long one request may take."
    )

    @model_validator(mode="before")
    @classmethod
    def _on_read_as_a_key(cls, data: object) -> object:
        # YAML 1.1 (PyYAML) reads a bare `on:` key as the boolean true.
        if isinstance(data, dict) and any(key is True for key in data):
            data = {("on" if key is True else key): value for key, value in data.items()}
        return data

    @field_validator("url")
    @classmethod
    def _url_is_http_or_a_reference(cls, url: SecretStr) -> SecretStr:
        text = url.get_secret_value().strip()
        if ENV_REFERENCE_RE.match(text):
            return SecretStr(text)
        if text.startswith(SECRET_FILE_PREFIX):
            if not text[len(SECRET_FILE_PREFIX) :].strip():
                raise ValueError("`secret:` needs a file path, e.g. `secret:hooks/acme.url`")
            return SecretStr(text)
        return SecretStr(check_endpoint_url(text))

    @field_serializer("url", when_used="always")
    def _url_as_configured(self, url: SecretStr) -> str:
        # The config snapshot must read back as written; `repr` and logs still show `**********`.
        return url.get_secret_value()


class RuleOverrides(_Frozen):
    """Window rules a tenant may override per source; unset fields keep the source's value."""

    window: WindowSpec | None = None
    out_of_orderness_ms: NonNegativeDurationMs | None = Field(
        default=None, alias="out_of_orderness"
    )
    allowed_lateness_ms: NonNegativeDurationMs | None = Field(
        default=None, alias="allowed_lateness"
    )
    accumulation: Accumulation | None = None
    emit: Emit | None = None
    metrics: dict[Identifier, MetricSpec] | None = None
    idle_timeout_ms: PositiveDurationMs | None = Field(default=None, alias="idle_timeout")
    max_future_skew_ms: PositiveDurationMs | None = Field(default=None, alias="max_future_skew")
    notify: tuple[NotifyTarget, ...] | None = Field(
        default=None, description="Replaces the source's `notify` list for this tenant."
    )


class WindowRules(_Frozen):
    """The rules one (tenant, source) key is windowed with."""

    window: WindowSpec = Field(description="How event time is cut into windows.")
    out_of_orderness_ms: NonNegativeDurationMs = Field(
        alias="out_of_orderness",
        description="How far behind the newest event time a record may be and still be on time.",
    )
    allowed_lateness_ms: NonNegativeDurationMs = Field(
        default=0,
        alias="allowed_lateness",
        description="How long after the watermark passes a window's end late records are accepted.",
    )
    accumulation: Accumulation = Field(
        default=Accumulation.ACCUMULATING,
        description="`accumulating`: a pane carries the window's totals so far; "
        "`discarding`: only its new records.",
    )

    emit: Emit = Field(
        default=Emit.EVERY_PANE,
        description="`every_pane`: every pane is a row; `final_only`: one row per window.",
    )
    metrics: dict[Identifier, MetricSpec] = Field(
        default_factory=dict, description="Named aggregates per window besides `count`."
    )
    idle_timeout_ms: PositiveDurationMs | None = Field(
        default=None,
        alias="idle_timeout",
        description="Processing time without records after which the key's watermark advances "
        "with processing time, so its windows close anyway. Unset: never.",
    )
    max_future_skew_ms: PositiveDurationMs = Field(
        default=3_600_000,
        alias="max_future_skew",
        description="Records further ahead of processing time are quarantined (`future_skew`).",
    )

    def with_overrides(self, overrides: RuleOverrides) -> WindowRules:
        # `notify` is not a window rule: windows never see it (`SourceConfig.notify_targets`).
        changes = {
            name: value
            for name, value in overrides
            if value is not None and name in WindowRules.model_fields
        }
        # Unchanged rules stay the source's own object, so what is derived from them per
        # process (`rules_id`) is computed once per source, not once per tenant.
        return self.model_copy(update=changes) if changes else self


def rules_id(rules: WindowRules) -> str:
    """The identity of a rule set: window state keeps, per window, the rules it opened with."""
    return hashlib.sha256(rules.model_dump_json().encode()).hexdigest()[:16]


class SourceConfig(WindowRules):
    """A kind of data source: where its event time is, and its default window rules."""

    event_time: EventTimeSpec
    # Kept out of WindowRules: window state stores its rules, and must hold no endpoint secret.
    notify: tuple[NotifyTarget, ...] = Field(
        default=(), description="Endpoints told about committed panes (docs/notifications.md)."
    )

    def rules(self) -> WindowRules:
        return WindowRules.model_validate(
            {name: getattr(self, name) for name in WindowRules.model_fields}
        )

    def notify_targets(self, overrides: RuleOverrides | None) -> tuple[NotifyTarget, ...]:
        """The endpoints of a tenant's key: its override's list if it sets one, else this one."""
        if overrides is not None and overrides.notify is not None:
            return overrides.notify
        return self.notify


class QueryLimits(BaseModel):
    """What one tenant's SQL may use in the query service: app defaults (`query:` in app.yaml),
    which a tenant's file may override field by field under its own `query:`."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True
    )

    statement_timeout_ms: PositiveDurationMs = Field(
        default=30_000,
        alias="statement_timeout",
        description="A statement still running after this is cancelled (its Spark jobs too).",
    )
    max_result_rows: int = Field(
        default=10_000, gt=0, description="Rows a result holds at most; more are cut off."
    )
    max_result_bytes: int = Field(
        default=8 * 1024 * 1024,
        gt=0,
        description="Bytes of JSON rows a result holds at most; more rows are cut off.",
    )
    max_concurrent_queries: int = Field(
        default=2, gt=0, description="A tenant's statements running at once; more get 429."
    )
    max_queries_per_minute: int = Field(
        default=120, gt=0, description="A tenant's statements per minute; more get 429."
    )
    max_statement_chars: int = Field(
        default=20_000, gt=0, description="Longer statements are refused with 413."
    )
    max_joins: int = Field(
        default=3,
        ge=0,
        description="Joins in one statement, views included (`window_contents` is one); more "
        "are refused up front: a join can multiply rows past what a timeout can stop.",
    )

    def with_overrides(self, overrides: dict[str, object]) -> QueryLimits:
        """These limits, with the fields a tenant's `query:` sets replaced."""
        tenant = QueryLimits.model_validate(overrides)
        own = {name: getattr(self, name) for name in QueryLimits.model_fields}
        return QueryLimits(**own).model_copy(
            update={name: getattr(tenant, name) for name in tenant.model_fields_set}
        )


class Quota(_Frozen):
    """How many records of one tenant the stream windows: a token bucket per Kafka partition.

    A tenant over it is slowed, never dropped: its excess records are deferred and windowed
    later, in order (docs/architecture.md, "Quotas and deferral").
    """

    records_per_second: float = Field(
        gt=0, description="Sustained rate: tokens added per second of processing time."
    )
    burst: int = Field(
        gt=0, description="Tokens a bucket holds at most: records windowed at once after a pause."
    )


def _sources_may_be_names(schema: dict[str, Any]) -> None:
    # The JSON Schema says what a file may contain, before `_allow_bare_source_names`.
    mapping = schema["properties"]["sources"]
    names = {"type": "array", "items": {"type": "string", "pattern": ID_PATTERN}, "minItems": 1}
    described = {key: mapping.pop(key) for key in ("title", "description") if key in mapping}
    schema["properties"]["sources"] = {**described, "anyOf": [mapping, names]}


class RuleSet(_Frozen):
    """What a tenant is configured with besides its id: the sources it sends, each with its
    rule overrides, and its own quota, retention and query limits.

    A named rule set (`rule_sets.yaml`) is validated once and shared, as one frozen object, by
    every tenant a tenant list names it for; a tenant file (`TenantConfig`) has its own."""

    model_config = ConfigDict(json_schema_extra=_sources_may_be_names)

    sources: dict[Identifier, RuleOverrides] = Field(min_length=1)
    quota: Quota | None = Field(
        default=None,
        description="This tenant's quota; unset: the stream's `default_quota` (app.yaml).",
    )
    retention_ms: PositiveDurationMs | None = Field(
        default=None,
        alias="retention",
        description="How long this tenant's rows are kept; unset: `lake.default_retention`.",
    )
    query: dict[str, object] = Field(
        default_factory=dict,
        description="Overrides of the query service's limits for this tenant (`QueryLimits`).",
    )

    @field_validator("query")
    @classmethod
    def _query_limits_are_limits(cls, query: dict[str, object]) -> dict[str, object]:
        QueryLimits.model_validate(query)  # names and values; defaults fill the rest
        return query

    @model_validator(mode="before")
    @classmethod
    def _allow_bare_source_names(cls, data: object) -> object:
        # `sources: [web, app]` is shorthand for sources without overrides.
        if isinstance(data, dict) and isinstance(data.get("sources"), list):
            data = {**data, "sources": {name: {} for name in data["sources"]}}
        return data


class _TenantId(_Frozen):
    id: Identifier


class TenantConfig(RuleSet, _TenantId):
    """One tenant: its id and the sources it sends, each with the tenant's rule overrides."""

    # `_TenantId` is a base so that `id` stays the first field (bases' fields come first, the
    # last base's first): error messages, schema and reference list it first, as files do.

    @classmethod
    def of_rule_set(cls, tenant_id: str, rule_set: RuleSet) -> TenantConfig:
        """The config of a tenant a list names `rule_set` for, without validating it again: it
        shares the rule set's (frozen) parts, so it costs one small object, built on demand."""
        return cls.model_construct(
            id=tenant_id,
            sources=rule_set.sources,
            quota=rule_set.quota,
            retention_ms=rule_set.retention_ms,
            query=rule_set.query,
        )
