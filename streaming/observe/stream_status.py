"""What `tenant-windows status` shows, gathered without Spark and without the writer lease.

Every part is a plain read that works while the stream runs: the latest `tenant_status` row per
key (delta-rs and pyarrow), Kafka lag (the broker's end offsets against the offsets in Spark's
checkpoint log), the last batch's summary the driver keeps in the checkpoint, the lease table,
how far notifications have got, and the ones that went to dead-letter. A part that cannot be
read (a broker down, no checkpoint yet) becomes a section that says why, so the others are
still shown.

Each part is a `StatusSection`: a title and rows of named values.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from pydantic import BaseModel, ConfigDict

from storage.lake.delivery_outbox import DeliveryOutbox, dead_letter_summary
from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import TENANT_STATUS, WINDOWS
from storage.lake.writer_lease import read_lease
from streaming.checkpoint.checkpoint_log import (
    COMMITS_DIR,
    OFFSETS_DIR,
    CheckpointLog,
    checkpoint_filesystem,
)
from streaming.kafka.client import (
    KafkaSecurity,
    KafkaUnavailableError,
    check_broker_security,
    kafka_python_consumer,
    require_a_reachable_broker,
)
from streaming.kafka.deferral import DeferralStore, batch_key
from streaming.observe.batch_progress import LastBatchFile
from tenants.conf_reader import load_registry
from tenants.registry import TenantRegistry
from tenants.settings import AppSettings, KafkaSettings

log = logging.getLogger(__name__)

KAFKA_TIMEOUT_MS = 5_000
CONNECT_TIMEOUT_S = 1.0
NO_DATA_YET = "no data yet"
NOT_THERE_YET = "does not exist (yet)"
LOCATIONS = "lake and checkpoint"
KEYS = "keys"
KAFKA_LAG = "kafka lag"
DEFERRED = "deferred (quotas and fair share)"
LAST_BATCH = "last batch"
WRITER_LEASE = "writer lease"
NOTIFICATIONS = "notifications"
DEAD_LETTERS = "dead-letter notifications"
_KEY_COLUMNS = [
    "watermark",
    "max_event_time",
    "open_windows",
    "on_time_records",
    "late_records",
    "too_late_records",
    "quarantined_records",
    "lifecycle",
    "batch_id",
]


class StatusSection(BaseModel):
    """One titled part of the status: rows of named values, and a note (e.g. why it is empty)."""

    model_config = ConfigDict(frozen=True)

    title: str
    rows: list[dict[str, Any]]
    note: str | None = None


SectionSource = Callable[[AppSettings, DeltaLake], StatusSection]
"""Reads one section; given the settings and the lake."""


def gather_status(settings: AppSettings) -> list[StatusSection]:
    """Every section, in display order."""
    lake = DeltaLake.from_settings(settings.lake)
    # Read once, when a section first needs it (seconds at 100,000 tenants); a config that
    # cannot be read then fails only the sections that need it.
    registry = functools.cache(lambda: load_registry(settings.conf_dir))
    readers: dict[str, SectionSource] = {
        LOCATIONS: locations_section,
        KEYS: functools.partial(key_status_section, registry=registry),
        KAFKA_LAG: kafka_lag_section,
        DEFERRED: deferred_section,
        LAST_BATCH: last_batch_section,
        WRITER_LEASE: writer_lease_section,
        NOTIFICATIONS: functools.partial(notification_progress_section, registry=registry),
        DEAD_LETTERS: dead_letter_section,
    }
    return [_guarded(title, reader, settings, lake) for title, reader in readers.items()]


def _guarded(
    title: str, reader: SectionSource, settings: AppSettings, lake: DeltaLake
) -> StatusSection:
    try:
        return reader(settings, lake)
    except Exception as error:
        # One unreadable part must not hide the others.
        return StatusSection(title=title, rows=[], note=f"could not be read: {error}")


# -- where status looked ---------------------------------------------------------------------


def locations_section(settings: AppSettings, lake: DeltaLake) -> StatusSection:
    """The lake root and checkpoint status read, and whether they are there. `status` with no
    flags reads the defaults of `conf/app.yaml`; when the stream ran with other ones, this
    says where it looked and what to give it, instead of a reader's error."""
    rows = [
        {
            "part": "lake",
            "path": settings.lake.root,
            "config": "lake.root",
            "flag": "--lake-root",
            "state": _lake_state(lake),
        },
        {
            "part": "checkpoint",
            "path": settings.stream.checkpoint_dir,
            "config": "stream.checkpoint_dir",
            "flag": "--checkpoint-dir",
            "state": _checkpoint_state(settings.stream.checkpoint_dir),
        },
    ]
    missing = [row for row in rows if row["state"] == NOT_THERE_YET]
    return StatusSection(title=LOCATIONS, rows=rows, note=where_to_look(missing) or None)


def where_to_look(missing: list[dict[str, Any]]) -> str:
    """What to give `status` when a part it read is not there: the flags, config keys and
    variables that name it. Empty when nothing is missing."""
    if not missing:
        return ""
    named = " and ".join(f"{row['path']} ({row['config']})" for row in missing)
    verb = "does" if len(missing) == 1 else "do"
    flags = " and ".join(f"{row['flag']} DIR" for row in missing)
    keys = " and ".join(row["config"] for row in missing)
    variables = " and ".join("TW_" + row["config"].replace(".", "__").upper() for row in missing)
    return (
        f"{named} {verb} not exist (yet): the stream has not run with this config, or it runs "
        f"with another one. Give status what run was given: --app-config FILE, or {flags} "
        f"(in the config: {keys}; in the environment: {variables})"
    )


def _lake_state(lake: DeltaLake) -> str:
    if DeltaTable.is_deltatable(lake.table_uri(TENANT_STATUS), lake.storage_options):
        return "found"
    if lake.local_path is not None and not lake.local_path.exists():
        return NOT_THERE_YET
    return "no tenant_status table (yet)"


def _checkpoint_state(checkpoint_dir: str) -> str:
    filesystem, path = checkpoint_filesystem(checkpoint_dir)
    if filesystem.get_file_info(path).type == pafs.FileType.NotFound:
        return NOT_THERE_YET
    if CheckpointLog(checkpoint_dir).latest_batch(OFFSETS_DIR) is None:
        return "no batch yet"
    return "found"


# -- keys: the latest tenant_status row per (tenant, source) ------------------------------------


def latest_per_key(status_rows: pa.Table) -> pa.Table:
    """The row of the highest `batch_id` per (tenant, source), vectorised, ordered by key."""
    if status_rows.num_rows == 0:
        return status_rows.select(["tenant", "source", *_KEY_COLUMNS])
    ordered = status_rows.sort_by([("batch_id", "ascending")])
    # "last" is an ordered aggregation: without threads it follows the sorted input.
    latest = ordered.group_by(["tenant", "source"], use_threads=False).aggregate(
        [(column, "last") for column in _KEY_COLUMNS]
    )
    latest = latest.rename_columns([name.removesuffix("_last") for name in latest.column_names])
    return latest.sort_by([("tenant", "ascending"), ("source", "ascending")])


def key_status_section(
    settings: AppSettings, lake: DeltaLake, registry: Callable[[], TenantRegistry]
) -> StatusSection:
    """Watermark, how far it trails the newest record, open windows and counters per key;
    configured keys without a row yet are listed as having no data."""
    configured = set(registry().configured_keys())
    note = "trailing_s: newest event time minus the watermark"
    try:
        latest = latest_status_rows(lake, configured)
    except TableNotFoundError:
        # Not delta-rs's "Local path ... does not exist": the lake section says what to give.
        latest = latest_per_key(TENANT_STATUS.schema.empty_table())
        note = f"no tenant_status table under {lake.root} (lake.root) yet: the configured keys"
    rows = {(row["tenant"], row["source"]): row for row in _key_rows(latest)}
    for key in configured:
        rows.setdefault(key, {"tenant": key[0], "source": key[1], "watermark": NO_DATA_YET})
    return StatusSection(title=KEYS, rows=[rows[key] for key in sorted(rows)], note=note)


def latest_status_rows(lake: DeltaLake, configured: set[tuple[str, str]]) -> pa.Table:
    """The latest `tenant_status` row per key. The table is every key's history: it is read
    from its newest batches back, only until every configured key has a row (a key gets one in
    the batch it is configured) no older than any row left unread, not all of it. Keys no
    longer configured are in it if their last row is that recent."""
    columns = ["tenant", "source", *_KEY_COLUMNS]
    return latest_per_key(lake.read_newest(TENANT_STATUS, columns, latest_of_each(configured)))


def latest_of_each(keys: set[tuple[str, str]]) -> Callable[[pa.Table, int], bool]:
    """`read_newest_first`'s `enough` for the latest row of each of `keys`: each has a row read
    no older than `unread_batch_id`, the newest batch a file left unread may hold."""

    def enough(rows: pa.Table, unread_batch_id: int) -> bool:
        newest = rows.group_by(["tenant", "source"]).aggregate([("batch_id", "max")])
        read = dict(
            zip(
                zip(newest["tenant"].to_pylist(), newest["source"].to_pylist(), strict=True),
                newest["batch_id_max"].to_pylist(),
                strict=True,
            )
        )
        return all(read.get(key, -1) >= unread_batch_id for key in keys)

    return enough


def slowest_keys(lake: DeltaLake, registry: TenantRegistry) -> dict[str, tuple[str, int]]:
    """Each tenant's slowest key: its source and watermark (ms), from the keys' latest
    `tenant_status` rows; tenants without a watermark yet are left out."""
    latest = latest_status_rows(lake, set(registry.configured_keys()))
    with_watermark = latest.filter(pc.is_valid(latest["watermark"])).sort_by(
        [("tenant", "ascending"), ("watermark", "ascending"), ("source", "ascending")]
    )
    # Sorted so, a tenant's first row is its slowest key.
    tenants = with_watermark["tenant"].combine_chunks()
    first = pa.concat_arrays(
        [pa.array([True] * min(len(tenants), 1)), pc.not_equal(tenants[1:], tenants[:-1])]
    )
    slowest = with_watermark.filter(first).select(["tenant", "source", "watermark"])
    return {
        row["tenant"]: (row["source"], int(row["watermark"].timestamp() * 1000))
        for row in slowest.to_pylist()
    }


def tenant_key_status(lake: DeltaLake, tenant: str) -> list[dict[str, Any]]:
    """One tenant's keys as `key_status_section` shows them, read from its own files only."""
    columns = ["tenant", "source", *_KEY_COLUMNS]
    table = lake.read_arrow(TENANT_STATUS, columns, ds.field("tenant") == tenant, tenant=tenant)
    return _key_rows(latest_per_key(table))


def _key_rows(latest: pa.Table) -> list[dict[str, Any]]:
    trailing_ms = pc.subtract(
        pc.cast(latest["max_event_time"], pa.int64()), pc.cast(latest["watermark"], pa.int64())
    )
    latest = latest.append_column("trailing_ms", pc.divide(trailing_ms, 1_000))
    return [
        {
            "tenant": row["tenant"],
            "source": row["source"],
            # A `configured` row: the key is known but has not sent anything yet.
            "watermark": NO_DATA_YET if row["watermark"] is None else _iso(row["watermark"]),
            "trailing_s": None if row["trailing_ms"] is None else row["trailing_ms"] / 1000,
            "open_windows": row["open_windows"],
            "on_time": row["on_time_records"],
            "late": row["late_records"],
            "too_late": row["too_late_records"],
            "quarantined": row["quarantined_records"],
            # null on rows written before the column existed
            "lifecycle": row["lifecycle"],
            "batch_id": row["batch_id"],
        }
        for row in latest.to_pylist()
    ]


# -- Kafka lag: broker end offsets against the checkpoint's offsets ----------------------------


def kafka_lag_section(settings: AppSettings, _lake: DeltaLake) -> StatusSection:
    checkpoint = CheckpointLog(settings.stream.checkpoint_dir)
    committed = checkpoint.latest_batch(COMMITS_DIR)
    planned = checkpoint.latest_batch(OFFSETS_DIR)
    topic = settings.kafka.topic
    written = {} if committed is None else checkpoint.offsets(committed, topic)
    try:
        end_offsets = broker_end_offsets(settings.kafka, topic)
    except KafkaUnavailableError as error:
        return StatusSection(title=KAFKA_LAG, rows=[], note=str(error))
    rows = [
        {
            "topic": topic,
            "partition": partition,
            "end_offset": end,
            "committed_offset": written.get(partition),
            "lag": end - written[partition] if partition in written else None,
        }
        for partition, end in sorted(end_offsets.items())
    ]
    if committed is None:
        note = no_checkpoint_note(settings, checkpoint) or "no batch committed yet: nothing read"
    else:
        note = f"committed offsets: after batch {committed}, the last one written to the tables"
        if planned is not None and planned != committed:
            note += f"; batch {planned} is in progress"
    return StatusSection(title=KAFKA_LAG, rows=rows, note=note)


def deferred_section(settings: AppSettings, lake: DeltaLake) -> StatusSection:
    """Per tenant slowed down after the last committed batch: records waiting in deferral, the
    oldest one's age, and whether its quota's tokens are spent."""
    checkpoint = CheckpointLog(settings.stream.checkpoint_dir)
    committed = checkpoint.latest_batch(COMMITS_DIR)
    if committed is None:
        why = no_checkpoint_note(settings, checkpoint) or "no batch committed yet"
        return StatusSection(title=DEFERRED, rows=[], note=why)
    store = DeferralStore.for_stream(settings.stream, lake.root, lake.storage_options or {})
    rows = store.tenants_waiting(
        batch_key(checkpoint.source_offset(committed)), int(time.time() * 1000)
    )
    note = None if rows else "no tenant is over its quota or waiting for its fair share"
    return StatusSection(title=DEFERRED, rows=rows, note=note)


def backlog_records(settings: AppSettings) -> int | None:
    """Records the stream has yet to read: the broker's end offsets minus the last committed
    batch's offsets (a new checkpoint starting at `earliest`: the beginning offsets); None
    when a new checkpoint starts elsewhere."""
    checkpoint = CheckpointLog(settings.stream.checkpoint_dir)
    committed = checkpoint.latest_batch(COMMITS_DIR)
    topic = settings.kafka.topic
    if committed is not None:
        start = checkpoint.offsets(committed, topic)
    elif settings.kafka.starting_offsets == "earliest":
        start = broker_end_offsets(settings.kafka, topic, beginning=True)
    else:
        return None
    end = broker_end_offsets(settings.kafka, topic)
    return sum(max(offset - start.get(partition, 0), 0) for partition, offset in end.items())


def broker_end_offsets(kafka: KafkaSettings, topic: str, beginning: bool = False) -> dict[int, int]:
    """The next offset to be written (`beginning`: the first one kept), per partition of
    `topic`; every wait is bounded, and a broker that refuses connections fails at once."""
    require_a_reachable_broker(kafka.bootstrap_servers, CONNECT_TIMEOUT_S)
    security = KafkaSecurity.of(kafka)
    check_broker_security(kafka.bootstrap_servers, security, KAFKA_TIMEOUT_MS / 1000)
    consumer = kafka_python_consumer(
        kafka.bootstrap_servers,
        request_timeout_ms=KAFKA_TIMEOUT_MS,
        client_id="tenant-windows-status",
        budget_ms=KAFKA_TIMEOUT_MS,
        security=security,
    )
    try:
        partitions = _partitions_of(consumer, topic)
        wanted = [TopicPartition(topic, p) for p in partitions]
        ends = consumer.beginning_offsets(wanted) if beginning else consumer.end_offsets(wanted)
    finally:
        consumer.close()
    return {tp.partition: offset for tp, offset in ends.items()}


def _partitions_of(consumer: KafkaConsumer, topic: str) -> list[int]:
    deadline = time.monotonic() + KAFKA_TIMEOUT_MS / 1000
    while True:
        partitions = consumer.partitions_for_topic(topic)
        if partitions:
            return sorted(partitions)
        if time.monotonic() > deadline:
            raise KafkaError(f"topic {topic!r} has no partitions on the broker")
        time.sleep(0.1)


# -- the last batch, as the driver recorded it -------------------------------------------------


def no_checkpoint_note(settings: AppSettings, checkpoint: CheckpointLog) -> str | None:
    """Why a section that reads the checkpoint is empty when there is no checkpoint at all:
    most often `status` was not given the config `run` was."""
    if checkpoint.latest_batch(OFFSETS_DIR) is not None:
        return None
    return (
        f"no checkpoint at {settings.stream.checkpoint_dir} (stream.checkpoint_dir): give status "
        "the config run was given (--app-config, or --checkpoint-dir and --lake-root)"
    )


def last_batch_section(settings: AppSettings, _lake: DeltaLake) -> StatusSection:
    last = LastBatchFile(settings.stream.checkpoint_dir).read()
    if last is None:
        note = no_checkpoint_note(settings, CheckpointLog(settings.stream.checkpoint_dir))
        return StatusSection(title=LAST_BATCH, rows=[], note=note or "no batch finished yet")
    row: dict[str, Any] = {
        "batch_id": last.batch_id,
        "finished_at": last.finished_at,
        "duration_ms": last.duration_ms,
        "records_read": last.records_read,
        "max_kafka_lag": last.max_kafka_lag,
        **{f"rows.{table}": count for table, count in last.rows.items()},
    }
    note = "already committed before: a replay, nothing written" if last.already_committed else None
    return StatusSection(title=LAST_BATCH, rows=[row], note=note)


# -- the writer lease -------------------------------------------------------------------------


def writer_lease_section(settings: AppSettings, lake: DeltaLake) -> StatusSection:
    lease = read_lease(lake, settings.stream.name, settings.stream.lease_ttl_ms)
    if lease is None:
        return StatusSection(title=WRITER_LEASE, rows=[], note="never claimed")
    row = {
        "holder": lease.instance_id,
        "epoch": lease.epoch,
        "host": lease.host,
        "pid": lease.pid,
        "renewed_at": _iso_ms(lease.renewed_at_ms),
        "expires_at": _iso_ms(lease.expires_at_ms),
        "state": lease.state,
    }
    return StatusSection(title=WRITER_LEASE, rows=[row])


def notification_progress_section(
    settings: AppSettings, lake: DeltaLake, registry: Callable[[], TenantRegistry]
) -> StatusSection:
    """The `windows` batch through which every pane's deliveries are finished (succeeded or
    dead-lettered), against the newest batch committed to `windows`."""
    if not registry().notifies_anyone():
        return StatusSection(title=NOTIFICATIONS, rows=[], note="none configured")
    stream = settings.stream.name
    try:
        delivered_through = DeliveryOutbox(lake, stream).delivered_through()
    except TableNotFoundError:
        return StatusSection(title=NOTIFICATIONS, rows=[], note="no deliveries table yet")
    windows_batch = lake.committed_batch(WINDOWS, stream)
    if windows_batch is None:
        return StatusSection(title=NOTIFICATIONS, rows=[], note=NO_DATA_YET)
    row = {
        "windows_batch": windows_batch,
        "finished_through_batch": None if delivered_through < 0 else delivered_through,
        "batches_behind": windows_batch - delivered_through,
    }
    return StatusSection(title=NOTIFICATIONS, rows=[row])


def dead_letter_section(settings: AppSettings, lake: DeltaLake) -> StatusSection:
    """Notifications that used up their retries, per tenant, source and endpoint (redacted)."""
    try:
        summary = dead_letter_summary(lake, settings.stream.name)
    except TableNotFoundError:
        # A lake from before notifications: the stream creates the table at its next start.
        return StatusSection(title=DEAD_LETTERS, rows=[], note="no deliveries table yet")
    rows = [
        {
            "tenant": count.tenant,
            "source": count.source,
            "endpoint": count.endpoint,
            "deliveries": count.deliveries,
            "last_error": count.last_error,
        }
        for count in summary
    ]
    note = "tenant-windows notify retry sends them again" if rows else "none"
    return StatusSection(title=DEAD_LETTERS, rows=rows, note=note)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="milliseconds")


def _iso_ms(epoch_ms: int | None) -> str | None:
    if epoch_ms is None:
        return None
    return _iso(datetime.fromtimestamp(epoch_ms / 1000, tz=UTC))
