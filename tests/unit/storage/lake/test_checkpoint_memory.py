"""A stream's driver checkpoints its tables' logs for as long as it runs, and each checkpoint is
larger than the last while the tables' tombstones build up: the driver must not keep what each
one took (glibc keeps a freed heap's high-water mark unless it is given back)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# A driver as the command line starts one (its allocators), checkpointing a table a batch a
# second for ten checkpoint intervals: 60 files a batch, the oldest replaced, so the live files
# stay about 500 while the tombstones grow to 50,000.
_CHECKPOINT_AS_A_DRIVER = """
import json
import sys
import time

from streaming.pipeline.native_allocators import use_long_lived_allocators

use_long_lived_allocators()

from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import EVENTS


def resident_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


lake = DeltaLake(sys.argv[1])
lake.ensure_tables()
log = lake.log(EVENTS)
version = lake.head(EVENTS).version
lake.checkpoint_log(EVENTS)
stats = json.dumps({"numRecords": 100, "minValues": {"tenant": "t" * 40}, "nullCount": {}})
live = []
resident = []
for batch in range(1_000):
    now_ms = int(time.time() * 1000)
    added = [
        {
            "add": {
                "path": f"tenant=t{n % 12}/part-{batch:05d}-{n:03d}.parquet",
                "partitionValues": {column: f"t{n % 12}" for column in EVENTS.partition_by},
                "size": 1_000,
                "modificationTime": now_ms,
                "dataChange": True,
                "stats": stats,
            }
        }
        for n in range(60)
    ]
    removed = []
    if len(live) > 500:
        replaced, live = live[:60], live[60:]
        removed = [
            {
                "remove": {
                    "path": action["add"]["path"],
                    "deletionTimestamp": now_ms,
                    "dataChange": True,
                    "partitionValues": action["add"]["partitionValues"],
                    "size": 1_000,
                }
            }
            for action in replaced
        ]
    live.extend(added)
    version += 1
    assert log.try_commit(version, [{"commitInfo": {"timestamp": now_ms}}, *added, *removed])
    if version % 100 == 0:
        lake.checkpoint_log(EVENTS)
        resident.append(resident_mib())
print(json.dumps(resident))
"""


def test_the_driver_gives_back_what_each_checkpoint_took(tmp_path: Path) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", _CHECKPOINT_AS_A_DRIVER, str(tmp_path / "lake")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    resident_mib = json.loads(ran.stdout.splitlines()[-1])
    assert len(resident_mib) == 10
    # Kept, each checkpoint added 10-40 MiB here; given back, the process stays within a few.
    grown_mib = max(resident_mib[1:]) - resident_mib[1]
    assert grown_mib < 24, f"resident MiB after each checkpoint: {resident_mib}"
