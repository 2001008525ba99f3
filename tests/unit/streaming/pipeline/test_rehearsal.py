"""A standby's rehearsal shares nothing a user or the running instance sees: its own stream name,
lake, checkpoint and lease, no metrics port and no offsets mirrored to the consumer group; and it
removes what it wrote. It ends at its first batch with records, and on a quiet topic a while after
its first batch, however long that cold batch took."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from streaming.pipeline import rehearsal as rehearsal_module
from streaming.pipeline.rehearsal import Rehearsal
from tenants.settings import AppSettings, LakeSettings, S3Settings, load_settings


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


class QueryRunning:
    """What the rehearsal reads of a running query: its committed batches' progress."""

    def __init__(self, batches: list[dict[str, int]]) -> None:
        self.recentProgress = batches
        self.isActive = True


def test_the_rehearsal_ends_at_the_first_committed_batch_with_records(tmp_path: Path) -> None:
    query = QueryRunning([{"numInputRows": 0}, {"numInputRows": 3}])
    rehearsal = Rehearsal.of(running_settings(tmp_path))
    assert rehearsal.wait_for_records(query, threading.Event()) is True


def test_on_a_quiet_topic_it_waits_the_quiet_limit_after_the_first_batch_not_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rehearsal_module, "QUIET_LIMIT_S", 0.5)
    query = QueryRunning([])
    rehearsal = Rehearsal.of(running_settings(tmp_path))
    # The cold first batch takes longer than the quiet limit: the wait goes on through it.
    threading.Timer(1.0, lambda: query.recentProgress.append({"numInputRows": 0})).start()
    started = time.monotonic()
    assert rehearsal.wait_for_records(query, threading.Event()) is False
    assert 1.5 <= time.monotonic() - started < 5


def test_a_stop_or_a_query_that_ended_ends_the_wait_at_once(tmp_path: Path) -> None:
    rehearsal = Rehearsal.of(running_settings(tmp_path))
    stopped = threading.Event()
    stopped.set()
    assert rehearsal.wait_for_records(QueryRunning([]), stopped) is False
    ended = QueryRunning([])
    ended.isActive = False
    assert rehearsal.wait_for_records(ended, threading.Event()) is False


def test_an_object_store_lake_rehearses_under_its_own_root_where_every_executor_reaches_it(
    tmp_path: Path,
) -> None:
    running = running_settings(tmp_path).model_copy(
        update={
            "lake": LakeSettings(
                root="s3://bucket/lakes/prod/",
                s3=S3Settings(endpoint_url="http://127.0.0.1:9000", allow_http=True),
            )
        }
    )
    scratch = Rehearsal.of(running).settings
    assert scratch.lake.root == "s3://bucket/lakes/prod/_rehearsal/orders"
    assert scratch.lake.s3 == running.lake.s3
