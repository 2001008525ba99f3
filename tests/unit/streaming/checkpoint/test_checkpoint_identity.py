"""A checkpoint belongs to one stream: a foreign, older or damaged one is refused with what to do.
(`run` refusing one, and `vacuum`: tests/integration/operations/test_vacuum_and_checkpoints.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streaming.checkpoint.checkpoint_identity import (
    IDENTITY_FILE,
    NEW_CHECKPOINT_STATE_BUCKETS,
    NEW_CHECKPOINT_STATE_LAYOUT,
    CheckpointMismatchError,
    StreamIdentity,
    claim_checkpoint,
)

IDENTITY = StreamIdentity(
    stream_name="orders",
    topic="events",
    lake_root="/lake",
    state_layout=NEW_CHECKPOINT_STATE_LAYOUT,
)


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
    current = IDENTITY.model_copy(update={"state_buckets": 64})
    with pytest.raises(CheckpointMismatchError, match="layout 1") as refused:
        claim_checkpoint(str(tmp_path), current)
    assert str(tmp_path) in str(refused.value)
    assert "reprocess" in str(refused.value)


def test_a_checkpoint_with_another_bucket_count_is_refused(tmp_path: Path) -> None:
    written = IDENTITY.model_copy(update={"state_buckets": 64})
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


def test_unset_buckets_take_a_new_checkpoints_default_and_an_existing_checkpoints_own(
    tmp_path: Path,
) -> None:
    unset = IDENTITY.model_copy(update={"balanced_for_tasks": 4})
    in_force = claim_checkpoint(str(tmp_path / "new"), unset)
    assert in_force.state_buckets == NEW_CHECKPOINT_STATE_BUCKETS
    assert in_force.balanced_for_tasks == 4
    recorded = json.loads((tmp_path / "new" / IDENTITY_FILE).read_text())
    assert (recorded["state_buckets"], recorded["balanced_for_tasks"]) == (16, 4)
    # What a checkpoint written before balanced buckets and with the old default recorded: it
    # resumes in its own 64 buckets, numbered by slot, not the new default's.
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / IDENTITY_FILE).write_text(
        json.dumps(
            {
                "stream_name": "orders",
                "topic": "events",
                "lake_root": "/lake",
                "state_layout": 2,
                "state_buckets": 64,
            }
        )
    )
    resumed = claim_checkpoint(str(tmp_path / "old"), unset)
    assert (resumed.state_buckets, resumed.balanced_for_tasks) == (64, None)


def test_a_checkpoint_in_the_binary_state_layout_resumes_in_it_and_a_new_one_is_text(
    tmp_path: Path,
) -> None:
    # What a checkpoint written before the text layout recorded: Spark keeps a checkpoint's
    # state schema for its life, so it is resumed in its own layout.
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / IDENTITY_FILE).write_text(
        json.dumps({**IDENTITY.model_dump(), "state_layout": 2, "state_buckets": 16})
    )
    assert claim_checkpoint(str(tmp_path / "binary"), IDENTITY).state_layout == 2
    assert claim_checkpoint(str(tmp_path / "new"), IDENTITY).state_layout == 3
    assert json.loads((tmp_path / "new" / IDENTITY_FILE).read_text())["state_layout"] == 3
