"""The scale benchmark's `peer` stage: quixstreams, the Python library a user would pick instead,
doing the product's job on the same preloaded topic and broker: every record and every final
window written to Parquet through its own file sink, in one process or several of one consumer
group.

quixstreams cannot share the project's venv: 3.28.1, the newest, requires confluent-kafka < 2.13
and pydantic < 2.14, and the project pins 2.16.1 and 2.14.3. It gets a venv of its own,
`.venv/peer-quixstreams` (built on first use, rebuilt when `PEER_REQUIREMENT` changes), with the
versions its authors test it with, which is also what a user who picked it would run. The peer
runs there as a subprocess (`quix_peer_app.py`, standard library and quixstreams only) and prints
its figures as JSON.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.dev.local_process import rss_mib
from tenants.models import SourceConfig, TumblingWindow

# Its Parquet file sink needs pyarrow (the `parquet` extra).
PEER_REQUIREMENT = "quixstreams[parquet]==3.28.1"
PEER_VENV = Path(__file__).resolve().parents[3] / ".venv" / "peer-quixstreams"
_APP = Path(__file__).with_name("quix_peer_app.py")
_INSTALL_TIMEOUT_S = 600
# After the peer's own timeout: it needs a few seconds to stop and print its figures.
_EXIT_GRACE_S = 60
# A process notes the time every that many records at most (a tenth of a chunk when chunks are
# smaller): chunk boundaries are found from these marks, and a mark is a write of a small file.
_MARK_EVERY = 1_000


@dataclass(frozen=True)
class PeerRun:
    processes: int
    records: int
    seconds: float
    """From the first process's start to the last one's exit (the sinks' final writes included)."""
    run_started_s: float
    """When the first process called `run`, from the same origin as `chunk_ends_s`."""
    chunk_ends_s: list[float]
    """When each chunk of records (the last may be shorter) had been windowed, by the group."""
    late_dropped: int
    windows_emitted: int
    close_s: float | None
    peak_mib: float
    """The processes' peak resident memory, summed."""
    parquet_records: int
    """Rows in the Parquet files of every record: what the peer kept, read back after it ran."""


def peer_python(venv: Path = PEER_VENV) -> Path:
    """The peer venv's interpreter; the venv is made and quixstreams installed if missing."""
    stamp = venv / f".installed-{hashlib.sha256(PEER_REQUIREMENT.encode()).hexdigest()[:16]}"
    python = venv / "bin" / "python"
    if not stamp.exists():
        subprocess.run(
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            check=True,
            timeout=_INSTALL_TIMEOUT_S,
        )
        install = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--no-compile", PEER_REQUIREMENT],
            capture_output=True,
            text=True,
            timeout=_INSTALL_TIMEOUT_S,
        )
        if install.returncode != 0:  # its warnings are noise unless it failed
            raise RuntimeError(f"installing {PEER_REQUIREMENT} failed: {install.stderr[-4000:]}")
        stamp.touch()
    return python


def window_rules(sources: Mapping[str, SourceConfig]) -> dict[str, dict[str, Any]]:
    """Per source, what the peer windows by: where its event time is, its window, its lateness."""
    rules = {}
    for name, source in sources.items():
        if not isinstance(source.window, TumblingWindow):
            raise ValueError(f"the peer windows tumbling windows only; {name} has {source.window}")
        rules[name] = {
            "field": source.event_time.field,
            "format": source.event_time.format.value,
            "size_ms": source.window.size_ms,
            "out_of_orderness_ms": source.out_of_orderness_ms,
            "allowed_lateness_ms": source.allowed_lateness_ms,
        }
    return rules


def run_peer(
    bootstrap_servers: str,
    topic: str,
    records: int,
    chunk: int,
    sources: Mapping[str, SourceConfig],
    workdir: Path,
    timeout_s: float,
    processes: int = 1,
) -> PeerRun:
    """Window `records` records of `topic` in `processes` quixstreams processes of one consumer
    group, each writing every record and every final window to Parquet; once the group has
    windowed them all, every process is asked to stop (quixstreams then commits, so its sinks
    write what they hold)."""
    python = peer_python()
    workdir.mkdir(parents=True, exist_ok=True)
    # A group of its own: the run reads the topic from its start, and the changelog topics
    # quixstreams names after the group are this run's alone.
    group = f"tw-scale-peer-{uuid.uuid4().hex[:12]}"
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("Quix__")
    }
    mark_every = max(1, min(_MARK_EVERY, chunk // 10))
    members = []
    for index in range(processes):
        # Each process in a folder of its own: its state and its Parquet files.
        folder = Path(tempfile.mkdtemp(prefix=f"quix_{index}_", dir=workdir))
        members.append((folder, folder / "progress"))
    commands = [
        [
            str(python), str(_APP),
            "--broker", bootstrap_servers,
            "--topic", topic,
            "--group", group,
            "--state-dir", str(folder / "state"),
            "--records", str(records),
            "--progress-file", str(progress),
            "--mark-every", str(mark_every),
            "--stop-file", str(folder / "stop"),
            "--timeout-s", str(timeout_s),
            "--sources", json.dumps(window_rules(sources)),
        ]
        for folder, progress in members
    ]  # fmt: skip
    peaks = [0.0] * processes
    # No Quix Cloud: its SDK token would point the Application at the platform's brokers.
    running = [
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=folder,
            env=environment,
        )
        for command, (folder, _) in zip(commands, members, strict=True)
    ]
    outputs: list[tuple[str, str]] = []
    try:
        _watch(running, members, records, peaks, timeout_s)
        for process in running:
            outputs.append(process.communicate(timeout=_EXIT_GRACE_S))
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()  # a process this call started, by its PID
                process.communicate()
    for process, (_, stderr) in zip(running, outputs, strict=True):
        if process.returncode != 0:
            raise RuntimeError(f"the peer failed ({process.returncode}): {stderr[-4000:]}")
    figures = [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]
    origin = min(f["started"] for f in figures)
    last_record_at = max(f["last_record_at"] or f["run_started"] for f in figures)
    total = sum(f["records"] for f in figures)
    return PeerRun(
        processes=processes,
        records=total,
        seconds=max(f["stopped"] for f in figures) - origin,
        run_started_s=min(f["run_started"] for f in figures) - origin,
        chunk_ends_s=_chunk_ends(figures, chunk, mark_every, total, last_record_at, origin),
        late_dropped=sum(f["late_dropped"] for f in figures),
        windows_emitted=sum(f["windows_emitted"] for f in figures),
        close_s=max(f["stopped"] for f in figures) - last_record_at,
        peak_mib=sum(peaks),
        parquet_records=sum(_parquet_rows(folder / "records") for folder, _ in members),
    )


def _watch(
    running: list[subprocess.Popen[str]],
    members: list[tuple[Path, Path]],
    records: int,
    peaks: list[float],
    timeout_s: float,
) -> None:
    """Sample the processes' memory until every one has stopped, asking them to stop once the
    group has windowed `records` records; bounded by `timeout_s`."""
    deadline = time.monotonic() + timeout_s + _EXIT_GRACE_S
    while time.monotonic() < deadline:
        if all(process.poll() is not None for process in running):
            return
        for index, process in enumerate(running):
            peaks[index] = max(peaks[index], rss_mib(process.pid))
        if sum(_progress(progress) for _, progress in members) >= records:
            for folder, _ in members:
                (folder / "stop").touch()
        time.sleep(0.2)
    raise TimeoutError(f"the peer did not stop within {timeout_s}s")


def _progress(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):  # not written yet, or caught mid-write
        return 0


def _chunk_ends(
    figures: list[dict[str, Any]],
    chunk: int,
    mark_every: int,
    total: int,
    last_record_at: float,
    origin: float,
) -> list[float]:
    """When the group's count of windowed records passed each multiple of `chunk` below the
    total, from every process's marks (one each `mark_every` of its records), and when it
    windowed its last record."""
    ends = []
    boundary = chunk
    marks = sorted(mark for f in figures for mark in f["marks"])
    for index, mark in enumerate(marks, start=1):
        if index * mark_every >= boundary and boundary < total:
            ends.append(mark - origin)
            boundary += chunk
    ends.append(last_record_at - origin)
    return ends


def _parquet_rows(folder: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(path).metadata.num_rows for path in folder.rglob("*.parquet"))


def chunk_seconds(run: PeerRun) -> list[float]:
    """Each chunk's processing time, the first from `run` being called (start-up included, as
    the other stages' first batch includes theirs)."""
    ends = [run.run_started_s, *run.chunk_ends_s]
    return [later - earlier for earlier, later in itertools.pairwise(ends)]


def steady_rate(run: PeerRun, chunk: int) -> float:
    """Records per second after the first chunk: (records - chunk) / (last end - first end)."""
    if len(run.chunk_ends_s) < 2:
        return 0.0
    return (run.records - chunk) / (run.chunk_ends_s[-1] - run.chunk_ends_s[0])
