"""One writer per stream, at the lake level: claims, renewals, take-overs and fencing.

These use real Delta tables and real processes, without Spark;
tests/integration/recovery/test_one_writer.py runs the real stream.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from deltalake import DeltaTable

from storage.lake.commits import FencedError, fence_app_id
from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import ALL_TABLES, QUARANTINE
from storage.lake.writer_lease import LEASE_TABLE, StreamLeaseHeldError, WriterLease
from tenants.settings import StreamSettings
from tests.support.lake_batches import commit_quarantine_row
from tests.support.paths import ROOT

STREAM = "orders"
TTL_MS = 30_000


def _lake(tmp_path: Path) -> DeltaLake:
    lake = DeltaLake(str(tmp_path / "lake"))
    lake.ensure_tables()
    return lake


def _lease(lake: DeltaLake, clock_ms: int | None = None) -> WriterLease:
    lease = WriterLease.for_stream(lake, StreamSettings(name=STREAM, lease_ttl=f"{TTL_MS}ms"))
    if clock_ms is not None:
        lease.clock_ms = lambda: clock_ms
    return lease


def _commit_one_row(
    lake: DeltaLake,
    batch_id: int,
    writer_epoch: int,
    before_commit: Callable[[], None] = lambda: None,
) -> bool:
    return commit_quarantine_row(lake, STREAM, batch_id, writer_epoch, before_commit)


def _versions(lake: DeltaLake) -> dict[str, int]:
    tables = {spec.name: lake.open(spec).version() for spec in ALL_TABLES}
    tables[LEASE_TABLE] = DeltaTable(f"{lake.root}/{LEASE_TABLE}").version()
    return tables


def test_a_claim_fences_every_output_table_with_its_epoch(tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    assert _lease(lake).acquire() == 1
    for spec in ALL_TABLES:
        assert lake.open(spec).transaction_version(fence_app_id(STREAM)) == 1, spec.name


def test_a_second_instance_is_refused_while_the_first_is_alive_and_writes_nothing(
    tmp_path: Path,
) -> None:
    lake = _lake(tmp_path)
    first = _lease(lake)
    first.acquire()
    before = _versions(lake)

    with pytest.raises(StreamLeaseHeldError) as refused:
        _lease(lake).acquire()

    message = str(refused.value)
    assert f"stream {STREAM!r} is already running" in message
    assert first.instance_id in message and "pid" in message
    assert _versions(lake) == before


def test_a_released_stream_can_be_claimed_at_once(tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    first = _lease(lake)
    first.acquire()
    first.renew()
    first.release()
    assert _lease(lake).acquire() == 2


def test_a_silent_holder_is_taken_over_and_then_fenced_out(tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    zombie = _lease(lake)
    zombie_epoch = zombie.acquire()
    later = zombie.clock_ms() + TTL_MS + 1
    successor = _lease(lake, clock_ms=later)
    assert successor.acquire() == zombie_epoch + 1

    with pytest.raises(FencedError, match="lost its lease"):
        zombie.renew()
    before = lake.open(QUARANTINE).version()
    with pytest.raises(FencedError, match="a newer instance took the stream over"):
        _commit_one_row(lake, batch_id=0, writer_epoch=zombie_epoch)
    assert lake.open(QUARANTINE).version() == before
    zombie.release()  # a lost lease is not released: that would free the successor's claim
    with pytest.raises(StreamLeaseHeldError):
        _lease(lake).acquire()

    assert _commit_one_row(lake, 0, successor.epoch or 0)
    assert not _commit_one_row(lake, 0, successor.epoch or 0)
    assert lake.open(QUARANTINE).to_pyarrow_table().num_rows == 1


def test_a_zombie_that_passed_its_checks_before_a_newer_instance_fenced_commits_nothing(
    tmp_path: Path,
) -> None:
    lake = _lake(tmp_path)
    zombie = _lease(lake)
    zombie_epoch = zombie.acquire()
    successor = _lease(lake, clock_ms=zombie.clock_ms() + TTL_MS + 1)

    # The zombie found its fence and the batch not yet committed, then paused right before
    # writing its commit; meanwhile the successor claimed the stream and fenced every table.
    with pytest.raises(FencedError, match="newer instance"):
        _commit_one_row(lake, 0, zombie_epoch, before_commit=successor.acquire)

    assert successor.epoch == zombie_epoch + 1
    assert lake.open(QUARANTINE).to_pyarrow_table().num_rows == 0
    assert _commit_one_row(lake, 0, successor.epoch)


def test_of_two_racing_claimers_exactly_one_wins(tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    claimers = [_lease(lake) for _ in range(2)]
    start = threading.Barrier(len(claimers), timeout=30)
    outcomes: list[str] = []

    def claim(lease: WriterLease) -> None:
        start.wait()
        try:
            lease.acquire()
            outcomes.append("claimed")
        except StreamLeaseHeldError:
            outcomes.append("refused")

    threads = [threading.Thread(target=claim, args=(lease,)) for lease in claimers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["claimed", "refused"]


def test_the_claim_of_a_process_that_died_on_this_host_is_taken_over_at_once(
    tmp_path: Path,
) -> None:
    lake = _lake(tmp_path)
    dies_holding = (
        "import os, signal, sys\n"
        "from storage.lake.delta_lake import DeltaLake\n"
        "from storage.lake.writer_lease import WriterLease\n"
        "from tenants.settings import StreamSettings\n"
        f"WriterLease.for_stream(DeltaLake(sys.argv[1]), StreamSettings(name={STREAM!r})).acquire()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", dies_holding, lake.root],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -9, done.stderr.decode()[-2000:]
    assert _lease(lake).acquire() == 2


def _refusal(tmp_path: Path) -> StreamLeaseHeldError:
    lake = _lake(tmp_path)
    _lease(lake).acquire()  # held by this test's own process: alive, on this host
    with pytest.raises(StreamLeaseHeldError) as refused:
        _lease(lake).acquire()
    assert refused.value.holder is not None and refused.value.holder.pid == os.getpid()
    return refused.value


def test_a_standby_waits_out_its_poll_while_the_holder_on_its_host_runs(tmp_path: Path) -> None:
    held = _refusal(tmp_path)
    started = time.monotonic()
    _lease(_lake(tmp_path)).wait_while_held(held, 0.3, threading.Event())
    assert time.monotonic() - started >= 0.3


def test_a_standby_stops_waiting_as_soon_as_the_holder_on_its_host_is_gone(
    tmp_path: Path,
) -> None:
    held = _refusal(tmp_path)
    assert held.holder is not None
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    held.holder = dataclasses.replace(held.holder, pid=int(exited.stdout))
    started = time.monotonic()
    _lease(_lake(tmp_path)).wait_while_held(held, 30, threading.Event())
    assert time.monotonic() - started < 5


def test_a_holder_on_another_host_is_only_looked_at_again_after_the_poll(tmp_path: Path) -> None:
    held = _refusal(tmp_path)
    assert held.holder is not None
    held.holder = dataclasses.replace(held.holder, host=f"not-{socket.gethostname()}", pid=1 << 30)
    stop = threading.Event()
    started = time.monotonic()
    _lease(_lake(tmp_path)).wait_while_held(held, 0.3, stop)
    assert time.monotonic() - started >= 0.3
    stop.set()
    _lease(_lake(tmp_path)).wait_while_held(held, 30, stop)  # a stop ends the wait at once
