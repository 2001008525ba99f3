"""`tenant-windows tenants reprocess T`: T's output recomputed with T's current rules.

What is replayed, and which rows it replaces, is `replay`'s. This module runs it:

1. **Claim.** A lease of its own per (stream, tenant) (`WriterLease`, named
   `<stream>.reprocess.<tenant>`), fencing every output table: of two runs for one tenant one
   commits, and a run that lost its lease (paused past its TTL) commits nothing.
2. **Replay.** One Spark task per key of T: it reads the key's files (settled and staged, in
   `events`, `late_events`, `windows`, and its `tenant_status` rows for the batch times),
   replays, and writes the new files for its scope: each settled file holding a row in scope
   is rewritten with its other rows and the replayed ones, in the key's own partitions. Only
   file lists reach the driver.
3. **Plan.** The driver writes the run's plan (per table: the files to remove and to add) to
   `<lake>/_reprocess/<stream>/<tenant>/run-<N>.json` before committing anything.
4. **Commit.** One commit per table swaps the files, carrying the transaction id
   (`<stream>/reprocess/<tenant>`, N), on a snapshot fenced with the run's epoch.

Exactly once: a run that stops after its plan is written is finished by the next run, table by
table, from the plan (a table that holds transaction N already is skipped); one that stops
before leaves only files no version references (`vacuum` removes them). The stream only ever
appends staged files and settles them, so the files a plan removes (settled, of closed
windows) are never the stream's to change; a key whose rows in scope are still staged is
refused until compaction has settled them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from urllib.parse import unquote

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import Transaction
from pyarrow import fs
from pyspark.sql import SparkSession

from storage.lake.delta_lake import DeltaLake, LakeFile
from storage.lake.file_names import SettledFiles
from storage.lake.file_writer import write_settled
from storage.lake.lake_filesystem import filesystem_of
from storage.lake.tables import (
    EVENTS,
    LATE_EVENTS,
    LAYOUT_PREFIX,
    QUARANTINE,
    REPROCESS_PLANS_DIR,
    STAGED,
    TENANT_STATUS,
    TableSpec,
)
from storage.lake.writer_lease import WriterLease
from storage.lake.written_files import WrittenFile
from streaming.fault_points import NO_FAULTS, FaultHook, FaultPoint
from streaming.repair.replay import (
    REPLAYED_TABLES,
    WINDOWED_TABLES,
    KeyHistory,
    Scope,
    records_of,
    replay_key,
    scope_of,
)
from tenants.registry import TenantRegistry, load_registry
from tenants.settings import AppSettings

log = logging.getLogger(__name__)

_TABLES = {spec.name: spec for spec in REPLAYED_TABLES}


class ReprocessError(RuntimeError):
    """A reprocess that cannot run as asked; nothing was committed."""


def reprocess_app_id(stream: str, tenant: str) -> str:
    return f"{stream}/reprocess/{tenant}"


# -- one key, in a Spark task -------------------------------------------------------------------


@dataclass(frozen=True)
class KeyFiles:
    """What a key's task reads: per table, the key's settled files and the staged files that
    may hold its rows; and the `tenant_status` files that may."""

    source: str
    settled: dict[str, list[LakeFile]]
    staged: dict[str, list[str]]
    status: list[str]


@dataclass(frozen=True)
class ReprocessRun:
    """One run, as its tasks see it; picklable (the storage options may hold S3 keys)."""

    root: str
    storage_options: dict[str, str] | None
    stream: str
    tenant: str
    run: int
    epoch: int
    since_ms: int
    until_ms: int
    registry: TenantRegistry
    max_record_bytes: int
    dry_run: bool

    def __repr__(self) -> str:
        return f"ReprocessRun({self.root!r}, {self.stream}, tenant {self.tenant}, run {self.run})"

    def target(self, spec: TableSpec) -> SettledFiles:
        run_digest = hashlib.sha256(
            f"{self.tenant}/{self.run}/{self.since_ms}/{self.until_ms}".encode()
        ).hexdigest()[:16]
        return SettledFiles(
            root=self.root,
            storage_options=self.storage_options,
            stream=f"{self.stream}-reprocess",
            writer_epoch=self.epoch,
            inputs_digest=run_digest,
            table_name=spec.name,
        )


@dataclass(frozen=True)
class KeyOutcome:
    """What one key's task did: per table, the files to swap and the rows they change."""

    source: str
    removed: dict[str, list[LakeFile]] = field(default_factory=dict)
    added: dict[str, list[WrittenFile]] = field(default_factory=dict)
    rows_removed: dict[str, int] = field(default_factory=dict)
    rows_added: dict[str, int] = field(default_factory=dict)
    horizon_ms: int | None = None
    rows_compared: int = 0
    """The key's rows in scope before: what the replay was held against."""
    refused: str | None = None

    def to_json(self) -> str:
        data = asdict(self)
        data["added"] = {
            table: [file.to_row() for file in files] for table, files in self.added.items()
        }
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> KeyOutcome:
        data = json.loads(text)
        return cls(
            source=data["source"],
            removed={t: [LakeFile(**f) for f in files] for t, files in data["removed"].items()},
            added={
                t: [WrittenFile.from_row(row) for row in rows] for t, rows in data["added"].items()
            },
            rows_removed=data["rows_removed"],
            rows_added=data["rows_added"],
            horizon_ms=data["horizon_ms"],
            rows_compared=data["rows_compared"],
            refused=data["refused"],
        )

    @property
    def changes(self) -> bool:
        return any(self.rows_removed.values()) or any(self.rows_added.values())


def reprocess_key(job: ReprocessRun, files: KeyFiles) -> KeyOutcome:
    """Replay one key and, unless a dry run, write the files its scope needs."""
    filesystem, base = filesystem_of(job.root, job.storage_options)

    def read(spec: TableSpec, path: str) -> pa.Table:
        with filesystem.open_input_file(f"{base}/{spec.name}/{unquote(path)}") as handle:
            rows = pq.read_table(handle, columns=spec.schema.names).cast(spec.schema)
        mine = pc.and_(pc.equal(rows["tenant"], job.tenant), pc.equal(rows["source"], files.source))
        return rows.filter(pc.fill_null(mine, False))

    settled: dict[str, list[pa.Table]] = {}
    staged: dict[str, pa.Table] = {}
    for spec in WINDOWED_TABLES:
        settled[spec.name] = [read(spec, f.path) for f in files.settled.get(spec.name, [])]
        staged[spec.name] = _concat(
            spec, [read(spec, path) for path in files.staged.get(spec.name, [])]
        )
    live = {name: _concat(_TABLES[name], [*settled[name], staged[name]]) for name in settled}
    status = _concat(TENANT_STATUS, [read(TENANT_STATUS, path) for path in files.status])
    replayed = replay_key(
        job.tenant,
        records_of(live[EVENTS.name], live[LATE_EVENTS.name]),
        KeyHistory.of(status),
        job.registry,
        job.max_record_bytes,
    )
    scope = scope_of(job.since_ms, job.until_ms, live, replayed)
    compared = sum(int(pc.sum(scope.holds(rows)).as_py() or 0) for rows in live.values())
    outcome = KeyOutcome(files.source, horizon_ms=scope.horizon_ms, rows_compared=compared)
    for name, rows in staged.items():
        if rows.num_rows and pc.any(scope.holds(rows)).as_py():
            return KeyOutcome(
                source=files.source,
                refused=f"{name} has rows of {job.tenant}/{files.source} in the range that the "
                "stream has not settled yet: run again once they settle (within "
                "stream.compact_interval of being written while the stream runs; "
                "`tenant-windows run --available-now` settles every staged row when it ends)",
            )
    kept: dict[str, pa.Table] = {}
    for spec in WINDOWED_TABLES:
        removed, kept_parts, rows_removed = [], [], 0
        for lake_file, rows in zip(
            files.settled.get(spec.name, []), settled[spec.name], strict=True
        ):
            in_scope = scope.holds(rows)
            count = int(pc.sum(in_scope).as_py() or 0)
            if count:
                removed.append(lake_file)
                kept_parts.append(rows.filter(pc.invert(in_scope)))
                rows_removed += count
        new_rows = replayed[spec.name].filter(scope.holds(replayed[spec.name]))
        # What the removed files held out of scope, and the replay's rows in scope.
        kept[spec.name] = pa.concat_tables([_concat(spec, kept_parts), new_rows])
        outcome.removed[spec.name] = removed
        outcome.rows_removed[spec.name] = rows_removed
        outcome.rows_added[spec.name] = new_rows.num_rows
    quarantined = _newly_quarantined(live, replayed, scope, job, files.source)
    if isinstance(quarantined, str):
        return KeyOutcome(source=files.source, refused=quarantined)
    outcome.rows_added[QUARANTINE.name] = quarantined.num_rows
    if _unchanged(live, replayed, scope) and not quarantined.num_rows:
        return KeyOutcome(files.source, horizon_ms=scope.horizon_ms, rows_compared=compared)
    if job.dry_run:
        return outcome
    for spec in WINDOWED_TABLES:
        if kept[spec.name].num_rows:
            outcome.added[spec.name] = write_settled(
                job.target(spec), kept[spec.name], f"reprocess of {job.tenant}"
            )
    if quarantined.num_rows:
        outcome.added[QUARANTINE.name] = write_settled(
            job.target(QUARANTINE), quarantined, f"reprocess of {job.tenant}"
        )
    return outcome


def _concat(spec: TableSpec, parts: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(parts) if parts else spec.schema.empty_table()


def _ids(rows: pa.Table) -> pa.ChunkedArray:
    """One text id per row's record: topic, partition and offset."""
    return pc.binary_join_element_wise(
        rows["topic"],
        pc.cast(rows["partition"], pa.string()),
        pc.cast(rows["offset"], pa.string()),
        "/",
    )


def _newly_quarantined(
    live: dict[str, pa.Table],
    replayed: dict[str, pa.Table],
    scope: Scope,
    job: ReprocessRun,
    source: str,
) -> pa.Table | str:
    """The replay's quarantine rows of the records that would otherwise lose every row (all
    their rows were in scope, and the replay quarantines them: a new future-skew limit, say);
    a refusal when such a record has no row anywhere after the swap."""
    before, after = [], []
    for spec in (EVENTS, LATE_EVENTS):
        old, new = live[spec.name], replayed[spec.name]
        before.append(_ids(old))
        after.append(_ids(old.filter(pc.invert(scope.holds(old)))))
        after.append(_ids(new.filter(scope.holds(new))))
    everyone = pa.chunked_array([c for chunks in before for c in chunks.chunks], pa.string())
    still = pa.chunked_array([c for chunks in after for c in chunks.chunks], pa.string())
    lost = pc.unique(everyone.filter(pc.invert(pc.is_in(everyone, value_set=still))))
    if len(lost) == 0:
        return QUARANTINE.schema.empty_table()
    quarantine = replayed[QUARANTINE.name]
    rows = quarantine.filter(pc.is_in(_ids(quarantine), value_set=lost))
    if len(pc.unique(_ids(rows))) < len(lost):
        return (
            f"{len(lost)} records of {job.tenant}/{source} would lose every row: their windows "
            "under the current rules cross the range's ends; choose --since and --until on "
            f"window boundaries of both the old and the current rules (e.g. {lost[0]})"
        )
    return rows


def _unchanged(live: dict[str, pa.Table], replayed: dict[str, pa.Table], scope: Scope) -> bool:
    """Whether the replay's rows in scope are exactly the live ones."""
    for spec in WINDOWED_TABLES:
        old, new = live[spec.name], replayed[spec.name]
        old = old.filter(scope.holds(old))
        new = new.filter(scope.holds(new))
        if old.num_rows != new.num_rows:
            return False
        order = [(column, "ascending") for column in spec.sort_by]
        if not old.sort_by(order).equals(new.sort_by(order)):
            return False
    return True


# -- the run, on the driver ---------------------------------------------------------------------


@dataclass(frozen=True)
class TableChange:
    table: str
    rows_removed: int
    rows_added: int
    files_removed: int
    files_added: int


@dataclass(frozen=True)
class ReprocessReport:
    tenant: str
    run: int | None
    """The run's transaction version; None for a dry run or when nothing changed."""
    tables: list[TableChange]
    horizons_ms: dict[str, int | None]
    """Per source, where its scope ended (the range's end, or an open window's start)."""
    rows_compared: int = 0
    """Rows in scope before the run, in the windowed tables."""
    resumed: bool = False
    """The run finished an interrupted one's plan instead of replaying again."""


def reprocess_tenant(
    spark: SparkSession,
    settings: AppSettings,
    lake: DeltaLake,
    tenant: str,
    since_ms: int,
    until_ms: int,
    dry_run: bool,
    fault_hook: FaultHook = NO_FAULTS,
) -> ReprocessReport:
    """Replay `tenant`'s keys with the rules in `settings.conf_dir` and swap their rows in
    [since, until) (see the module's doc); a dry run writes and commits nothing."""
    registry = load_registry(settings.conf_dir)
    if tenant not in registry.tenants:
        raise ReprocessError(
            f"tenant {tenant!r} is not configured in {settings.conf_dir}: reprocessing replays "
            "its records with its current rules"
        )
    plans = _Plans(lake, settings.stream.name, tenant)
    lease = WriterLease(
        lake, f"{settings.stream.name}.reprocess.{tenant}", settings.stream.lease_ttl_ms
    )
    with nullcontext(0) if dry_run else _claimed(lease) as epoch:
        fence = (lease.stream, epoch)
        if not dry_run and (interrupted := plans.unfinished()) is not None:
            return _commit(lake, plans, interrupted, fence, fault_hook, resumed=True)
        job = ReprocessRun(
            root=lake.root,
            storage_options=lake.storage_options,
            stream=settings.stream.name,
            tenant=tenant,
            run=plans.next_run(),
            epoch=epoch,
            since_ms=since_ms,
            until_ms=until_ms,
            registry=registry,
            max_record_bytes=settings.stream.max_record_bytes,
            dry_run=dry_run,
        )
        sources = sorted(source for t, source in registry.configured_keys() if t == tenant)
        outcomes = _run_keys(spark, job, _key_files(lake, tenant, sources))
        refused = [o.refused for o in outcomes if o.refused]
        if refused:
            raise ReprocessError("; ".join(refused))
        plan = _Plan.of(job, outcomes)
        if dry_run or not plan.changes:
            return plan.report(run=None)
        plans.write(plan)
        return _commit(lake, plans, plan, fence, fault_hook, resumed=False)


@contextmanager
def _claimed(lease: WriterLease) -> Iterator[int]:
    """The run's lease, renewed while it runs; a run that loses it is fenced at its commits."""
    epoch = lease.acquire()
    stop_renewing = threading.Event()
    renewer = lease.keep_alive(stop_renewing, on_lost=lambda: None)
    try:
        yield epoch
    finally:
        stop_renewing.set()
        renewer.join()
        lease.release()


def _key_files(lake: DeltaLake, tenant: str, sources: list[str]) -> list[KeyFiles]:
    """Per source of `tenant`: its settled files, and the staged and status files whose
    statistics do not rule the tenant out."""
    settled: dict[str, dict[str, list[LakeFile]]] = {source: {} for source in sources}
    staged: dict[str, list[str]] = {}
    for spec in WINDOWED_TABLES:
        for lake_file in lake.tenant_files(spec, tenant):
            layout_source = lake_file.partition_values.get(f"{LAYOUT_PREFIX}source")
            if lake_file.partition_values.get(f"{LAYOUT_PREFIX}tenant") == STAGED:
                staged.setdefault(spec.name, []).append(lake_file.path)
            elif layout_source in settled:
                settled[layout_source].setdefault(spec.name, []).append(lake_file)
    status = [f.path for f in lake.tenant_files(TENANT_STATUS, tenant)]
    return [KeyFiles(source, settled[source], staged, status) for source in sources]


def _run_keys(spark: SparkSession, job: ReprocessRun, keys: list[KeyFiles]) -> list[KeyOutcome]:
    """One task per key; only each key's outcome (file lists and counts) comes back."""
    if not keys:
        return []
    by_source = {key.source: key for key in keys}

    def run(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            outcomes = [reprocess_key(job, by_source[s]).to_json() for s in frame["source"]]
            yield pd.DataFrame({"outcome": outcomes})

    sources = spark.createDataFrame([(key.source,) for key in keys], "source string")
    rows = sources.repartition(len(keys)).mapInPandas(run, "outcome string").collect()
    return sorted((KeyOutcome.from_json(row["outcome"]) for row in rows), key=lambda o: o.source)


@dataclass(frozen=True)
class _Plan:
    """A run's file swaps per table, written before its first commit."""

    tenant: str
    run: int
    since_ms: int
    until_ms: int
    outcomes: list[KeyOutcome]

    @classmethod
    def of(cls, job: ReprocessRun, outcomes: list[KeyOutcome]) -> _Plan:
        return cls(job.tenant, job.run, job.since_ms, job.until_ms, outcomes)

    @property
    def changes(self) -> bool:
        return any(outcome.changes for outcome in self.outcomes)

    def removed(self, table: str) -> list[LakeFile]:
        return [f for outcome in self.outcomes for f in outcome.removed.get(table, [])]

    def added(self, table: str) -> list[WrittenFile]:
        return [f for outcome in self.outcomes for f in outcome.added.get(table, [])]

    def report(self, run: int | None, resumed: bool = False) -> ReprocessReport:
        return ReprocessReport(
            tenant=self.tenant,
            run=run,
            tables=[
                TableChange(
                    table=spec.name,
                    rows_removed=sum(o.rows_removed.get(spec.name, 0) for o in self.outcomes),
                    rows_added=sum(o.rows_added.get(spec.name, 0) for o in self.outcomes),
                    files_removed=len(self.removed(spec.name)),
                    files_added=len(self.added(spec.name)),
                )
                for spec in REPLAYED_TABLES
            ],
            horizons_ms={o.source: o.horizon_ms for o in self.outcomes},
            rows_compared=sum(o.rows_compared for o in self.outcomes),
            resumed=resumed,
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "tenant": self.tenant,
                "run": self.run,
                "since_ms": self.since_ms,
                "until_ms": self.until_ms,
                "outcomes": [json.loads(o.to_json()) for o in self.outcomes],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> _Plan:
        data = json.loads(text)
        return cls(
            data["tenant"],
            data["run"],
            data["since_ms"],
            data["until_ms"],
            [KeyOutcome.from_json(json.dumps(o)) for o in data["outcomes"]],
        )


class _Plans:
    """A tenant's reprocess plans in the lake, and which run each table holds."""

    def __init__(self, lake: DeltaLake, stream: str, tenant: str) -> None:
        self.lake = lake
        self.app_id = reprocess_app_id(stream, tenant)
        self.filesystem, base = filesystem_of(lake.root, lake.storage_options)
        self.folder = f"{base}/{REPROCESS_PLANS_DIR}/{stream}/{tenant}"

    def committed(self, spec: TableSpec) -> int:
        return self.lake.committed_batch(spec, self.app_id) or 0

    def next_run(self) -> int:
        return max(self.committed(spec) for spec in REPLAYED_TABLES) + 1

    def write(self, plan: _Plan) -> None:
        """Whole or not at all: a run stopped while writing leaves no plan to finish."""
        self.filesystem.create_dir(self.folder, recursive=True)
        partial = f"{self._path(plan.run)}.partial"
        with self.filesystem.open_output_stream(partial) as out:
            out.write(plan.to_json().encode())
        self.filesystem.move(partial, self._path(plan.run))

    def unfinished(self) -> _Plan | None:
        """The newest run's plan if a table does not hold that run yet: a run stopped after
        writing its plan, before or between its commits."""
        newest = self.next_run()
        for run in (newest - 1, newest):
            path = self._path(run)
            if run < 1 or self.filesystem.get_file_info(path).type != fs.FileType.File:
                continue
            with self.filesystem.open_input_stream(path) as handle:
                plan = _Plan.from_json(handle.read().decode())
            if any(self.pending(plan, spec) for spec in REPLAYED_TABLES):
                return plan
        return None

    def pending(self, plan: _Plan, spec: TableSpec) -> bool:
        has_work = bool(plan.removed(spec.name) or plan.added(spec.name))
        return has_work and self.committed(spec) < plan.run

    def _path(self, run: int) -> str:
        return f"{self.folder}/run-{run:06d}.json"


def _commit(
    lake: DeltaLake,
    plans: _Plans,
    plan: _Plan,
    fence: tuple[str, int],
    fault_hook: FaultHook,
    resumed: bool,
) -> ReprocessReport:
    """Each table's swap in one commit, skipping tables that hold the run already."""
    committed = 0
    for spec in REPLAYED_TABLES:
        if not plans.pending(plan, spec):
            continue
        fault_hook.reached(FaultPoint.BEFORE_REPROCESS_COMMIT, committed)
        swapped = lake.replace_files(
            spec,
            plan.removed(spec.name),
            plan.added(spec.name),
            Transaction(app_id=plans.app_id, version=plan.run),
            fence=fence,
            data_change=True,
        )
        if not swapped:
            raise ReprocessError(
                f"{spec.name}: files the plan of run {plan.run} replaces are gone from the table "
                "(an optimize or retention rewrote them); nothing more was committed"
            )
        committed += 1
        log.info("reprocess of %s, run %d: %s committed", plan.tenant, plan.run, spec.name)
    return plan.report(run=plan.run, resumed=resumed)


def parse_time_ms(text: str) -> int:
    """An ISO 8601 time (UTC when it names no zone) as ms since the epoch."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
