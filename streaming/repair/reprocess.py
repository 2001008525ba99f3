"""`tenant-windows tenants reprocess T`: T's output recomputed with T's current rules.

What is replayed, and which rows it replaces, is `replay`'s; one key's replay in a Spark task is
`key_reprocess`'s; the plan written before the commits, and the journal of plans, are
`plan_journal`'s. This module runs them:

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

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import pandas as pd
from deltalake import Transaction
from pyspark.sql import SparkSession

from storage.lake.delta_lake import DeltaLake, LakeFile
from storage.lake.tables import LAYOUT_PREFIX, STAGED, TENANT_STATUS
from storage.lake.writer_lease import WriterLease
from streaming.fault_points import NO_FAULTS, FaultHook, FaultPoint
from streaming.repair.key_reprocess import KeyFiles, KeyOutcome, ReprocessRun, reprocess_key
from streaming.repair.plan_journal import (
    PlanJournal,
    ReprocessPlan,
    ReprocessReport,
)
from streaming.repair.replay import REPLAYED_TABLES, WINDOWED_TABLES
from tenants.conf_reader import load_registry
from tenants.settings import AppSettings

log = logging.getLogger(__name__)


class ReprocessError(RuntimeError):
    """A reprocess that cannot run as asked; nothing was committed."""


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
    plans = PlanJournal(lake, settings.stream.name, tenant)
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
        plan = ReprocessPlan.of(job, outcomes)
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


def _commit(
    lake: DeltaLake,
    plans: PlanJournal,
    plan: ReprocessPlan,
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
