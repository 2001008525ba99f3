"""Typed application settings: `conf/app.yaml`, then `TW_*` environment variables, then CLI flags.

Nested fields are overridden from the environment with a double underscore, e.g.
`TW_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:9092` or `TW_LAKE__ROOT=/data/lake`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from tenants.field_suggestions import problem_message
from tenants.models import (
    ID_PATTERN,
    NonNegativeDurationMs,
    PositiveDurationMs,
    QueryLimits,
    Quota,
)
from tenants.registry import ConfigError

ENV_PREFIX = "TW_"
# A record that closes a window reaches the broker within this of the window's end, unless its
# producer batches for longer (`StreamSettings.trigger_phase`).
DEFAULT_TRIGGER_PHASE_MS = 250


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


KafkaSecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class KafkaSaslSettings(_Frozen):
    """SASL credentials, for `security_protocol` SASL_SSL or SASL_PLAINTEXT."""

    mechanism: SaslMechanism | None = Field(default=None, description="PLAIN or SCRAM-SHA-*.")
    username: str | None = Field(default=None, description="The SASL user.")
    password: SecretStr | None = Field(
        default=None,
        description="Never logged. From TW_KAFKA__SASL__PASSWORD, or `kafka.secrets_file`.",
    )


class KafkaSslSettings(_Frozen):
    """TLS to the brokers, for `security_protocol` SSL or SASL_SSL."""

    ca_file: Path | None = Field(
        default=None,
        description="PEM bundle of the CAs that sign the brokers' certificates; unset: the "
        "system's trust store.",
    )
    cert_file: Path | None = Field(
        default=None, description="Mutual TLS: this client's certificate (PEM)."
    )
    key_file: Path | None = Field(
        default=None, description="Mutual TLS: the certificate's private key (PEM)."
    )
    check_hostname: bool = Field(
        default=True, description="Check that a broker's certificate names the host dialled."
    )


class KafkaSettings(_Frozen):
    bootstrap_servers: str = Field(
        default="127.0.0.1:9092", description="Comma-separated host:port list."
    )
    topic: str = Field(default="tenant-events", min_length=1)
    starting_offsets: str = Field(
        default="earliest",
        description="`earliest`, `latest` or Spark's JSON form; only for a new checkpoint.",
    )
    max_offsets_per_trigger: int | None = Field(
        default=50_000,
        gt=0,
        description="Upper bound of records per micro-batch; null reads all available.",
    )
    source_format: Literal["tw_kafka", "kafka"] = Field(
        default="tw_kafka",
        description="`tw_kafka` is this project's Python reader; "
        "`kafka` is Spark's own connector, where its jar exists.",
    )
    broker_timeout_ms: PositiveDurationMs = Field(
        default=120_000,
        alias="broker_timeout",
        description="How long the stream waits for an unreachable or silent broker (offset "
        "lookups, reads without progress; no single request waits longer) before the query "
        "fails with an error naming the bootstrap servers; restarted once the broker is back, "
        "it resumes from its checkpoint.",
    )
    security_protocol: KafkaSecurityProtocol = Field(
        default="PLAINTEXT",
        description="How every Kafka client connects: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or "
        "SASL_SSL (docs/operations.md, 'Connecting to a managed Kafka').",
    )
    sasl: KafkaSaslSettings = KafkaSaslSettings()
    ssl: KafkaSslSettings = KafkaSslSettings()
    secrets_file: Path | None = Field(
        default=None,
        description="A YAML file with `sasl_password`, e.g. a mounted secret; read when "
        "`sasl.password` is not set.",
    )
    group_id: str | None = Field(
        default=None,
        min_length=1,
        description="The consumer group each committed batch's end offsets are mirrored to, "
        "for Kafka's own lag tools (never read back: the checkpoint is the truth); unset: the "
        "stream's name.",
    )
    mirror_offsets: bool = Field(
        default=True,
        description="Mirror the committed offsets to `group_id`; false: no consumer group.",
    )
    mirror_interval_ms: int = Field(
        default=5_000,
        ge=0,
        description="The least time between two mirrors of the offsets, as Kafka's own "
        "consumers commit every `auto.commit.interval.ms`: the group trails the checkpoint by at "
        "most this long while batches run, and holds its offsets once the stream is idle or "
        "stopped; 0: after every batch.",
    )

    @model_validator(mode="after")
    def _security_is_complete(self) -> KafkaSettings:
        """Refuse at start what a broker would refuse later, naming the field and the fix."""
        problems: list[str] = []
        if self.security_protocol.startswith("SASL_"):
            if self.sasl.mechanism is None:
                problems.append(
                    f"sasl.mechanism: required with security_protocol {self.security_protocol} "
                    "(PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"
                )
            if not self.sasl.username:
                problems.append(
                    f"sasl.username: required with security_protocol {self.security_protocol}"
                )
            if self.sasl.password is None and self.secrets_file is None:
                problems.append(
                    f"sasl.password: required with security_protocol {self.security_protocol}: "
                    "set TW_KAFKA__SASL__PASSWORD, or kafka.secrets_file"
                )
        if (self.ssl.cert_file is None) != (self.ssl.key_file is None):
            problems.append("ssl.cert_file and ssl.key_file: set both for mutual TLS, or neither")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self.ssl, name)
            if path is not None and not path.is_file():
                problems.append(f"ssl.{name}: no file {path} (a PEM file this process can read)")
        if self.secrets_file is not None and not self.secrets_file.is_file():
            problems.append(f"secrets_file: no file {self.secrets_file}")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class S3Settings(_Frozen):
    """How to reach an S3-compatible store for an `s3://` lake root.

    Keys come from here (e.g. `TW_LAKE__S3__SECRET_ACCESS_KEY`), from `secrets_file`, or, when
    neither sets them, from the standard `AWS_*` environment variables that delta-rs reads.
    """

    endpoint_url: str | None = Field(
        default=None, description="Unset for AWS; e.g. `http://127.0.0.1:9000` for MinIO."
    )
    region: str = Field(default="us-east-1", description="The bucket's region.")
    allow_http: bool = Field(default=False, description="Allow a plain-HTTP endpoint.")
    access_key_id: SecretStr | None = Field(default=None, description="Never logged.")
    secret_access_key: SecretStr | None = Field(default=None, description="Never logged.")
    secrets_file: Path | None = Field(
        default=None,
        description="A YAML file with `access_key_id` and `secret_access_key`, e.g. a mounted "
        "secret; read when the keys are not set directly.",
    )
    timeout_ms: PositiveDurationMs = Field(
        default=20_000,
        alias="timeout",
        description="The longest one S3 request may take, connecting (at most 5 s of it) "
        "included, in every S3 client: delta-rs on the driver (commits, lease renewals) and "
        "pyarrow on executors (data files, 2 attempts). A store that accepts connections and "
        "then stalls fails the micro-batch with an error naming the endpoint, within about "
        'twice this plus Spark\'s overhead; see docs/operations.md, "Hung dependencies".',
    )

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True
    )


class LakeSettings(_Frozen):
    root: str = Field(default="data/lake", description="A local path or `s3://bucket/prefix`.")
    s3: S3Settings = Field(default_factory=S3Settings, description="Used for `s3://` roots.")
    default_retention_ms: PositiveDurationMs | None = Field(
        default=None,
        alias="default_retention",
        description=(
            "How long a tenant's rows are kept, counted from its window's end (quarantined "
            "records: their ingest date), for tenants whose file sets no `retention`; "
            "`tenant-windows retain` deletes older ones. Unset: kept until purged."
        ),
    )
    vacuum_retention_ms: NonNegativeDurationMs = Field(
        default=604_800_000,
        alias="vacuum_retention",
        description=(
            "How long a file an older table version needs is kept after a commit removed it "
            "(compaction removes staged files every `merge_interval`): time travel reaches this "
            "far back, and a query that opened an older version must end within it. The "
            "stream's vacuum (`stream.vacuum_interval`) and `tenant-windows vacuum` then "
            "delete it. Rounded up to whole hours; `0s` only where no reader can lag."
        ),
    )


class StreamSettings(_Frozen):
    name: str = Field(
        default="tenant-windows",
        pattern=ID_PATTERN,
        description="The stream's identity: Delta transaction app id and checkpoint folder name.",
    )
    checkpoint_dir: str = Field(
        default="data/checkpoints/tenant-windows",
        description="Spark's checkpoint (Kafka offsets and window state) for this stream.",
    )
    trigger_interval_ms: PositiveDurationMs = Field(
        default=5_000,
        alias="trigger_interval",
        description=(
            "How often a micro-batch starts when the stream runs continuously (`tenant-windows "
            "run` without `--available-now`): on whole multiples of this since the epoch "
            "(Spark's processing-time trigger), or at once when the last batch took longer."
        ),
    )
    trigger_phase_ms: NonNegativeDurationMs | None = Field(
        default=None,
        alias="trigger_phase",
        description=(
            "A micro-batch that starts on its trigger's tick takes its Kafka end offsets this "
            "long after it (the `tw_kafka` source). Windows end on the same whole seconds, so "
            "the record that closes one arrives just after a tick; with a phase it makes that "
            "tick's batch instead of the next, and the final pane is out an interval sooner. "
            "Other records wait as long as before on average. Shorter than `trigger_interval`; "
            f"unset: a quarter of it, at most {DEFAULT_TRIGGER_PHASE_MS} ms; `0s`: none."
        ),
    )
    config_recheck_interval_ms: PositiveDurationMs = Field(
        default=60_000,
        alias="config_recheck_interval",
        description=(
            "A bucket of keys with state wakes at least this often (processing time) to close "
            "the keys whose tenant config is gone (offboarding); it looks at its keys only when "
            "the config changed. Timeouts fire in batches without data only in the continuous "
            "stream, not with `--available-now`."
        ),
    )
    shuffle_partitions: int = Field(
        default=4, gt=0, description="State partitions; frozen once a checkpoint exists."
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65_535,
        description=(
            "Serve Prometheus metrics on this port (`run --metrics-port`; 0: any free port, "
            "logged). Unset: no metrics endpoint."
        ),
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="The address the metrics endpoint binds; `0.0.0.0` for a scraper elsewhere.",
    )
    metrics_top_tenants: int = Field(
        default=10,
        ge=0,
        le=1_000,
        description=(
            "Per-tenant metric series only for this many tenants, those with the largest "
            'watermark delay and backlog, plus `tenant="_other"` for the rest: one series per '
            "tenant would be about a million at 100,000 tenants (docs/operations.md)."
        ),
    )
    metrics_all_tenants: bool = Field(
        default=False,
        description=(
            "Per-tenant metric series for every tenant, not only the top "
            "`metrics_top_tenants`: for a few hundred tenants, or a Prometheus sized for it."
        ),
    )

    @property
    def effective_trigger_phase_ms(self) -> int:
        """`trigger_phase`, or its default for this `trigger_interval`."""
        if self.trigger_phase_ms is not None:
            return self.trigger_phase_ms
        return min(DEFAULT_TRIGGER_PHASE_MS, self.trigger_interval_ms // 4)

    @model_validator(mode="after")
    def _trigger_phase_within_interval(self) -> StreamSettings:
        if self.trigger_phase_ms is not None and self.trigger_phase_ms >= self.trigger_interval_ms:
            raise ValueError(
                f"trigger_phase: {self.trigger_phase_ms} ms must be shorter than "
                f"trigger_interval ({self.trigger_interval_ms} ms); 0s for none"
            )
        return self

    @property
    def metrics_tenant_limit(self) -> int | None:
        """How many tenants get metric series of their own; None: every tenant."""
        return None if self.metrics_all_tenants else self.metrics_top_tenants

    state_buckets: int | None = Field(
        default=None,
        gt=0,
        description=(
            "Keys are grouped into this many hash buckets of state, so Spark's per-group cost "
            "does not grow with the number of tenants; frozen once a checkpoint exists. Unset: "
            "the checkpoint's, or 16 for a new one."
        ),
    )
    compact_interval_ms: NonNegativeDurationMs = Field(
        default=21_600_000,
        alias="compact_interval",
        description=(
            "The age limit of staged rows. A micro-batch stages its rows in a few files shared by "
            "all tenants; a key's rows settle in their tenant's partitions once they are worth a "
            "file (`settle_rows`) or, at the latest, this long plus one batch and one compaction "
            "after they were staged, and when an `--available-now` run ends (`0s`: after every "
            "batch). Queries see staged rows at once; a longer limit writes fewer files per "
            "tenant (docs/scale.md)."
        ),
    )
    merge_interval_ms: PositiveDurationMs = Field(
        default=600_000,
        alias="merge_interval",
        description=(
            "How often compaction runs: it starts after the first batch whose timestamp is in "
            "a new interval of this length (at most `compact_interval`) and runs beside the "
            "batches that follow. It merges the batches' staged files into one run per write "
            "task and settles the keys worth a file, so a query reads a few staged files, not "
            "one per batch and task; it also packs `tenant_status`, `quarantine` and "
            "`deliveries` once one holds 100 files."
        ),
    )
    vacuum_interval_ms: NonNegativeDurationMs = Field(
        default=3_600_000,
        alias="vacuum_interval",
        description=(
            "How often the stream deletes the files older table versions needed once "
            "`lake.vacuum_retention` has passed: after the first compaction in each new "
            "interval of this length, from the log alone, without listing the lake. `0s`: "
            "never (then only `tenant-windows vacuum` deletes them)."
        ),
    )
    settle_rows: int = Field(
        default=2_000,
        gt=0,
        description=(
            "A key (tenant, source) whose new staged rows in a table number at least this many "
            "when compaction runs settles them in its partition at once: a file worth writing. "
            "Keys with fewer wait in the merged runs until `compact_interval`."
        ),
    )
    settle_slice_files: int = Field(
        default=25_000,
        gt=0,
        description=(
            "A compaction that settles more files than this in one table commits them in "
            "slices of tenants, each adding about this many, so the driver holds one slice's "
            "files at a time whatever the number of tenants; every commit keeps each row "
            "visible exactly once."
        ),
    )
    compaction_yields_cpu: bool = Field(
        default=True,
        description=(
            "Compaction's tasks beside the micro-batches run at the lowest CPU priority of their "
            "executor (nice 19, on Linux): they take only the CPU the batches leave, so a "
            "compaction takes longer on a busy host and the batches do not wait for it (between "
            "the batches of an `--available-now` run it has the cores to itself). `false`: they "
            "compete with the batches as equals."
        ),
    )
    log_checkpoint_files: int = Field(
        default=5_000,
        gt=0,
        description=(
            "A compaction that swaps at least this many files in a table writes a checkpoint of "
            "that table's Delta log, so the next reader loads one Parquet file instead of "
            "replaying each of those actions from JSON (docs/scale.md)."
        ),
    )
    optimize_every_batches: int | None = Field(
        default=None,
        gt=0,
        description=(
            "Compact small files and checkpoint every table's log after every this many "
            "micro-batches, between batches; unset: only `tenant-windows optimize` does it."
        ),
    )
    max_record_bytes: int = Field(
        default=1_048_576, gt=0, description="Larger Kafka values are quarantined (`too_large`)."
    )
    lease_ttl_ms: PositiveDurationMs = Field(
        default=30_000,
        alias="lease_ttl",
        description=(
            "One writer per stream: an instance that has not renewed its lease (every third of "
            "this) for this long may be taken over. Keep it well above clock skew between hosts."
        ),
    )
    standby_poll_interval_ms: PositiveDurationMs = Field(
        default=500,
        alias="standby_poll_interval",
        description=(
            "How often `run --standby` looks at the lease: a holder that stopped is taken over "
            "within this, one that died on another host after `lease_ttl`. Each look reads the "
            "lease table (a few requests on S3). A holder on the standby's own host is also "
            "watched by its process id in between, so its death is noticed within 20 ms."
        ),
    )
    standby_rehearsal: bool = Field(
        default=True,
        description=(
            "Before `run --standby` waits, it runs the stream once on scratch locations (a lake "
            "under the lake root's `_rehearsal/`, a checkpoint beside the stream's, the topic's "
            "newest records, no webhooks) until a batch with records commits, or for 30 s after "
            "its first batch, then removes them: a takeover's first batch then finds Spark and "
            "its workers warm."
        ),
    )

    default_quota: Quota | None = Field(
        default=None,
        description=(
            "The quota of every tenant whose file sets none: `{records_per_second, burst}`, a "
            "token bucket per tenant and Kafka partition; a tenant over it is deferred, never "
            "dropped. Unset: only `window_budget` slows tenants down."
        ),
    )
    window_budget: int | None = Field(
        default=None,
        gt=0,
        description=(
            "Records a micro-batch windows at most, shared between its Kafka partitions; when "
            "more are waiting, every tenant with records waiting gets a fair share and the rest "
            "are deferred. Unset: no limit beyond `kafka.max_offsets_per_trigger` and quotas."
        ),
    )
    max_deferred_records: int = Field(
        default=1_000_000,
        gt=0,
        description=(
            "Deferred records a Kafka partition holds at most; while it holds more, the stream "
            "reads that partition no further ahead than it windows."
        ),
    )

    stop_grace_ms: PositiveDurationMs = Field(
        default=60_000,
        alias="stop_grace",
        description=(
            "On SIGTERM or SIGINT the stream lets the micro-batch in progress finish and commit, "
            "waiting at most this long, then stops; a second signal stops it at once."
        ),
    )

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True
    )


class NotifySettings(_Frozen):
    """How committed panes are delivered to `notify` endpoints (docs/notifications.md)."""

    max_attempts: int = Field(
        default=5, gt=0, description="Attempts per delivery before it is dead-lettered."
    )
    first_backoff_ms: PositiveDurationMs = Field(
        default=1_000,
        alias="first_backoff",
        description="Ceiling of the random wait after the first failed attempt; it doubles "
        "after each further failure (full jitter).",
    )
    max_backoff_ms: PositiveDurationMs = Field(
        default=60_000, alias="max_backoff", description="Largest ceiling of that wait."
    )
    endpoint_workers: int = Field(
        default=8,
        gt=0,
        description="Delivery threads shared by all endpoints; an endpoint is served by one "
        "at a time and not at all while it backs off, so a slow endpoint occupies at most one.",
    )
    poll_interval_ms: PositiveDurationMs = Field(
        default=1_000,
        alias="poll_interval",
        description="How often the `windows` table is checked for newly committed panes.",
    )

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True
    )


class QuarantineLogSettings(_Frozen):
    """How the stream reports quarantined records in its log. The log only summarises: every
    quarantined record is in the `quarantine` table."""

    examples: int = Field(
        default=3,
        ge=0,
        le=20,
        description="Quarantined records quoted under each summary line (tenant, source, Kafka "
        "coordinates, reason, error; never the raw key or value); 0 quotes none.",
    )
    interval_ms: NonNegativeDurationMs = Field(
        default=10_000,
        alias="interval",
        description="At most one summary line (with its examples) this often. Batches that "
        "quarantine records in between are counted into the next summary, or into one at a "
        "graceful stop; 0 summarises every such batch on its own.",
    )

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True
    )


class QuerySettings(QueryLimits):
    """The query service (`tenant-windows serve`, docs/querying.md): every tenant's limits, the
    operator's key, and where its metrics are served."""

    operator_key: SecretStr | None = Field(
        default=None,
        description="Bearer key for unscoped queries (all tenants, `deliveries`): from the "
        "environment (TW_QUERY__OPERATOR_KEY), or `secret:path/to/file` (relative to the conf "
        "dir). Never logged.",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65_535,
        description=(
            "Serve the query service's Prometheus metrics on this port (`serve --metrics-port`; "
            "0: any free port, logged), a listener apart from the API's port, which never "
            "answers `/metrics`. Unset: no metrics endpoint."
        ),
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="The address the metrics endpoint binds; `0.0.0.0` for a scraper elsewhere.",
    )
    local_engine: bool = Field(
        default=True,
        description=(
            "Answer a tenant's small statements in this process with DuckDB over the tenant's "
            "rows, where it gives Spark's answer (docs/querying.md, 'Latency'); false: every "
            "statement is a Spark job."
        ),
    )
    local_max_tenant_bytes: int = Field(
        default=256 * 1024 * 1024,
        gt=0,
        description="A tenant whose rows of one table (in memory) pass this is answered by "
        "Spark, not in-process.",
    )
    local_cache_bytes: int = Field(
        default=2 * 1024 * 1024 * 1024,
        gt=0,
        description="Memory for tenants' rows kept between statements; the least recently "
        "queried tenant's rows go first.",
    )
    table_follow_interval_ms: int = Field(
        default=250,
        gt=0,
        description=(
            "How often `serve` reads the tables' new commits, in a thread of its own, so no "
            "statement waits for them: a commit is queryable this long (plus reading it) after "
            "it lands."
        ),
    )


class AppSettings(_Frozen):
    conf_dir: Path = Field(default=Path("conf"), description="Holds sources.yaml and tenants/.")
    kafka: KafkaSettings = KafkaSettings()
    lake: LakeSettings = LakeSettings()
    stream: StreamSettings = StreamSettings()
    notify: NotifySettings = Field(
        default_factory=NotifySettings, description="Delivery of pane notifications."
    )
    quarantine_log: QuarantineLogSettings = Field(
        default_factory=QuarantineLogSettings,
        description="How quarantined records are summarised in the stream's log.",
    )
    query: QuerySettings = Field(
        default_factory=QuerySettings,
        description="Limits of the query service, and its metrics endpoint.",
    )


def read_secrets_file(path: Path, names: tuple[str, ...]) -> dict[str, SecretStr]:
    """The secrets `names` from a YAML mapping (e.g. a mounted secret), each required."""
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        # Only the error's kind: its text could quote the file's content.
        raise ConfigError(path, [("", f"unreadable ({type(error).__name__})")]) from None
    if not isinstance(loaded, dict):
        raise ConfigError(path, [("", "must be a YAML mapping")])
    missing = [name for name in names if not loaded.get(name)]
    if missing:
        raise ConfigError(path, [(name, "missing") for name in missing])
    return {name: SecretStr(str(loaded[name])) for name in names}


def load_settings(
    app_file: Path | None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> AppSettings:
    """Merge the YAML file, `TW_*` variables and explicit overrides (dotted keys), in that order."""
    data: dict[str, Any] = {}
    if app_file is not None:
        try:
            loaded = yaml.safe_load(app_file.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as error:
            raise ConfigError(app_file, [("", str(error))]) from None
        if not isinstance(loaded, dict):
            raise ConfigError(app_file, [("", "must be a YAML mapping")])
        data = loaded
    environ = os.environ if environ is None else environ
    for name, value in environ.items():
        if name.startswith(ENV_PREFIX):
            _set_dotted(data, name[len(ENV_PREFIX) :].lower().replace("__", "."), value)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, dotted, value)
    try:
        return AppSettings.model_validate(data)
    except ValidationError as error:
        problems = [
            (".".join(str(p) for p in detail["loc"]), problem_message(AppSettings, detail))
            for detail in error.errors()
        ]
        raise ConfigError(app_file or "(environment)", problems) from None


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[leaf] = value
