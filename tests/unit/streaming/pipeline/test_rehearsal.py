"""A standby's rehearsal shares nothing a user or the running instance sees: its own stream name,
lake, checkpoint and lease, no metrics port and no offsets mirrored to the consumer group; and it
removes what it wrote."""

from __future__ import annotations

from pathlib import Path

from streaming.pipeline.rehearsal import Rehearsal
from tenants.settings import AppSettings, load_settings


def running_settings(tmp_path: Path) -> AppSettings:
    return load_settings(
        None,
        environ={},
        overrides={
            "lake": {"root": str(tmp_path / "lake")},
            "stream": {
                "name": "orders",
                "checkpoint_dir": str(tmp_path / "checkpoints" / "orders") + "/",
                "metrics_port": 9108,
            },
            "kafka": {"topic": "events", "mirror_offsets": True, "starting_offsets": "earliest"},
        },
    )


def test_the_scratch_copy_shares_no_location_name_or_side_effect_with_the_stream(
    tmp_path: Path,
) -> None:
    running = running_settings(tmp_path)
    scratch = Rehearsal.of(running).settings

    assert scratch.stream.name == "orders-rehearsal"
    assert scratch.lake.root == f"{tmp_path}/lake/_rehearsal/orders"
    assert scratch.stream.checkpoint_dir == f"{tmp_path}/checkpoints/orders.rehearsal"
    assert scratch.stream.metrics_port is None
    assert scratch.kafka.mirror_offsets is False
    # It reads what arrives from now on, a trigger's worth a batch, never the topic's history.
    assert scratch.kafka.starting_offsets == "latest"
    assert scratch.kafka.max_offsets_per_trigger is not None
    # The same topic, config and plan: what it warms is what a takeover runs.
    assert scratch.kafka.topic == running.kafka.topic
    assert scratch.conf_dir == running.conf_dir
    assert scratch.stream.state_buckets == running.stream.state_buckets
    assert scratch.stream.shuffle_partitions == running.stream.shuffle_partitions


def test_remove_deletes_the_scratch_lake_and_checkpoint_and_nothing_of_the_stream(
    tmp_path: Path,
) -> None:
    running = running_settings(tmp_path)
    rehearsal = Rehearsal.of(running)
    kept = [
        tmp_path / "lake" / "events" / "part-0.parquet",
        tmp_path / "checkpoints" / "orders" / "commits" / "0",
    ]
    removed = [
        Path(rehearsal.settings.lake.root) / "events" / "part-0.parquet",
        Path(rehearsal.settings.stream.checkpoint_dir) / "commits" / "0",
    ]
    for path in kept + removed:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")

    rehearsal.remove()
    rehearsal.remove()  # nothing left to remove is no error

    assert all(path.exists() for path in kept)
    assert not Path(rehearsal.settings.lake.root).exists()
    assert not Path(rehearsal.settings.stream.checkpoint_dir).exists()
