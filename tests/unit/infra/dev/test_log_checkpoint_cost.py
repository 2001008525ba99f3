"""The checkpoint benchmark runs both writers on the log it builds and reports each, and the two
checkpoints hold the same files."""

from __future__ import annotations

import json
from pathlib import Path

from infra.dev.benchmarks.log_checkpoint_cost import main


def test_both_writers_checkpoint_the_sliced_log_and_agree(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"

    assert main(["--files", "70", "--slice-files", "25", "--json", str(figures)]) == 0

    results = json.loads(figures.read_text())
    rows = results if isinstance(results, list) else results["results"]
    assert [(row["writer"], row["files"], row["version"]) for row in rows] == [
        ("delta-rs", 70, 3),
        ("streamed", 70, 3),
    ]
    assert all(row["peak_mib"] >= row["peak_mib_before"] > 0 for row in rows)
