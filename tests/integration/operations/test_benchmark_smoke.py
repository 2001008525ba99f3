"""The benchmarks that run the stream work end to end on a tiny input (their figures are not
checked: CI machines are noisy; what is checked is that they saw every record and reported)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from infra.dev.benchmarks import continuous, noisy_neighbour, settle_keys
from infra.dev.benchmarks.sample_lake import bench_settings
from infra.dev.benchmarks.scale import parse_args, run, steady_ratios

pytestmark = pytest.mark.integration


def test_every_stage_reads_every_record_and_reports_its_figures(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    stages = ("read", "state_parquet", "builtin", "product", "peer")
    args = parse_args(
        [
            "--tenants",
            "3,40",
            "--records",
            "400",
            "--max-offsets",
            "150",
            "--stages",
            ",".join(stages),
        ]
    )
    results = run(spark, kafka, tmp_path, args)

    assert [(r.stage, r.tenants) for r in results] == [
        (stage, tenants) for tenants in (3, 40) for stage in stages
    ]
    for figures in results:
        # The peer (quixstreams) counts the records it windowed and times them in chunks of
        # `--max-offsets`, the other stages' batch size.
        assert figures.records == 400, figures
        assert figures.batches == 3 and figures.steady_rate > 0, figures
        # The broker's CPU while the stage ran is reported beside it (in clock ticks: a short
        # stage's may round to none).
        assert figures.extra["broker_cpu_s"] >= 0, figures
    assert all("product/peer" in ratios for ratios in steady_ratios(results).values())
    # Spark's own Parquet sink after the stateful stage kept every record it was given.
    assert [r.extra["records_written"] for r in results if r.stage == "state_parquet"] == [400, 400]
    product = results[-2]
    assert product.stage == "product"
    assert product.extra["keys"] == 80
    assert product.extra["files_per_table"]["events"] > 0
    assert product.extra["pane_delay_batches"].get("max", 0) <= 2
    # A batch's files follow its write tasks (4 here), not its 40 tenants; compaction settles
    # them in one file per partition.
    assert 0 < product.extra["adds_per_batch"]["events"]["max"] <= 4
    assert product.extra["compaction_files"] >= 40
    # The warm service's answer just after the compaction was timed, and was the same rows.
    assert product.extra["one_tenant_served_compacted_s"] > 0
    # Each group of the run's processes was found and sampled while the settle ran.
    assert all(mib > 0 for mib in product.extra["settle_peak_mib"].values()), product.extra


def test_the_settle_benchmark_settles_every_row_once_and_reports_what_each_process_spent(
    spark: Any, tmp_path: Path
) -> None:
    keys = 120
    args = settle_keys.parse_args(["--keys", str(keys), "--slice-files", "50"])
    result = settle_keys.settle_once(spark, tmp_path, keys, args)

    assert result["settled_files"] == 2 * keys
    for table in result["tables"].values():
        assert table["files"] == keys and table["staged_files"] == 0, result
        assert table["rows"] == result["records"] == 2 * keys, result
        assert table["commits"] > 2, result  # in slices: the runs, then each slice's files
    # The workers write the settled files, the driver commits them: each spent CPU on it.
    assert result["settle_cpu_s"]["worker"] > 0 and result["settle_cpu_s"]["driver"] > 0, result


def test_the_noisy_neighbour_probe_sees_every_quiet_record_of_every_phase(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    kafka.create_topic(noisy_neighbour.TOPIC, 2)
    timeline = noisy_neighbour.Timeline(warm_up_s=4, before_s=4, burst_s=2, after_s=4)
    settings = noisy_neighbour.probe_settings(kafka.bootstrap_servers, tmp_path)

    probe, batches = noisy_neighbour.run(spark, settings, timeline)

    figures = noisy_neighbour.phase_figures(probe, timeline)
    assert [f.phase for f in figures] == list(noisy_neighbour.PHASES)
    for phase in figures:
        # 3 quiet tenants at 10 records/s for 4 s, 2 s and 4 s (the pace may slip a little).
        assert len(phase.latencies_s) >= 30, phase.phase
        assert phase.unseen == 0, phase.phase
        assert 0 < phase.percentile_s(0.5) <= phase.percentile_s(1.0)
    assert probe.noisy_sent > 10 * (timeline.before_s + timeline.after_s)
    # The burst may still be in deferral (the default quota); the quiet records were windowed.
    assert sum(int(p["numInputRows"]) for p in batches) >= len(probe.sent_s)


def test_the_continuous_stream_is_timed_from_launch_and_a_standby_takes_over(
    kafka: Any, tmp_path: Path
) -> None:
    args = continuous.parse_args(
        ["--seconds", "6", "--restarts", "1", "--standby", "--window", "2s", "--partitions", "2"]
    )
    kafka.create_topic(continuous.TOPIC, args.partitions)
    figures = continuous.run(kafka.bootstrap_servers, tmp_path, args)

    assert figures["measured_records"] > 0 and figures["unseen"] == 0, figures
    first, takeover = figures["starts"]
    assert list(first["phases_s"]) == [
        "lease claimed",
        "Spark session",
        "query started",
        "first batch",
    ], first
    # The standby had its session before the kill: its takeover claims, starts, commits.
    assert takeover["kind"] == "standby after SIGKILL"
    assert "Spark session" not in takeover["phases_s"]
    assert 0 < takeover["phases_s"]["lease claimed"] < takeover["phases_s"]["first batch"]
    # Windows of 2 s close while it runs: their final panes were seen and timed.
    assert figures["final_panes"] > 0 and figures["final_pane_latency_s"]["p50"] > 0
    # Freshness by the minute each record was sent: 6 s make one minute, every record in it.
    (minute,) = figures["latency_s_per_minute"]
    assert 0 < minute["p50"] <= minute["max"] == figures["latency_s"]["max"], figures
    assert "freshness p95 / max per minute sent" in continuous.report(figures)
    # The first minute's files: the tables' newest versions hold some of what is on disk.
    (sample,) = figures["minutes"]
    assert 0 < sample["table_files"] < sample["lake_files"], sample


def test_the_continuous_benchmarks_topic_keeps_only_what_the_stream_has_not_committed(
    kafka: Any, tmp_path: Path
) -> None:
    """As a broker's retention would, and never a record the stream has yet to read."""
    # A topic of its own: the benchmark's run above leaves records in the session broker's
    # `continuous` topic, and its group's offsets.
    topic = f"{continuous.TOPIC}-retention"
    kafka.create_topic(topic, 1)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
    for number in range(100):
        producer.send(topic, str(number).encode())
    producer.flush()
    producer.close()
    settings = bench_settings(tmp_path, kafka.bootstrap_servers, topic, tmp_path)
    group = settings.kafka.group_id or settings.stream.name
    partition = TopicPartition(topic, 0)
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    admin.alter_group_offsets(group, {partition: OffsetAndMetadata(60, "", -1)})
    admin.close()

    retention = continuous.TopicRetention(settings, interval_s=0.2)
    retention.start()
    try:
        for _ in range(100):  # bounded: 10 s
            if retention.deleted_below:
                break
            time.sleep(0.1)
    finally:
        retention.stop()
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers)
    try:
        assert consumer.beginning_offsets([partition]) == {partition: 60}
        assert consumer.end_offsets([partition]) == {partition: 100}
    finally:
        consumer.close()
