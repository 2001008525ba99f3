"""A Python worker forked from the stream's daemon keeps sharing the daemon's preloaded modules
after the worker's own garbage collections."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# The daemon's preparation, then a fork: the child collects all its garbage, as a long-lived
# worker eventually does, and the parent reads how much of its memory became the child's own.
_FORK_THEN_COLLECT = """
import gc
import json
import os
import sys

from streaming.pipeline.worker_daemon import prepare_to_fork

def private_dirty_mib(pid):
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) / 1024

if sys.argv[1] == "prepared":
    prepare_to_fork()
else:
    from streaming.pipeline.worker_daemon import PRELOADED
    import importlib
    for module in PRELOADED:
        importlib.import_module(module)
go, ready = os.pipe()
done, finished = os.pipe()
child = os.fork()
if child == 0:
    os.read(go, 1)
    gc.collect()
    os.write(finished, b"x")
    os.read(go, 1)
    os._exit(0)
before = private_dirty_mib(child)
os.write(ready, b"x")
os.read(done, 1)
after = private_dirty_mib(child)
os.write(ready, b"x")
os.waitpid(child, 0)
print(json.dumps({"grown_mib": after - before}))
"""


def _grown_mib(preparation: str) -> float:
    completed = subprocess.run(
        [sys.executable, "-c", _FORK_THEN_COLLECT, preparation],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[4],
        timeout=120,
    )
    return float(json.loads(completed.stdout.splitlines()[-1])["grown_mib"])


def test_a_workers_full_collection_keeps_the_daemons_modules_shared() -> None:
    unprepared = _grown_mib("imported only")
    prepared = _grown_mib("prepared")

    # Without the freeze the collection writes to every module object's header (16 MiB here).
    assert unprepared > 8
    assert prepared < 2
