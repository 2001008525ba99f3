"""The scale benchmark runs end to end on a tiny input (its figures are not checked: CI machines
are noisy; what is checked is that every stage ran over every record and reported)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.dev.benchmarks.scale import parse_args, run

pytestmark = pytest.mark.integration


def test_every_stage_reads_every_record_and_reports_its_figures(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    args = parse_args(["--tenants", "3,40", "--records", "400", "--max-offsets", "150"])
    results = run(spark, kafka, tmp_path, args)

    assert [(r.stage, r.tenants) for r in results] == [
        (stage, tenants) for tenants in (3, 40) for stage in ("read", "builtin", "product")
    ]
    for figures in results:
        assert figures.records == 400, figures
        assert figures.batches == 3 and figures.steady_rate > 0, figures
    product = results[-1]
    assert product.extra["keys"] == 80
    assert product.extra["files_per_table"]["events"] > 0
    assert product.extra["pane_delay_batches"].get("max", 0) <= 2
    # A batch's files follow its write tasks (4 here), not its 40 tenants; compaction settles
    # them in one file per partition.
    assert 0 < product.extra["adds_per_batch"]["events"]["max"] <= 4
    assert product.extra["compaction_files"] >= 40
