"""Deferral in the reader: a partition's task windows what `admission` admits and parks the rest.

The reader reads ahead of the windowing: every batch reads its Kafka ranges to the end, and a
tenant over its quota or fair share has its excess written, in offset order, to a Parquet file
beside the partition's ledger:

    <lake root>/_deferred/<stream>/<batch>/<partition>.parquet      the records deferred
    <lake root>/_deferred/<stream>/<batch>/<partition>.ledger.json   what waits, and tokens

`<batch>` is a digest of the batch's end offsets, which carry the batch's planning time
(`_at_ms`), so every batch that reads the source has its own folder, and a task finds the
ledger it starts from under its start offsets' digest without knowing Spark's batch id.

Exactly once: a task writes its files before it hands Spark a single row, so when Spark commits
a batch's offsets every record before them is in a committed table or in a file its ledger
names. The same inputs give the same files, so a retried task or replayed batch rewrites them
unchanged. docs/architecture.md ("Quotas and deferral") has the whole argument.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs

from storage.lake.lake_filesystem import filesystem_of
from storage.lake.s3_options import reaching
from streaming.kafka.admission import UNPARSED_TENANT, BatchCounts, Ledger, Release, admit
from streaming.kafka.options import AT_MS_KEY
from tenants.config_store import ConfigSnapshots
from tenants.models import Quota
from tenants.settings import StreamSettings

DEFERRED_DIR = "_deferred"
TENANT_COLUMN = "tenant"
KEEP_UNREFERENCED_S = 600
"""A folder no ledger needs is removed after this long, never sooner: a batch being planned
may not have written its ledger yet."""


def batch_key(offset: Mapping[str, int]) -> str | None:
    """The folder of the batch that ended at `offset`; None for an offset written before
    deferral existed (its batch deferred nothing)."""
    if AT_MS_KEY not in offset:
        return None
    text = json.dumps(dict(offset), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class DeferralStore:
    """A stream's deferred records and ledgers. Picklable: the reader tasks get a copy."""

    lake_root: str
    storage_options: tuple[tuple[str, str], ...]
    stream: str

    @classmethod
    def for_stream(
        cls, stream: StreamSettings, lake_root: str, storage_options: Mapping[str, str]
    ) -> DeferralStore:
        return cls(lake_root, tuple(sorted(storage_options.items())), stream.name)

    def __repr__(self) -> str:
        # The storage options hold the S3 keys.
        return f"DeferralStore({self.lake_root!r}, stream={self.stream!r})"

    def _filesystem(self) -> tuple[fs.FileSystem, str]:
        filesystem, base = filesystem_of(self.lake_root, dict(self.storage_options))
        return filesystem, f"{base}/{DEFERRED_DIR}/{self.stream}"

    def _reaching(self, doing: str) -> AbstractContextManager[None]:
        """A failed request to an S3 lake is one line naming the lake and the endpoint
        (`LakeUnavailableError`), as the tables' own requests are: an outage, not a bug. A
        missing file must be handled inside: this would call it an outage too."""
        return reaching(self.lake_root, dict(self.storage_options) or None, doing)

    def ledger(self, batch: str | None, partition: int) -> Ledger:
        """The ledger a partition's batch ended with; empty when it wrote none."""
        if batch is None:
            return Ledger()
        filesystem, base = self._filesystem()
        path = f"{base}/{batch}/{partition}.ledger.json"
        with self._reaching(f"reading the deferral ledger {batch}/{partition}"):
            try:
                with filesystem.open_input_stream(path) as handle:
                    return Ledger.from_json(orjson.loads(handle.read()))
            except FileNotFoundError:
                return Ledger()

    def ledgers(self, batch: str | None) -> dict[int, Ledger]:
        """Every partition's ledger of a batch, by partition: one listing and a read each."""
        if batch is None:
            return {}
        filesystem, base = self._filesystem()
        selector = fs.FileSelector(f"{base}/{batch}", allow_not_found=True)
        with self._reaching(f"listing the deferral ledgers of {batch}"):
            partitions = [
                int(info.base_name.removesuffix(".ledger.json"))
                for info in filesystem.get_file_info(selector)
                if info.base_name.endswith(".ledger.json")
            ]
        return {partition: self.ledger(batch, partition) for partition in sorted(partitions)}

    def batch_counts(self, batch: str | None) -> tuple[BatchCounts, dict[str, int]]:
        """What the batch that wrote `batch`'s ledgers deferred and released, all partitions,
        and the records each tenant has waiting after it (tenants with none left out)."""
        total = BatchCounts()
        backlog: dict[str, int] = {}
        for ledger in self.ledgers(batch).values():
            total += ledger.counts
            for tenant, queue in ledger.tenants.items():
                if queue.backlog:
                    backlog[tenant] = backlog.get(tenant, 0) + queue.backlog
        return total, backlog

    def tenants_waiting(self, batch: str | None, now_ms: int) -> list[dict[str, object]]:
        """Per tenant slowed after `batch` (records deferred, or its quota's tokens spent): its
        backlog, the age of its oldest deferred record, and whether it is over its quota."""
        waiting: dict[str, dict[str, Any]] = {}
        for ledger in self.ledgers(batch).values():
            for tenant, queue in ledger.tenants.items():
                row = waiting.setdefault(
                    tenant, {"tenant": tenant, "deferred_records": 0, "oldest_at_ms": None}
                )
                row["deferred_records"] += queue.backlog
                oldest = queue.oldest_deferred_at_ms
                if oldest is not None and (
                    row["oldest_at_ms"] is None or oldest < row["oldest_at_ms"]
                ):
                    row["oldest_at_ms"] = oldest
                row["over_quota"] = row.get("over_quota", False) or (
                    queue.tokens is not None and queue.tokens < 1
                )
        return [
            {
                "tenant": "(unreadable records)"
                if row["tenant"] == UNPARSED_TENANT
                else row["tenant"],
                "deferred_records": row["deferred_records"],
                "oldest_deferred_age_s": None
                if row["oldest_at_ms"] is None
                else round(max(0, now_ms - row["oldest_at_ms"]) / 1000, 1),
                "over_quota": row["over_quota"],
            }
            for _, row in sorted(waiting.items())
            if row["deferred_records"] or row["over_quota"]
        ]

    def save(self, batch: str, partition: int, ledger: Ledger, deferred: pa.Table) -> None:
        """Write the records deferred, then the ledger that names them; both atomically."""
        if ledger.is_empty():
            return  # a batch that deferred nothing defers nothing (deferred rows need segments)
        filesystem, base = self._filesystem()
        folder = f"{base}/{batch}"
        body = orjson.dumps(ledger.to_json())
        with self._reaching(f"writing the deferred records {batch}/{partition}"):
            filesystem.create_dir(folder, recursive=True)
            if deferred.num_rows:
                _write_atomically(
                    filesystem,
                    f"{folder}/{partition}.parquet",
                    lambda out: pq.write_table(deferred, out, compression="zstd"),
                )
            _write_atomically(
                filesystem, f"{folder}/{partition}.ledger.json", lambda out: out.write(body)
            )

    def released(self, releases: Iterable[Release]) -> pa.Table | None:
        """The deferred records `releases` name, in their order, without the tenant column."""
        filesystem, base = self._filesystem()
        files: dict[str, pa.Table] = {}
        parts: list[pa.Table] = []
        for release in releases:
            rows = files.get(release.file)
            if rows is None:
                with filesystem.open_input_file(f"{base}/{release.file}") as handle:
                    rows = files[release.file] = pq.read_table(handle)
            own = rows.filter(pc.equal(rows[TENANT_COLUMN], release.tenant))
            parts.append(own.slice(release.start, release.stop - release.start))
        if not parts:
            return None
        return pa.concat_tables(parts).drop_columns([TENANT_COLUMN])

    def remove_unneeded(self, keep_batch: str | None) -> int:
        """Remove the folders that neither `keep_batch`'s ledgers nor a batch still being
        planned can need; the number removed."""
        needed = {keep_batch} if keep_batch is not None else set()
        for ledger in self.ledgers(keep_batch).values():
            for queue in ledger.tenants.values():
                needed.update(segment.file.split("/", 1)[0] for segment in queue.segments)
        filesystem, base = self._filesystem()
        cutoff_s = time.time() - KEEP_UNREFERENCED_S
        removed = 0
        for info in filesystem.get_file_info(fs.FileSelector(base, allow_not_found=True)):
            if info.type != fs.FileType.Directory or info.base_name in needed:
                continue
            if info.mtime is not None and info.mtime.timestamp() > cutoff_s:
                continue
            filesystem.delete_dir(info.path)
            removed += 1
        return removed


@dataclass(frozen=True)
class Deferral:
    """What the reader needs to admit records: built on the driver, shipped to the tasks."""

    store: DeferralStore
    snapshots: ConfigSnapshots
    default_quota: Quota | None
    window_budget: int | None
    max_deferred_records: int

    @classmethod
    def for_stream(
        cls,
        stream: StreamSettings,
        lake_root: str,
        storage_options: Mapping[str, str],
        snapshots: ConfigSnapshots,
    ) -> Deferral:
        return cls(
            store=DeferralStore.for_stream(stream, lake_root, storage_options),
            snapshots=snapshots,
            default_quota=stream.default_quota,
            window_budget=stream.window_budget,
            max_deferred_records=stream.max_deferred_records,
        )


@dataclass(frozen=True)
class TaskAdmission:
    """One reader task's part of a batch: where its partition's ledger comes from and goes."""

    deferral: Deferral
    start_batch: str | None
    end_batch: str
    now_ms: int
    budget: int | None


def admit_partition(records: pa.Table, partition: int, task: TaskAdmission) -> pa.Table:
    """Admit one partition's new `records` (Kafka schema, offset order): write what is
    deferred and the next ledger, then return the released records and the admitted ones."""
    deferral = task.deferral
    ledger = deferral.store.ledger(task.start_batch, partition)
    quota_of = _quota_lookup(deferral, task.now_ms)
    if task.budget is None and not ledger.tenants and quota_of is None:
        # Nothing waits, no budget and no quota: `admit` would window every record and leave
        # no ledger. Deciding so without a look at each record's tenant keeps a stream that
        # uses no quotas free of work per tenant here.
        return records
    tenants = peek_tenants(records.column("value"))
    decision = admit(
        ledger,
        tenants,
        quota_of or _no_quota,
        task.budget,
        task.now_ms,
        file=f"{task.end_batch}/{partition}.parquet",
    )
    window_now = pa.array(decision.window_now, pa.bool_())
    deferred = records.append_column(TENANT_COLUMN, pa.array(tenants, pa.string())).filter(
        pc.invert(window_now)
    )
    released = deferral.store.released(decision.releases)
    deferral.store.save(task.end_batch, partition, decision.ledger, deferred)
    admitted = records.filter(window_now)
    if released is None:
        return admitted
    return pa.concat_tables([released.cast(records.schema), admitted])


def _no_quota(_tenant: str) -> None:
    return None


def peek_tenants(values: pa.ChunkedArray | pa.Array) -> list[str]:
    """Each value's top-level `tenant`; UNPARSED_TENANT where there is none to read. The router
    reads the same field, so a key's records always share a queue."""
    tenants: list[str] = []
    for value in values.to_pylist():
        try:
            record = orjson.loads(value) if value is not None else None
        except orjson.JSONDecodeError:
            record = None
        tenant = record.get("tenant") if type(record) is dict else None
        tenants.append(tenant if type(tenant) is str else UNPARSED_TENANT)
    return tenants


def _quota_lookup(deferral: Deferral, now_ms: int) -> Callable[[str], Quota | None] | None:
    """Each tenant's quota at `now_ms`; None when no tenant has one."""
    try:
        registry = deferral.snapshots.registry_at(now_ms)
    except LookupError:
        if deferral.default_quota is None:
            return None
        return lambda tenant: deferral.default_quota
    if deferral.default_quota is None and not registry.sets_any_quota:
        return None
    memo: dict[str, Quota | None] = {}

    def quota_of(tenant: str) -> Quota | None:
        if tenant not in memo:
            memo[tenant] = registry.quota_of(tenant) or deferral.default_quota
        return memo[tenant]

    return quota_of


def _write_atomically(
    filesystem: fs.FileSystem, path: str, write: Callable[[pa.NativeFile], object]
) -> None:
    temporary = posixpath.join(posixpath.dirname(path), f".{uuid.uuid4().hex}.tmp")
    with filesystem.open_output_stream(temporary) as out:
        write(out)
    filesystem.move(temporary, path)
