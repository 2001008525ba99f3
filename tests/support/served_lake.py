"""The lake both SQL doors' tests serve (tests/integration/query/test_query_api.py over HTTP,
test_pg_door.py over the Postgres protocol): written by the real stream once per run, since
neither door writes to it, and read through each module's own config copy (its query limits
and API keys).

acme and globex have web and billing records; wayne's are drawn for the console's chart: web
(1 min windows, accumulating) with a gap from 00:02 to 00:04, and billing (5 min windows,
discarding) whose 00:00 window gets a late pane in a second run, so its panes' counts must be
summed (2 + 1). umbrella and initech are configured tenants without records.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.support.pipeline_harness import Broker, Pipeline, record
from tests.support.sample_conf import copy_conf
from tests.support.timestamps import T0_MS

MINUTE_MS = 60_000
FIRST_RUN = [
    *(record("acme", "web", T0_MS + seconds * 1000) for seconds in (0, 15, 30, 75)),
    record("acme", "billing", T0_MS + 1_000, amount=5),
    *(record("globex", "web", T0_MS + seconds * 1000) for seconds in (10, 20, 80)),
    *(record("wayne", "web", T0_MS + seconds * 1000) for seconds in (0, 20, 70, 245, 380)),
    *(record("wayne", "billing", T0_MS + seconds * 1000, amount=5) for seconds in (1, 20, 340)),
]
# Late for wayne's billing 00:00 window, whose on-time pane the first run wrote: a second pane.
SECOND_RUN = [record("wayne", "billing", T0_MS + 2 * MINUTE_MS, amount=7)]


def write_served_lake(kafka: Broker, spark: Any, workdir: Path, sample_conf: Path) -> Pipeline:
    """Stream FIRST_RUN, then SECOND_RUN, into a lake in `workdir`."""
    conf = copy_conf(sample_conf, workdir)
    (conf / "tenants" / "umbrella.yaml").write_text("id: umbrella\nsources: [web]\n")
    (conf / "tenants" / "wayne.yaml").write_text("id: wayne\nsources: {web: {}, billing: {}}\n")
    pipeline = Pipeline.create(kafka, workdir, conf)
    pipeline.produce(FIRST_RUN)
    pipeline.run_available_now(spark)
    pipeline.produce(SECOND_RUN)
    pipeline.run_available_now(spark)
    return pipeline


def with_query_limits(
    lake: Pipeline, folder: Path, limits: Mapping[str, Mapping[str, Any]]
) -> Pipeline:
    """`lake` read through a copy of its config in `folder`, with `limits` as the named
    tenants' `query:` settings: a module's own limits and keys, over the one lake."""
    conf = copy_conf(lake.conf_dir, folder)
    for tenant, query in limits.items():
        path = conf / "tenants" / f"{tenant}.yaml"
        path.write_text(path.read_text() + "query: " + json.dumps(dict(query)) + "\n")
    return dataclasses.replace(lake, conf_dir=conf)
