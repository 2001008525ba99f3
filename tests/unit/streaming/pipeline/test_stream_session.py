"""The stream's session: the scheduler pools that keep a compaction's tasks from holding its
batches up (`scheduler_conf`), and a start that launches the JVM before the stream's modules are
imported (`start_stream_session`)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from streaming.pipeline.stream_session import BATCHES_MIN_SHARE, COMPACTION_POOL, scheduler_conf


def test_the_batches_pool_comes_first_and_compaction_gets_its_own(tmp_path: Path) -> None:
    conf = scheduler_conf(tmp_path)
    assert conf["spark.scheduler.mode"] == "FAIR"
    pools = {
        pool.get("name"): pool
        for pool in ElementTree.parse(conf["spark.scheduler.allocation.file"]).getroot()
    }
    assert set(pools) == {"default", COMPACTION_POOL}
    assert pools["default"].findtext("minShare") == str(BATCHES_MIN_SHARE)
    assert pools[COMPACTION_POOL].findtext("minShare") == "0"


def test_the_session_can_start_before_the_stream_and_the_lake_are_imported() -> None:
    # In a fresh interpreter: this test process has imported everything already.
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, streaming.pipeline.stream_session; print(' '.join(sorted(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    heavy = {"streaming.app", "storage.lake.delta_lake", "storage.upkeep.compaction", "pandas"}
    assert heavy.isdisjoint(imported), heavy & set(imported)
