"""A compaction task's lowered priority ends with it on an S3 lake too: the threads that upload
its files are not left behind, at its priority, for the batches Spark later runs in that worker
(`storage.lake.lake_filesystem`, `storage.upkeep.worker_priority`)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from tests.support.s3_endpoint import BUCKET, moto_s3

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a priority per thread"),
]

ACCESS_KEY = "AKIACOMPACTIONPRIORITY"
SECRET_KEY = "s3cr3t-priority-test"

# A worker-like process: a compaction task writes files to the lake on S3, then the script prints
# the priority (nice) of every thread the process still has.
_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    import pyarrow as pa
    import pyarrow.parquet as pq
    from storage.lake.file_writer import writer_threads
    from storage.lake.lake_filesystem import filesystem_of
    from storage.upkeep.worker_priority import at_lowest_priority

    endpoint, bucket, access_key, secret_key = sys.argv[1:5]
    options = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
        "AWS_REGION": "us-east-1",
    }

    def compaction_task(batches):
        filesystem, base = filesystem_of(f"s3://{bucket}/lake", options)
        assert writer_threads(filesystem) > 1
        for number in range(40):
            rows = pa.table({"tenant": [f"t{number}"] * 100, "value": list(range(100))})
            pq.write_table(rows, f"{base}/events/part-{number}.parquet", filesystem=filesystem)
        yield pa.record_batch({"files": [40]})

    def lake():
        return filesystem_of(f"s3://{bucket}/lake", options)

    written = list(at_lowest_priority(compaction_task, warm=lake)(iter([])))
    listed = filesystem_of(f"s3://{bucket}/lake", options)[0].get_file_info(
        __import__("pyarrow.fs").fs.FileSelector(f"{bucket}/lake/events")
    )

    def threads():
        seen = []
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/stat") as stat:
                    name, fields = stat.read().split(" (", 1)[1].rsplit(")", 1)
            except FileNotFoundError:  # it ended as it was read
                continue
            seen.append((int(fields.split()[16]), name))
        return sorted(seen)

    # A thread that is ending is not left behind: a short-lived one (the compaction thread
    # itself, which `join` sees done just before it exits, or a client's one-request thread)
    # may still be listed for a moment. One that is left stays: polled for 5 s.
    for _ in range(50):
        seen = threads()
        if len({nice for nice, _ in seen}) == 1:
            break
        time.sleep(0.1)

    print(json.dumps({
        "files": written[0].to_pydict()["files"][0],
        "listed": len(listed),
        "threads": seen,
    }))
    """
)


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_s3(ACCESS_KEY, SECRET_KEY) as endpoint:
        yield f"http://{endpoint}"


def test_no_thread_is_left_at_a_compaction_task_s_priority_after_it_wrote_to_s3(
    s3_endpoint: str,
) -> None:
    finished = subprocess.run(
        [sys.executable, "-c", _WORKER, s3_endpoint, BUCKET, ACCESS_KEY, SECRET_KEY],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    seen = json.loads(finished.stdout)

    assert seen["files"] == 40
    assert seen["listed"] == 40
    priorities = {nice for nice, _name in seen["threads"]}
    assert len(priorities) == 1, seen["threads"]
