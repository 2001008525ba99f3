"""Operating the real stream: `run` refuses another stream's checkpoint before it writes, and
`vacuum` removes only files no commit references."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from infra.cli.main import main
from tests.support.pipeline_harness import Pipeline, record
from tests.support.timestamps import T0_MS


@pytest.mark.integration
def test_run_refuses_another_streams_checkpoint_before_writing(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = Pipeline.create(kafka, tmp_path, conf_dir)
    pipeline.produce([record("acme", "web", T0_MS)])
    pipeline.run_available_now(spark)
    other_lake = tmp_path / "other-lake"
    code = main(
        [
            "run", "--available-now",
            "--bootstrap-servers", kafka.bootstrap_servers,
            "--topic", pipeline.topic,
            "--checkpoint-dir", pipeline.settings.stream.checkpoint_dir,
            "--lake-root", str(other_lake),
        ]
    )  # fmt: skip
    assert code == 2
    assert "belongs to another stream" in capsys.readouterr().err
    assert not other_lake.exists()


@pytest.mark.integration
def test_vacuum_deletes_orphan_files_and_keeps_committed_rows(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = Pipeline.create(kafka, tmp_path, conf_dir)
    pipeline.produce([record("acme", "web", T0_MS + i * 1_000) for i in range(10)])
    pipeline.run_available_now(spark)
    events_dir = Path(pipeline.lake.root) / "events"
    committed = sorted(events_dir.rglob("*.parquet"))
    # What a crashed attempt leaves: a data file that no commit references.
    orphan = committed[0].with_name("part-00000-orphan-of-a-crashed-attempt.parquet")
    shutil.copy(committed[0], orphan)
    two_hours_ago = time.time() - 7_200
    os.utime(orphan, (two_hours_ago, two_hours_ago))
    rows_before = len(pipeline.table("events"))
    lake_args = ["--lake-root", pipeline.lake.root, "--retention", "1h"]

    assert main(["vacuum", *lake_args, "--dry-run"]) == 0
    assert "orphan-of-a-crashed-attempt" in capsys.readouterr().out
    assert orphan.exists()

    assert main(["vacuum", *lake_args]) == 0
    assert not orphan.exists()
    assert all(path.exists() for path in committed)
    assert len(pipeline.table("events")) == rows_before
