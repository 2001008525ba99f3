"""Operating the stream: foreign checkpoints are refused; `vacuum` removes only unreferenced files."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from infra.cli.main import main
from streaming.checkpoint.checkpoint_identity import (
    IDENTITY_FILE,
    CheckpointMismatchError,
    StreamIdentity,
    claim_checkpoint,
)
from streaming.state.bucket_state import STATE_LAYOUT
from tests.harness import Pipeline, record

T0_MS = 1_767_225_600_000
IDENTITY = StreamIdentity(stream_name="orders", topic="events", lake_root="/lake")


def test_a_new_checkpoint_is_claimed_and_the_same_stream_resumes_it(tmp_path: Path) -> None:
    claim_checkpoint(str(tmp_path / "cp"), IDENTITY)
    claim_checkpoint(str(tmp_path / "cp"), IDENTITY)
    assert json.loads((tmp_path / "cp" / IDENTITY_FILE).read_text())["stream_name"] == "orders"


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"stream_name": "billing"}, "stream_name 'orders' (this run: 'billing')"),
        ({"topic": "other"}, "topic 'events' (this run: 'other')"),
        ({"lake_root": "/elsewhere"}, "lake_root '/lake' (this run: '/elsewhere')"),
    ],
)
def test_a_checkpoint_of_another_stream_is_refused(
    tmp_path: Path, changed: dict[str, str], named: str
) -> None:
    claim_checkpoint(str(tmp_path), IDENTITY)
    with pytest.raises(CheckpointMismatchError, match="belongs to another stream") as refused:
        claim_checkpoint(str(tmp_path), IDENTITY.model_copy(update=changed))
    assert named in str(refused.value)


def test_a_checkpoint_with_an_older_state_layout_is_refused_with_what_to_do(
    tmp_path: Path,
) -> None:
    # What a checkpoint of the version that kept one state row per key recorded.
    (tmp_path / IDENTITY_FILE).write_text(
        json.dumps({"stream_name": "orders", "topic": "events", "lake_root": "/lake"})
    )
    current = IDENTITY.model_copy(update={"state_layout": STATE_LAYOUT, "state_buckets": 64})
    with pytest.raises(CheckpointMismatchError, match="layout 1") as refused:
        claim_checkpoint(str(tmp_path), current)
    assert str(tmp_path) in str(refused.value)
    assert "reprocess" in str(refused.value)


def test_a_checkpoint_with_another_bucket_count_is_refused(tmp_path: Path) -> None:
    written = IDENTITY.model_copy(update={"state_layout": STATE_LAYOUT, "state_buckets": 64})
    claim_checkpoint(str(tmp_path), written)
    with pytest.raises(CheckpointMismatchError, match=r"set stream\.state_buckets to 64"):
        claim_checkpoint(str(tmp_path), written.model_copy(update={"state_buckets": 8}))


def test_a_damaged_or_foreign_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / IDENTITY_FILE).write_text("{not json")
    with pytest.raises(CheckpointMismatchError, match="damaged"):
        claim_checkpoint(str(tmp_path / "damaged"), IDENTITY)
    (tmp_path / "spark-only" / "offsets").mkdir(parents=True)
    with pytest.raises(CheckpointMismatchError, match="not written by tenant-windows"):
        claim_checkpoint(str(tmp_path / "spark-only"), IDENTITY)


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
