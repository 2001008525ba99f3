"""A compaction task's worker gives back the memory its rows took once the task is done
(`returning_memory`): Spark reuses the worker for every later batch, so whatever it keeps of
one compaction it keeps for the life of the stream."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A worker-like process: one task reads many files' rows (tens of Arrow tables, 256 MiB in all)
# and yields a row; the script prints how much of that the process still holds afterwards.
_TASK = textwrap.dedent(
    """
    import numpy as np
    import pyarrow as pa

    from storage.upkeep.compaction_tasks import returning_memory

    def resident_mib():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024

    def task(batches):
        files = [pa.table({"offset": np.arange(800_000) + index}) for index in range(40)]
        merged = pa.concat_tables(files).combine_chunks()
        yield pa.record_batch({"rows": [merged.num_rows]})

    before = resident_mib()
    for _ in returning_memory(task)(iter([])):
        pass
    print(resident_mib() - before)
    """
)


def test_a_worker_keeps_little_of_a_compaction_task_s_memory_once_it_is_done() -> None:
    kept_mib = float(
        subprocess.run(
            [sys.executable, "-c", _TASK], capture_output=True, text=True, check=True
        ).stdout
    )
    # The task's rows took 256 MiB; Arrow's pool would have kept most of them for reuse.
    assert kept_mib < 64, f"the worker still holds {kept_mib:.0f} MiB after the task"
