"""A reprocess run's plan (per table, the files to remove and to add), written to the lake before
the run's first commit, and the journal of a tenant's plans: which run each table holds, and
the plan an interrupted run left to finish."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyarrow import fs

from storage.lake.delta_lake import DeltaLake, LakeFile
from storage.lake.lake_filesystem import filesystem_of
from storage.lake.tables import REPROCESS_PLANS_DIR, TableSpec
from storage.lake.written_files import WrittenFile
from streaming.repair.key_reprocess import KeyOutcome, ReprocessRun
from streaming.repair.replay import REPLAYED_TABLES


def reprocess_app_id(stream: str, tenant: str) -> str:
    return f"{stream}/reprocess/{tenant}"


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


@dataclass(frozen=True)
class ReprocessPlan:
    """A run's file swaps per table, written before its first commit."""

    tenant: str
    run: int
    since_ms: int
    until_ms: int
    outcomes: list[KeyOutcome]

    @classmethod
    def of(cls, job: ReprocessRun, outcomes: list[KeyOutcome]) -> ReprocessPlan:
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
    def from_json(cls, text: str) -> ReprocessPlan:
        data = json.loads(text)
        return cls(
            data["tenant"],
            data["run"],
            data["since_ms"],
            data["until_ms"],
            [KeyOutcome.from_json(json.dumps(o)) for o in data["outcomes"]],
        )


class PlanJournal:
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

    def write(self, plan: ReprocessPlan) -> None:
        """Whole or not at all: a run stopped while writing leaves no plan to finish."""
        self.filesystem.create_dir(self.folder, recursive=True)
        partial = f"{self._path(plan.run)}.partial"
        with self.filesystem.open_output_stream(partial) as out:
            out.write(plan.to_json().encode())
        self.filesystem.move(partial, self._path(plan.run))

    def unfinished(self) -> ReprocessPlan | None:
        """The newest run's plan if a table does not hold that run yet: a run stopped after
        writing its plan, before or between its commits."""
        newest = self.next_run()
        for run in (newest - 1, newest):
            path = self._path(run)
            if run < 1 or self.filesystem.get_file_info(path).type != fs.FileType.File:
                continue
            with self.filesystem.open_input_stream(path) as handle:
                plan = ReprocessPlan.from_json(handle.read().decode())
            if any(self.pending(plan, spec) for spec in REPLAYED_TABLES):
                return plan
        return None

    def pending(self, plan: ReprocessPlan, spec: TableSpec) -> bool:
        has_work = bool(plan.removed(spec.name) or plan.added(spec.name))
        return has_work and self.committed(spec) < plan.run

    def _path(self, run: int) -> str:
        return f"{self.folder}/run-{run:06d}.json"
