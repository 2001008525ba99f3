"""Summarise quarantined records in the log: one bounded line per batch, rate-limited.

Every quarantined record is in the `quarantine` table. The log only has to tell an operator
that records are being quarantined, why, and whose, with a few examples; it must not grow with
the bad input (at 1 % of 30,000 records a second, a line per record is 300 lines a second).

A summary line counts a batch's quarantined records by reason and by tenant (the top few), and
is followed by at most `quarantine_log.examples` quoted records. At most one summary is logged
per `quarantine_log.interval`: batches in between are counted into the next summary, or into the
one `flush()` logs when the stream stops, so each quarantined record is counted in the log once.

What it costs the driver: no row of the stream is collected, and the batch's plan is not run a
second time. Everything comes from the quarantine files the batch has just written, whose list
the sink has:
- by reason: the table is partitioned by reason, so each file's partition value and record
  count give exact counts without reading anything.
- by tenant: a file's Delta stats decide it when none of its records has a tenant (malformed
  input, `nullCount`) or all share one (`minValues` equal to `maxValues`, where the writer
  records them for `tenant`). Other files' `tenant` column is read, at most
  `TENANT_READ_MAX_FILES` files and `TENANT_READ_MAX_ROWS` rows a summary; records beyond that
  are left out of the tenant counts, and the line says how many.
- examples: the first rows of one file per reason, `examples` rows at most.
Files are read only when a summary is logged, so at most once per interval.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs

from storage.lake.delta_lake import DeltaLake
from storage.lake.lake_filesystem import filesystem_of
from storage.lake.tables import QUARANTINE
from storage.lake.written_files import WrittenFile
from tenants.settings import QuarantineLogSettings

log = logging.getLogger(__name__)

TOP_TENANTS = 5
"""Tenants named in a summary line; the rest are counted together."""
TENANT_READ_MAX_FILES = 8
"""Files whose `tenant` column one summary reads (the largest of those stats do not decide)."""
TENANT_READ_MAX_ROWS = 100_000
"""Rows of the `tenant` column one summary reads, at most: a few MB of short ids."""
PERIOD_MAX_TENANTS = 1_000
"""Distinct tenants counted between two summaries; the smallest counts beyond are dropped."""
ERROR_MAX_CHARS = 200
"""A quoted record's error is cut to this: it may quote the record's bad input."""
NO_TENANT = "(no tenant)"
"""How a summary names the records that have none (malformed input)."""
_EXAMPLE_COLUMNS = ["tenant", "source", "topic", "partition", "offset", "error"]
_TENANT = "tenant"


def tenants_from_stats(file: WrittenFile) -> Counter[str | None] | None:
    """The file's records per tenant (None: no tenant) when its Delta stats decide it; None when
    only reading the file would tell."""
    try:
        stats = json.loads(file.stats)
    except (TypeError, ValueError):
        return None
    if not isinstance(stats, dict):
        return None
    records = file.num_records
    nulls = _stat(stats, "nullCount")
    if nulls == records:
        return Counter({None: records})
    lowest, highest = _stat(stats, "minValues"), _stat(stats, "maxValues")
    if isinstance(lowest, str) and lowest == highest and isinstance(nulls, int):
        return +Counter({lowest: records - nulls, None: nulls})
    return None


def _stat(stats: Mapping[str, Any], kind: str) -> Any:
    values = stats.get(kind)
    return values.get(_TENANT) if isinstance(values, dict) else None


def summary_line(
    first_batch: int,
    last_batch: int,
    by_reason: Mapping[str, int],
    by_tenant: Mapping[str | None, int],
    tenants_not_counted: int,
) -> str:
    """One summary: the batches, the counts by reason and the top tenants, and where the rows
    are. `tenants_not_counted` records are in `by_reason` but not in `by_tenant`."""
    batches = f"batches {first_batch}-{last_batch}"
    if first_batch == last_batch:
        batches = f"batch {last_batch}"
    records = sum(by_reason.values())
    reasons = ", ".join(f"{reason}={count}" for reason, count in _largest_first(by_reason))
    ranked = _largest_first(by_tenant)
    tenants = [f"{NO_TENANT if t is None else t}={count}" for t, count in ranked[:TOP_TENANTS]]
    rest = ranked[TOP_TENANTS:]
    if rest:
        tenants.append(f"{len(rest)} more tenants={sum(count for _, count in rest)}")
    if tenants_not_counted:
        tenants.append(f"not read={tenants_not_counted}")
    return (
        f"{batches}: {records} records quarantined; by reason: {reasons}; "
        f"by tenant: {', '.join(tenants)}; all of them are in the {QUARANTINE.name} table"
    )


def _largest_first(counts: Mapping[Any, int]) -> list[tuple[Any, int]]:
    # Ties in name order, so a line reads the same for the same counts.
    return sorted(counts.items(), key=lambda item: (-item[1], str(item[0])))


def reason_of(file: WrittenFile) -> str:
    """The quarantine reason of every record in `file`: the table is partitioned by it."""
    return file.partition_values.get("reason") or "unknown"


def quarantined_by_reason(files: Iterable[WrittenFile]) -> dict[str, int]:
    """Records per quarantine reason in `files` (of the quarantine table), without a read."""
    counts: Counter[str] = Counter()
    for file in files:
        counts[reason_of(file)] += file.num_records
    return dict(counts)


@dataclass
class _Period:
    """What the batches since the last summary quarantined. Bounded whatever their number:
    counters, the few largest files stats do not decide, and one example file per reason."""

    first_batch: int | None = None
    last_batch: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    by_tenant: Counter[str | None] = field(default_factory=Counter)
    to_read: list[tuple[int, str, WrittenFile]] = field(default_factory=list)
    """A min-heap on record count: the largest files whose tenants only a read tells."""
    not_counted: int = 0
    """Records left out of `by_tenant` (their file is not kept for reading, or trimmed)."""
    example_files: dict[str, WrittenFile] = field(default_factory=dict)

    def add(self, batch_id: int, files: Iterable[WrittenFile]) -> None:
        for file in files:
            if self.first_batch is None:
                self.first_batch = batch_id
            self.last_batch = batch_id
            reason = reason_of(file)
            self.by_reason[reason] += file.num_records
            self.example_files.setdefault(reason, file)
            decided = tenants_from_stats(file)
            if decided is not None:
                self.by_tenant.update(decided)
                continue
            heapq.heappush(self.to_read, (file.num_records, file.path, file))
            if len(self.to_read) > TENANT_READ_MAX_FILES:
                smallest, _, _ = heapq.heappop(self.to_read)
                self.not_counted += smallest
        if len(self.by_tenant) > PERIOD_MAX_TENANTS:
            kept = Counter(dict(self.by_tenant.most_common(PERIOD_MAX_TENANTS)))
            self.not_counted += self.by_tenant.total() - kept.total()
            self.by_tenant = kept


class QuarantineLog:
    """Logs the quarantined records of committed batches; one per stream instance, built by the
    composition root, which calls `flush()` when the stream stops.

    The rate limit's state (the time of the last summary, the counts since) lives here rather
    than in the module, so two streams in one process, or a test, never share it.
    """

    def __init__(
        self,
        lake: DeltaLake,
        settings: QuarantineLogSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lake = lake
        self.settings = settings or QuarantineLogSettings()
        self._clock = clock
        self._period = _Period()
        self._last_summary_at: float | None = None
        # The sink calls from Spark's batch thread, `flush()` comes from the stopping thread.
        self._lock = threading.Lock()

    def batch_committed(self, batch_id: int, files: Sequence[WrittenFile]) -> None:
        """Count the batch's quarantine files (all of its written files may be passed); log a
        summary if the interval since the last one has passed."""
        try:
            with self._lock:
                quarantined = [
                    file
                    for file in files
                    if file.table_name == QUARANTINE.name and file.num_records > 0
                ]
                self._period.add(batch_id, quarantined)
                if self._period.first_batch is None:
                    return
                now = self._clock()
                interval_s = self.settings.interval_ms / 1000
                if self._last_summary_at is not None and now - self._last_summary_at < interval_s:
                    return
                self._log_period()
                self._last_summary_at = now
        except Exception:
            # The batch is committed; a summary is not worth failing the stream over.
            log.exception("batch %d: could not summarise its quarantined records", batch_id)

    def flush(self) -> None:
        """Log the batches not summarised yet (the stream is stopping)."""
        try:
            with self._lock:
                if self._period.first_batch is not None:
                    self._log_period()
        except Exception:
            log.exception("could not summarise the last quarantined records")

    def _log_period(self) -> None:
        period, self._period = self._period, _Period()
        assert period.first_batch is not None
        filesystem, base = filesystem_of(self.lake.root, self.lake.storage_options)
        by_tenant, not_counted = self._read_tenants(filesystem, base, period)
        log.warning(
            summary_line(
                period.first_batch, period.last_batch, period.by_reason, by_tenant, not_counted
            )
        )
        for reason, row in self._read_examples(filesystem, base, period):
            log.warning(
                "quarantined: tenant=%s source=%s at %s/%s@%s, reason %s: %s",
                row["tenant"],
                row["source"],
                row["topic"],
                row["partition"],
                row["offset"],
                reason,
                _shortened(row["error"]),
            )

    def _read_tenants(
        self, filesystem: fs.FileSystem, base: str, period: _Period
    ) -> tuple[Counter[str | None], int]:
        by_tenant = Counter(period.by_tenant)
        not_counted = period.not_counted
        budget = TENANT_READ_MAX_ROWS
        for _, _, file in sorted(period.to_read, key=lambda entry: (-entry[0], entry[1])):
            counted = 0
            if budget > 0:
                try:
                    counts = _tenant_counts(filesystem, _path(base, file), budget)
                except (OSError, pa.ArrowException) as error:
                    # Gone (vacuumed) or unreachable: only the tenant counts miss it.
                    log.debug("could not read %s: %s", file.path, error)
                else:
                    by_tenant.update(counts)
                    counted = counts.total()
                    budget -= counted
            not_counted += file.num_records - counted
        return by_tenant, not_counted

    def _read_examples(
        self, filesystem: fs.FileSystem, base: str, period: _Period
    ) -> list[tuple[str, dict[str, Any]]]:
        """Up to `examples` rows, taken in turn from one file of each reason (most frequent
        reason first), so that each reason shows up once before any shows up twice."""
        wanted = self.settings.examples
        if wanted == 0:
            return []
        reasons = [reason for reason, _ in _largest_first(period.by_reason)][:wanted]
        per_reason: list[list[tuple[str, dict[str, Any]]]] = []
        for reason in reasons:
            file = period.example_files[reason]
            try:
                rows = _first_rows(filesystem, _path(base, file), -(-wanted // len(reasons)))
            except (OSError, pa.ArrowException) as error:
                log.debug("could not read %s: %s", file.path, error)
                continue
            per_reason.append([(reason, row) for row in rows])
        in_turn = [row for turn in _interleave(per_reason) for row in turn]
        return in_turn[:wanted]


def _interleave(lists: list[list[tuple[str, dict[str, Any]]]]) -> list[list[Any]]:
    longest = max((len(rows) for rows in lists), default=0)
    return [[rows[i] for rows in lists if i < len(rows)] for i in range(longest)]


def _path(base: str, file: WrittenFile) -> str:
    return f"{base}/{QUARANTINE.name}/{file.path}"


def _tenant_counts(filesystem: fs.FileSystem, path: str, max_rows: int) -> Counter[str | None]:
    """Records per tenant in the first `max_rows` rows of one file, reading only that column."""
    counts: Counter[str | None] = Counter()
    read = 0
    with filesystem.open_input_file(path) as handle:
        for batch in pq.ParquetFile(handle).iter_batches(
            batch_size=min(max_rows, 65_536), columns=[_TENANT]
        ):
            column = batch.column(0).slice(0, max_rows - read)
            for entry in pc.value_counts(column).to_pylist():
                counts[entry["values"]] += entry["counts"]
            read += len(column)
            if read >= max_rows:
                break
    return counts


def _first_rows(filesystem: fs.FileSystem, path: str, rows: int) -> list[dict[str, Any]]:
    with filesystem.open_input_file(path) as handle:
        batches = pq.ParquetFile(handle).iter_batches(batch_size=rows, columns=_EXAMPLE_COLUMNS)
        first = next(batches, None)
    return [] if first is None else first.to_pylist()


def _shortened(error: str | None) -> str | None:
    if error is None or len(error) <= ERROR_MAX_CHARS:
        return error
    return f"{error[:ERROR_MAX_CHARS]}... ({len(error)} characters)"
