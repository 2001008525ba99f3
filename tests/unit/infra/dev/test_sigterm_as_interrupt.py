"""A benchmark stopped with SIGTERM still stops what it started."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

# A harness in miniature: it says it is ready, then waits; its `finally` is where a real one
# stops its broker and streams.
_HARNESS = """
import sys, time
from infra.dev.local_process import sigterm_as_interrupt
try:
    with sigterm_as_interrupt():
        print("ready", flush=True)
        time.sleep(60)
finally:
    open(sys.argv[1], "w").write("cleaned up")
"""


def test_sigterm_runs_the_harness_s_finally_blocks(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    harness = subprocess.Popen(
        [sys.executable, "-c", _HARNESS, str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[4],
    )
    try:
        assert harness.stdout is not None
        assert harness.stdout.readline().strip() == "ready"
        started = time.monotonic()
        harness.terminate()
        harness.wait(30)
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
    assert time.monotonic() - started < 30
    assert marker.read_text() == "cleaned up"
    assert harness.returncode != 0  # still an interrupted run, not a success
