"""The notification outbox: every delivery attempt, and how far deliveries are complete.

One row per attempt to tell an endpoint about a committed pane (`streaming.notify`). The
notifier's high-water mark, "every pane of `windows` batches up to B has succeeded or been
dead-lettered", is a Delta transaction id on this table (`<stream>/notified`, version B),
committed atomically with the attempt rows that complete it; a restart resumes after it.
Endpoints are stored redacted, and bodies hold only committed pane facts: no secret lands here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import CommitProperties, Transaction, write_deltalake

from storage.lake.delta_lake import DeltaLake
from storage.lake.s3_options import reaching
from storage.lake.tables import DELIVERIES, TIMESTAMP


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    """Failed; another attempt follows."""
    DEAD_LETTER = "dead_letter"
    """Failed, and no attempt follows until `tenant-windows notify retry`."""


@dataclass(frozen=True)
class AttemptRow:
    stream: str
    idempotency_key: str
    tenant: str
    source: str
    window_start_ms: int
    pane_index: int
    windows_batch_id: int
    endpoint_id: str
    endpoint: str
    kind: str
    attempt: int
    status_code: int | None
    error: str | None
    outcome: Outcome
    attempted_at_ms: int
    succeeded_at_ms: int | None
    body: str

    @property
    def delivery(self) -> tuple[str, str]:
        """What a delivery is: one key to one endpoint."""
        return (self.idempotency_key, self.endpoint_id)


@dataclass(frozen=True)
class Progress:
    last_attempt: int
    finished: bool
    """Succeeded or dead-lettered."""


@dataclass(frozen=True)
class DeadLetterCount:
    tenant: str
    source: str
    endpoint: str
    deliveries: int
    last_error: str | None


class DeliveryOutbox:
    def __init__(self, lake: DeltaLake, stream: str) -> None:
        self.lake = lake
        self.stream = stream

    @property
    def high_water_app_id(self) -> str:
        return f"{self.stream}/notified"

    def delivered_through(self) -> int:
        """The `windows` batch id through which every delivery is finished; -1 before any."""
        version = self.lake.open(DELIVERIES).transaction_version(self.high_water_app_id)
        return -1 if version is None else version

    def progress_after(self, batch_id: int) -> dict[tuple[str, str], Progress]:
        """Per (key, endpoint id) of panes after `batch_id`: the last attempt, and whether the
        delivery is finished (a restart resumes these instead of starting them again)."""
        rows = self._rows()
        rows = rows.filter(pc.greater(rows["windows_batch_id"], batch_id))
        return {
            row.delivery: Progress(row.attempt, row.outcome is not Outcome.RETRYING)
            for row in _latest_per_delivery(rows)
        }

    def record(self, rows: list[AttemptRow], through: int | None = None) -> None:
        """Append `rows` and, if given, move the high-water mark to `through`, in one commit."""
        table = pa.Table.from_pylist([_to_record(row) for row in rows], schema=DELIVERIES.schema)
        transactions = (
            [] if through is None else [Transaction(app_id=self.high_water_app_id, version=through)]
        )
        with reaching(self.lake.root, self.lake.storage_options):
            write_deltalake(
                self.lake.table_uri(DELIVERIES),
                table,
                mode="append",
                storage_options=self.lake.storage_options,
                commit_properties=CommitProperties(app_transactions=transactions),
            )

    def dead_letters(self, tenant: str | None = None) -> list[AttemptRow]:
        """The last attempt of each delivery that is dead-lettered now, oldest first."""
        rows = self._rows()
        if tenant is not None:
            rows = rows.filter(pc.equal(rows["tenant"], tenant))
        latest = _latest_per_delivery(rows)
        return [row for row in latest if row.outcome is Outcome.DEAD_LETTER]

    def _rows(self) -> pa.Table:
        return self.lake.read_arrow(DELIVERIES, row_filter=ds.field("stream") == self.stream)


def dead_letter_summary(lake: DeltaLake, stream: str) -> list[DeadLetterCount]:
    """Dead-lettered deliveries now, per (tenant, source, endpoint), with the newest error."""
    counts: dict[tuple[str, str, str], DeadLetterCount] = {}
    for row in DeliveryOutbox(lake, stream).dead_letters():
        group = (row.tenant, row.source, row.endpoint)
        before = counts.get(group)
        counts[group] = DeadLetterCount(
            *group, deliveries=1 + (before.deliveries if before else 0), last_error=row.error
        )
    return [counts[group] for group in sorted(counts)]


def _latest_per_delivery(rows: pa.Table) -> list[AttemptRow]:
    latest: dict[tuple[str, str], AttemptRow] = {}
    for record in rows.to_pylist():
        row = _from_record(record)
        known = latest.get(row.delivery)
        if known is None or row.attempt > known.attempt:
            latest[row.delivery] = row
    return sorted(latest.values(), key=lambda row: (row.attempted_at_ms, row.delivery))


def _to_record(row: AttemptRow) -> dict[str, object]:
    record = asdict(row)
    record["outcome"] = row.outcome.value
    for name in ("window_start", "attempted_at", "succeeded_at"):
        epoch_ms = record.pop(f"{name}_ms")
        record[name] = None if epoch_ms is None else pa.scalar(epoch_ms * 1000, TIMESTAMP)
    return record


def _from_record(record: dict[str, object]) -> AttemptRow:
    values = dict(record)
    for name in ("window_start", "attempted_at", "succeeded_at"):
        moment = values.pop(name)
        values[f"{name}_ms"] = None if moment is None else _epoch_ms(moment)
    values["outcome"] = Outcome(str(values["outcome"]))
    return AttemptRow(**values)  # type: ignore[arg-type]


def _epoch_ms(moment: object) -> int:
    return int(pa.scalar(moment, TIMESTAMP).value) // 1000
