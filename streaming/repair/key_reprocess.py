"""One key of a tenant reprocessed in a Spark task: its files read, its records replayed with
the current rules (`replay`), and the settled files its scope needs written. Only file lists
and counts go back to the driver (`reprocess`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from storage.lake.delta_lake import LakeFile
from storage.lake.file_names import SettledFiles
from storage.lake.file_writer import write_settled
from storage.lake.lake_filesystem import filesystem_of
from storage.lake.tables import EVENTS, LATE_EVENTS, QUARANTINE, TENANT_STATUS, TableSpec
from storage.lake.written_files import WrittenFile
from streaming.repair.replay import (
    REPLAYED_TABLES,
    WINDOWED_TABLES,
    KeyHistory,
    Scope,
    records_of,
    replay_key,
    scope_of,
)
from tenants.registry import TenantRegistry

_TABLES = {spec.name: spec for spec in REPLAYED_TABLES}


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
