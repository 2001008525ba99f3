"""The scale benchmark's `peer` stage: quixstreams, the Python library a user would pick instead,
windowing the same preloaded topic on the same broker (issue 37).

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
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.dev.local_process import rss_mib
from tenants.models import SourceConfig, TumblingWindow

PEER_REQUIREMENT = "quixstreams==3.28.1"
PEER_VENV = Path(__file__).resolve().parents[3] / ".venv" / "peer-quixstreams"
_APP = Path(__file__).with_name("quix_peer_app.py")
_INSTALL_TIMEOUT_S = 600
# After the peer's own timeout: it needs a few seconds to stop and print its figures.
_EXIT_GRACE_S = 60


@dataclass(frozen=True)
class PeerRun:
    records: int
    seconds: float
    """From the Application's creation to its `run` returning (the final commit included)."""
    run_started_s: float
    """When `run` was called, from the same origin as `chunk_ends_s`."""
    chunk_ends_s: list[float]
    """When each chunk of records (the last may be shorter) had been windowed."""
    late_dropped: int
    windows_emitted: int
    close_s: float | None
    peak_mib: float


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
) -> PeerRun:
    """Window `records` records of `topic` in quixstreams; it stops once it has them all."""
    python = peer_python()
    workdir.mkdir(parents=True, exist_ok=True)
    state_dir = Path(tempfile.mkdtemp(prefix="quix-state-", dir=workdir))
    command = [
        str(python),
        str(_APP),
        "--broker",
        bootstrap_servers,
        "--topic",
        topic,
        # A group of its own: the run reads the topic from its start, and the changelog topics
        # quixstreams names after the group are this run's alone.
        "--group",
        f"tw-scale-peer-{uuid.uuid4().hex[:12]}",
        "--state-dir",
        str(state_dir),
        "--records",
        str(records),
        "--chunk",
        str(chunk),
        "--timeout-s",
        str(timeout_s),
        "--sources",
        json.dumps(window_rules(sources)),
    ]
    peak = [0.0]
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=workdir,
        # No Quix Cloud: its SDK token would point the Application at the platform's brokers.
        env={name: value for name, value in os.environ.items() if not name.startswith("Quix__")},
    ) as process:
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.2):  # ends with the peer
                peak[0] = max(peak[0], rss_mib(process.pid))

        sampler = threading.Thread(target=sample, name="peer-rss", daemon=True)
        sampler.start()
        try:
            stdout, stderr = process.communicate(timeout=timeout_s + _EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()  # the process this call started, by its PID
            process.communicate()
            raise TimeoutError(f"the peer did not stop within {timeout_s}s") from None
        finally:
            done.set()
            sampler.join()
    if process.returncode != 0:
        raise RuntimeError(f"the peer failed ({process.returncode}): {stderr[-4000:]}")
    figures = json.loads(stdout.strip().splitlines()[-1])
    return PeerRun(
        records=figures["records"],
        seconds=figures["seconds"],
        run_started_s=figures["run_started"],
        chunk_ends_s=figures["chunk_ends"],
        late_dropped=figures["late_dropped"],
        windows_emitted=figures["windows_emitted"],
        close_s=figures["close_s"],
        peak_mib=peak[0],
    )


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
