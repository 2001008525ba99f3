"""One writer per stream: a lease kept in the lake, and a fence in every output table.

Two instances of one stream would both replay and commit batches, and a paused instance (a long
GC, a frozen VM) can wake up after another has taken over. Both are stopped in the lake, the
only thing every instance shares:

- **Claim.** `_stream_leases` is a Delta table. An instance claims the stream with a commit that
  raises the stream's epoch by one. The commit is conditional (no commit retry): of two racing
  claimers exactly one wins. A claim is refused while the holder is alive: it renewed within
  `ttl_ms`, did not release, and is not a dead process on this host.
- **Fence.** The winner writes its epoch into every output table (an empty commit carrying the
  transaction id `<stream>/writer_epoch`). Each data commit checks that the snapshot it commits
  against holds its own epoch, and commits without retry, so any commit that landed after that
  snapshot, such as a newer instance's fence, makes it fail and look again. A zombie therefore
  never commits after a newer instance fenced the table.

Renewal times are wall-clock milliseconds of the instances' hosts: `ttl_ms` must exceed the
clock skew between hosts plus a renewal interval (ttl/3) and a renewal's own time. Beyond that
a live holder may be taken over; the fence keeps that safe (docs/operations.md, "The writer
lease: clocks").
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from storage.lake.commits import (
    FencedError,
    commit_without_conflict,
    conditional,
    fence_app_id,
)
from storage.lake.delta_lake import DeltaLake
from storage.lake.log_commits import FencedCommit, commit_fenced
from storage.lake.s3_options import reaching
from storage.lake.snapshot_reader import read_snapshot
from storage.lake.tables import ALL_TABLES, TableSpec
from tenants.settings import StreamSettings

log = logging.getLogger(__name__)

LEASE_TABLE = "_stream_leases"
CLAIMS_SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string()),
        pa.field("epoch", pa.int64()),
        pa.field("instance_id", pa.string()),
        pa.field("host", pa.string()),
        pa.field("pid", pa.int64()),
        pa.field("claimed_at_ms", pa.int64()),
    ]
)
# Renewals are empty commits: keep their log short. Claims are rare and keep their rows.
LEASE_TABLE_CONFIGURATION: dict[str, str | None] = {
    "delta.logRetentionDuration": "interval 1 days",
    "delta.checkpointInterval": "100",
}


# How often a standby looks whether a holder on its own host still runs, between its reads of
# the lease table: a signal of 0 costs microseconds, a read of the table a few requests.
LOCAL_HOLDER_CHECK_S = 0.02


class StreamLeaseHeldError(RuntimeError):
    """Another live instance runs this stream: `holder`, when its claim is known."""

    def __init__(self, message: str, holder: Claim | None = None) -> None:
        super().__init__(message)
        self.holder = holder


@dataclass(frozen=True)
class Claim:
    """One instance's claim on a stream, as recorded in the lease table."""

    stream: str
    epoch: int
    instance_id: str
    host: str
    pid: int
    claimed_at_ms: int

    def describe(self) -> str:
        return f"instance {self.instance_id} (pid {self.pid} on {self.host}, epoch {self.epoch})"


def _describe(claim: Claim | None, epoch: int | None) -> str:
    return claim.describe() if claim else f"epoch {epoch}"


class WriterLease:
    """This instance's lease on `stream` in `lake`."""

    def __init__(
        self,
        lake: DeltaLake,
        stream: str,
        ttl_ms: int,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.lake = lake
        self.stream = stream
        self.ttl_ms = ttl_ms
        self.clock_ms = clock_ms
        self.instance_id = uuid.uuid4().hex[:12]
        self.epoch: int | None = None
        self.lost: FencedError | None = None

    @classmethod
    def for_stream(cls, lake: DeltaLake, stream: StreamSettings) -> WriterLease:
        return cls(lake, stream.name, stream.lease_ttl_ms)

    @property
    def table_uri(self) -> str:
        return f"{self.lake.root}/{LEASE_TABLE}"

    def __repr__(self) -> str:
        return f"WriterLease({self.stream!r}, epoch={self.epoch})"

    # -- claim, renew, release -----------------------------------------------------------

    def acquire(self) -> int:
        """Claim the stream and fence every output table; raise if a live instance holds it."""
        with reaching(self.lake.root, self.lake.storage_options, "creating the lease table"):
            DeltaTable.create(
                self.table_uri,
                CLAIMS_SCHEMA,
                mode="ignore",
                configuration=LEASE_TABLE_CONFIGURATION,
                storage_options=self.lake.storage_options,
            )
        epoch = commit_without_conflict(
            f"stream {self.stream!r}: claiming {self.table_uri}",
            self._claim_once,
            exhausted=StreamLeaseHeldError,
        )
        self.epoch = epoch
        log.info("stream %r claimed by instance %s, epoch %d", self.stream, self.instance_id, epoch)
        for spec in ALL_TABLES:
            commit_without_conflict(
                f"stream {self.stream!r}: fencing {self.lake.table_uri(spec)}",
                partial(self._fence_once, spec, epoch),
            )
        return epoch

    def wait_while_held(
        self, held: StreamLeaseHeldError, most_s: float, stop: threading.Event
    ) -> None:
        """Wait `most_s` before the next claim (or until `stop`), less if the holder that refused
        it ran on this host and has exited since: a standby beside a crashed instance claims
        within `LOCAL_HOLDER_CHECK_S` of its death instead of at its next read of the lease."""
        holder = held.holder
        if holder is None or holder.host != socket.gethostname():
            stop.wait(most_s)
            return
        deadline = time.monotonic() + most_s
        while _process_exists(holder.pid) and not stop.is_set():
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                return
            stop.wait(min(LOCAL_HOLDER_CHECK_S, left_s))

    def renew(self) -> None:
        """Prove this instance is alive; raise FencedError if it lost the stream."""
        self._commit_while_held(self._renewal())

    def release(self) -> None:
        """Let the next instance start at once; a no-op if the stream was lost or never held."""
        if self.epoch is None or self.lost is not None:
            return
        try:
            self._commit_while_held(Transaction(self._released_id, self.epoch))
        except FencedError:
            return
        except Exception as error:  # a stop must not fail because the lake is down
            log.warning(
                "stream %r: could not release the lease (%s); the next instance takes over once "
                "this process has exited or after %.0fs",
                self.stream,
                error,
                self.ttl_ms / 1000,
            )
            return
        log.info("stream %r released by instance %s", self.stream, self.instance_id)

    def keep_alive(
        self, stopping: threading.Event, on_lost: Callable[[], None]
    ) -> threading.Thread:
        """Renew every ttl/3 in a thread until `stopping` is set; call `on_lost` if fenced.

        The caller owns the thread: set `stopping`, then join it.
        """

        def renew_until_stopped() -> None:
            while not stopping.wait(self.ttl_ms / 3_000):
                try:
                    self.renew()
                except FencedError as error:
                    log.error("%s", error)
                    on_lost()
                    return
                except Exception:
                    # An unreachable lake: keep trying; a newer instance takes over after the TTL.
                    log.exception("stream %r: renewing the lease failed; retrying", self.stream)

        thread = threading.Thread(target=renew_until_stopped, name="writer-lease", daemon=True)
        thread.start()
        return thread

    # -- internals ---------------------------------------------------------------------------

    @property
    def _epoch_id(self) -> str:
        return f"{self.stream}/epoch"

    @property
    def _renewed_id(self) -> str:
        return f"{self.stream}/renewed_at_ms"

    @property
    def _released_id(self) -> str:
        return f"{self.stream}/released_epoch"

    def _open(self) -> DeltaTable:
        with reaching(self.lake.root, self.lake.storage_options, "reading the writer lease"):
            return DeltaTable(self.table_uri, storage_options=self.lake.storage_options)

    def _renewal(self) -> Transaction:
        return Transaction(self._renewed_id, self.clock_ms())

    def _claim_once(self) -> int:
        table = self._open()
        current = table.transaction_version(self._epoch_id)
        self._refuse_if_alive(table, current)
        epoch = (current or 0) + 1
        claim = Claim(
            stream=self.stream,
            epoch=epoch,
            instance_id=self.instance_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            claimed_at_ms=self.clock_ms(),
        )
        write_deltalake(
            table,
            pa.Table.from_pylist([asdict(claim)], schema=CLAIMS_SCHEMA),
            mode="append",
            commit_properties=conditional(Transaction(self._epoch_id, epoch), self._renewal()),
        )
        return epoch

    def _fence_once(self, spec: TableSpec, epoch: int) -> None:
        """Fence `spec`'s table with `epoch`, on the log (a table of a million files costs the
        commit nothing more), by delta-rs where the log's reader declines."""
        head = self.lake.head(spec)
        if head is None or not head.plain_writer:
            self._fence_by_delta_rs(spec, epoch)
            return
        self._refuse_newer(spec, head.transactions.get(fence_app_id(self.stream)), epoch)
        fence = FencedCommit(
            removed=(),
            added=(),
            app_id=self.stream,
            writer_epoch=epoch,
            transaction=(fence_app_id(self.stream), epoch),
        )
        with reaching(self.lake.root, self.lake.storage_options, f"fencing table {spec.name}"):
            if commit_fenced(self.lake.log(spec), head.version, fence) is None:
                raise CommitFailedError(f"{spec.name}: its metadata changed; fencing it again")

    def _fence_by_delta_rs(self, spec: TableSpec, epoch: int) -> None:
        table = self.lake.open(spec)
        self._refuse_newer(spec, table.transaction_version(fence_app_id(self.stream)), epoch)
        table.create_write_transaction(
            [],
            mode="append",
            schema=spec.schema,
            partition_by=list(spec.partition_by),
            commit_properties=conditional(Transaction(fence_app_id(self.stream), epoch)),
        )

    def _refuse_newer(self, spec: TableSpec, fenced_with: int | None, epoch: int) -> None:
        if (fenced_with or 0) > epoch:
            raise FencedError(
                f"stream {self.stream!r}: {self.lake.table_uri(spec)} is fenced by a newer "
                f"epoch {fenced_with} than this instance's {epoch}"
            )

    def _commit_while_held(self, transaction: Transaction) -> None:
        def attempt() -> None:
            table = self._open()
            holder = table.transaction_version(self._epoch_id)
            if holder != self.epoch:
                self.lost = FencedError(
                    f"stream {self.stream!r}: instance {self.instance_id} lost its lease (epoch "
                    f"{self.epoch}); {_describe(self._claim(table, holder), holder)} took it over"
                )
                raise self.lost
            with reaching(self.lake.root, self.lake.storage_options, "renewing the writer lease"):
                table.create_write_transaction(
                    [],
                    mode="append",
                    schema=CLAIMS_SCHEMA,
                    commit_properties=conditional(transaction),
                )

        commit_without_conflict(f"stream {self.stream!r}: {self.table_uri}", attempt)

    def _refuse_if_alive(self, table: DeltaTable, epoch: int | None) -> None:
        if epoch is None or table.transaction_version(self._released_id) == epoch:
            return
        renewed_at_ms = table.transaction_version(self._renewed_id) or 0
        silent_ms = self.clock_ms() - renewed_at_ms
        holder = self._claim(table, epoch)
        if silent_ms > self.ttl_ms:
            log.warning(
                "stream %r: taking over from %s, silent for %.1fs",
                self.stream,
                _describe(holder, epoch),
                silent_ms / 1000,
            )
            return
        if (
            holder is not None
            and holder.host == socket.gethostname()
            and not _process_exists(holder.pid)
        ):
            log.warning("stream %r: taking over from dead %s", self.stream, holder.describe())
            return
        raise StreamLeaseHeldError(
            f"stream {self.stream!r} is already running: {_describe(holder, epoch)} renewed its "
            f"lease {silent_ms / 1000:.1f}s ago in {self.table_uri}. Stop it first, or wait until "
            f"its lease expires ({self.ttl_ms / 1000:.0f}s without renewal).",
            holder,
        )

    def _claim(self, table: DeltaTable, epoch: int | None) -> Claim | None:
        if epoch is None:
            return None
        matching = (pc.field("stream") == self.stream) & (pc.field("epoch") == epoch)
        rows = read_snapshot(
            table, CLAIMS_SCHEMA, self.lake.storage_options, row_filter=matching
        ).to_pylist()
        return Claim(**rows[0]) if rows else None


@dataclass(frozen=True)
class LeaseView:
    """The stream's lease as a reader sees it (`tenant-windows status`): holder and expiry."""

    instance_id: str | None
    epoch: int
    host: str | None
    pid: int | None
    renewed_at_ms: int | None
    expires_at_ms: int | None
    state: str
    """`held`, `released` or `expired` (not renewed within the TTL: may be taken over)."""


def read_lease(
    lake: DeltaLake,
    stream: str,
    ttl_ms: int,
    clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
) -> LeaseView | None:
    """The lease of `stream`, read without claiming or renewing it; None if never claimed."""
    probe = WriterLease(lake, stream, ttl_ms, clock_ms)
    try:
        table = probe._open()
    except TableNotFoundError:
        return None
    epoch = table.transaction_version(probe._epoch_id)
    if epoch is None:
        return None
    renewed_at_ms = table.transaction_version(probe._renewed_id)
    expires_at_ms = None if renewed_at_ms is None else renewed_at_ms + ttl_ms
    if table.transaction_version(probe._released_id) == epoch:
        state = "released"
    elif expires_at_ms is None or expires_at_ms < clock_ms():
        state = "expired"
    else:
        state = "held"
    holder = probe._claim(table, epoch)
    return LeaseView(
        instance_id=holder.instance_id if holder else None,
        epoch=epoch,
        host=holder.host if holder else None,
        pid=holder.pid if holder else None,
        renewed_at_ms=renewed_at_ms,
        expires_at_ms=expires_at_ms,
        state=state,
    )


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
