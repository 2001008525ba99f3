"""Spark's Python worker daemon, with what every micro-batch's workers import already imported.

Spark starts one daemon per kind of Python work and forks a worker from it per task slot; each
fresh worker then imports pandas, pyarrow and this project on its first task. After a restart
that import, paid by every worker at once on a busy machine, was most of the first batch's
time. Imported here, before the daemon forks, a worker starts with them in memory.
"""

from __future__ import annotations

import pandas  # noqa: F401
import pyarrow  # noqa: F401
import pyspark.worker  # noqa: F401
from pyspark import daemon

import storage.lake.data_files  # noqa: F401
import streaming.kafka.source
import streaming.records.routing
import streaming.state.bucket_processor  # noqa: F401

if __name__ == "__main__":
    daemon.manager()
