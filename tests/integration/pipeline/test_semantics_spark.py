"""The contract's semantics through the real pipeline: real broker, real Spark query, real Delta
tables.

Idle keys, the future-skew guard, live onboarding and rule changes, `tenant_status`, agreement
with Spark SQL's own `window()`, independence from batch boundaries, and bad metric values.
Tests that need their own sources or tenants copy `conf/` into their temp folder and edit it.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
import pytest
import yaml
from kafka import KafkaProducer
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from streaming.app import StreamApp
from tests.support.pipeline_harness import Pipeline, record
from tests.support.sample_conf import copy_conf, write_tenant
from tests.support.timestamps import T0_MS
from tests.support.timestamps import epoch_ms as ms
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

SECOND_MS = 1_000
MINUTE_MS = 60_000
DAY_MS = 86_400_000

T = TypeVar("T")

METRICS = {
    "errors": {"kind": "count", "field": "level", "equals": "ERROR"},
    "revenue": {"kind": "sum", "field": "amount"},
    "top": {"kind": "max", "field": "amount"},
    "low": {"kind": "min", "field": "amount"},
    "avg": {"kind": "mean", "field": "amount"},
}


# --- config in the test's own folder -------------------------------------------------------


def add_sources(conf: Path, sources: Mapping[str, Mapping[str, Any]]) -> None:
    path = conf / "sources.yaml"
    data = yaml.safe_load(path.read_text())
    data["sources"].update(sources)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def epoch_source(**rules: Any) -> dict[str, Any]:
    """A source whose event time is `ts` in epoch milliseconds."""
    return {"event_time": {"field": "ts", "format": "epoch_ms"}, **rules}


def rec(tenant: str, source: str, ts_ms: int, **extra: Any) -> dict[str, Any]:
    """A record for the sources made by `epoch_source`."""
    return {"tenant": tenant, "source": source, "ts": ts_ms, **extra}


# --- reading the tables --------------------------------------------------------------------


def metrics_of(value: Any) -> dict[str, float | None]:
    if value is None:
        return {}
    return {k: (None if v is None or pd.isna(v) else float(v)) for k, v in value}


def of_key(frame: pd.DataFrame, tenant: str, source: str | None = None) -> pd.DataFrame:
    mask = frame["tenant"] == tenant
    if source is not None:
        mask &= frame["source"] == source
    return frame[mask]


def latest_status(pipeline: Pipeline, tenant: str, source: str) -> pd.Series | None:
    status = of_key(pipeline.table("tenant_status"), tenant, source)
    if status.empty:
        return None
    return status.sort_values("batch_id").iloc[-1]


def snapshot_count(pipeline: Pipeline) -> int:
    folder = Path(pipeline.settings.stream.checkpoint_dir) / "tenant_config"
    return len(list(folder.glob("*.json")))


def produce_partitioned(pipeline: Pipeline, items: Iterable[tuple[int, Mapping[str, Any]]]) -> None:
    """Produce in order, each record to the given partition (one in-flight request: no reorder)."""
    producer = KafkaProducer(
        bootstrap_servers=pipeline.kafka.bootstrap_servers,
        acks="all",
        max_in_flight_requests_per_connection=1,
    )
    try:
        for partition, value in items:
            producer.send(
                pipeline.topic,
                key=str(value["tenant"]).encode(),
                value=json.dumps(value).encode(),
                partition=partition,
            )
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)


# --- continuous queries ----------------------------------------------------------------------


class Running:
    """A continuous query under test; `wait_for` polls with a deadline and fails on errors."""

    def __init__(self, spark: Any, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.stream = StreamApp(pipeline.settings, pipeline.lake).start(spark, False)
        self.query = self.stream.query

    def assert_healthy(self) -> None:
        assert self.query.exception() is None, self.query.exception()
        assert self.query.isActive, "the query stopped"

    def batches_done(self) -> int:
        progress = self.query.recentProgress
        return max((int(p["batchId"]) for p in progress), default=-1)

    def wait_for(
        self,
        what: str,
        check: Callable[[], T | None],
        timeout_s: float = 60.0,
        tick: Callable[[], None] | None = None,
    ) -> T:

        def healthy() -> None:
            if tick is not None:
                tick()
            self.assert_healthy()

        return wait_until(
            check, timeout_s, what, alive=healthy, retry_on_assertion=True, interval_s=0.4
        )

    def wait_batches(self, count: int, timeout_s: float = 60.0) -> None:
        target = self.batches_done() + count
        self.wait_for(f"{count} more batches", lambda: self.batches_done() >= target, timeout_s)

    def stop(self) -> None:
        self.stream.stop()


# --- 1. idle keys ----------------------------------------------------------------------------


def test_an_idle_key_closes_its_windows_by_processing_time_while_another_tenant_sends(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    conf = copy_conf(conf_dir, tmp_path)
    fast = {
        "window": {"kind": "tumbling", "size": "2s"},
        "out_of_orderness": "1s",
        "allowed_lateness": "1s",
    }
    # busy sends without an idle timeout: a poll slower than 2 s must not make its records late.
    add_sources(
        conf, {"pulse": epoch_source(idle_timeout="2s", **fast), "steady": epoch_source(**fast)}
    )
    write_tenant(conf, "sleepy", {"pulse": {}})
    write_tenant(conf, "busy", {"steady": {}})
    pipeline = Pipeline.create(kafka, tmp_path, conf, trigger_interval="500ms")
    # sleepy: 0.0 s .. 5.0 s every 500 ms, then nothing. W = 5.0 - 1 = 4.5 s after the last one:
    # [0,2) is final by event time (W >= 3); [2,4) is ON_TIME but waits for W >= 5; [4,6) for
    # W >= 7: only processing time can get it there, after >= 2.5 s idle (one or two timeouts).
    sleepy = [rec("sleepy", "pulse", T0_MS + i * 500) for i in range(11)]
    last_event_watermark_ms = T0_MS + 4_500
    pipeline.produce(sleepy)

    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks=1)

    def busy_sends() -> None:
        # busy runs far ahead of sleepy in event time, at the wall clock.
        now_ms = time.time_ns() // 1_000_000
        producer.send(pipeline.topic, value=json.dumps(rec("busy", "steady", now_ms)).encode())
        producer.flush(timeout=10)

    def sleepy_closed() -> pd.DataFrame | None:
        windows = of_key(pipeline.table("windows"), "sleepy", "pulse")
        finals = windows[windows["is_final"]]
        assert len(finals) == 3, f"{len(finals)} of 3 final panes so far"
        status = latest_status(pipeline, "sleepy", "pulse")
        assert status is not None and status["open_windows"] == 0, status
        return windows

    running = Running(spark, pipeline)
    try:
        windows = running.wait_for("sleepy's final panes", sleepy_closed, 90, tick=busy_sends)
        status = of_key(pipeline.table("tenant_status"), "sleepy", "pulse").sort_values("batch_id")
        busy_events = of_key(pipeline.table("events"), "busy", "steady")
    finally:
        running.stop()
        producer.close(timeout=10)

    finals = windows[windows["is_final"]].sort_values("window_start")
    assert [
        (ms(s) - T0_MS, ms(e) - T0_MS)
        for s, e in zip(finals["window_start"], finals["window_end"], strict=True)
    ] == [(0, 2_000), (2_000, 4_000), (4_000, 6_000)]
    assert finals["count"].tolist() == [4, 4, 3]
    # The last two closed by processing time alone: W went past the last record's W.
    for _, pane in finals.iloc[1:].iterrows():
        assert ms(pane["watermark"]) >= ms(pane["window_end"]) + 1_000
        assert ms(pane["watermark"]) > last_event_watermark_ms
    record_batch = int(status.dropna(subset=["last_record_processing_time"])["batch_id"].min())
    assert (finals.iloc[1:]["batch_id"] > record_batch).all()
    final_status = status.iloc[-1]
    assert ms(final_status["watermark"]) > last_event_watermark_ms
    assert ms(final_status["max_event_time"]) == T0_MS + 5_000  # event time did not move
    assert final_status["on_time_records"] == len(sleepy)
    # W never decreased across the status snapshots.
    watermarks = [ms(w) for w in status["watermark"]]
    assert watermarks == sorted(watermarks)
    # Meanwhile the other tenant's records kept flowing, on time.
    assert len(busy_events) > 0
    assert set(busy_events["timing"]) == {"ON_TIME"}


# --- 2. future skew ------------------------------------------------------------------------


def test_a_record_far_in_the_future_is_quarantined_and_does_not_move_the_watermark(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    # Event times near the wall clock: processing time is the batch timestamp, about now.
    now_ms = time.time_ns() // 1_000_000
    good_before = [
        record("acme", "web", now_ms - s * SECOND_MS, event_id=f"g{s}") for s in (40, 35, 30)
    ]
    ahead = record("acme", "web", now_ms + 10 * DAY_MS, event_id="ahead")
    good_after = [record("acme", "web", now_ms - 25 * SECOND_MS, event_id="g25")]
    # Three records a batch: the skewed record shares a batch with an on-time one after it.
    pipeline = Pipeline.create(kafka, tmp_path, conf_dir, max_offsets_per_trigger=3)
    pipeline.produce([*good_before, ahead, *good_after])

    pipeline.run_available_now(spark)

    quarantine = pipeline.table("quarantine")
    assert quarantine["reason"].tolist() == ["future_skew"]
    assert json.loads(quarantine["value"].iloc[0])["event_id"] == "ahead"
    assert "max_future_skew" in quarantine["error"].iloc[0]
    events = pipeline.table("events")
    assert sorted(events["event_id"]) == sorted(["g40", "g35", "g30", "g25"])
    assert set(events["timing"]) == {"ON_TIME"}
    windows = of_key(pipeline.table("windows"), "acme", "web")
    assert not windows["is_final"].any(), windows
    assert pipeline.table("late_events").empty

    status = of_key(pipeline.table("tenant_status"), "acme", "web").sort_values("batch_id")
    assert len(status) == 2
    expected_watermark_ms = now_ms - 25 * SECOND_MS - 10 * SECOND_MS  # out_of_orderness 10 s
    assert [ms(w) for w in status["watermark"]] == [now_ms - 30_000 - 10_000, expected_watermark_ms]
    assert ms(status["max_event_time"].iloc[-1]) == now_ms - 25 * SECOND_MS
    assert status["open_windows"].iloc[-1] >= 1
    assert status["quarantined_records"].tolist() == [0, 1]


# --- 3. live onboarding, invalid config, changed rules ----------------------------------------


def test_live_onboarding_invalid_config_and_rule_change_without_restart(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    conf = copy_conf(conf_dir, tmp_path)
    pipeline = Pipeline.create(kafka, tmp_path, conf, trigger_interval="500ms")
    running = Running(spark, pipeline)
    try:
        running.wait_batches(1)
        # An unknown tenant is quarantined, not dropped.
        pipeline.produce([record("newco", "web", T0_MS + 1_000, event_id="early")])

        def early_quarantined() -> bool:
            rows = pipeline.table("quarantine")
            return bool(((rows["tenant"] == "newco") & (rows["reason"] == "unknown_tenant")).any())

        running.wait_for("newco quarantined as unknown_tenant", early_quarantined)

        # Onboard newco: once its snapshot is published, its records are accepted.
        published = snapshot_count(pipeline)
        write_tenant(conf, "newco", {"web": {}})
        running.wait_for("newco's config", lambda: snapshot_count(pipeline) == published + 1)
        pipeline.produce(
            [record("newco", "web", T0_MS + s * SECOND_MS, event_id=f"n{s}") for s in (5, 15)]
        )

        def newco_events(expected: int) -> Callable[[], pd.DataFrame | None]:
            def check() -> pd.DataFrame | None:
                events = of_key(pipeline.table("events"), "newco", "web")
                return events if len(events) == expected else None

            return check

        events = running.wait_for("newco's events", newco_events(2))
        assert set(events["timing"]) == {"ON_TIME"}

        # newco's first status row is in the first batch under its config (docs/tenants.md):
        # `configured`, with zero counters, if its records came in a later batch; `active` if
        # they came in that one. A key never has two rows in one batch.
        def newco_active() -> pd.DataFrame | None:
            status = of_key(pipeline.table("tenant_status"), "newco", "web")
            return status if (status["lifecycle"] == "active").any() else None

        newco_status = running.wait_for("newco's status", newco_active)
        assert not newco_status.duplicated("batch_id").any()
        first = newco_status.sort_values("batch_id").iloc[0]
        if first["lifecycle"] == "configured":
            assert first["on_time_records"] == 0 and pd.isna(first["watermark"])
            assert first["batch_id"] < events["batch_id"].min()
        else:
            assert first["lifecycle"] == "active"
            assert first["batch_id"] == events["batch_id"].min()

        # An invalid tenant file is refused; the stream keeps running with the last good config.
        published = snapshot_count(pipeline)
        (conf / "tenants" / "broken.yaml").write_text(
            "id: broken\nsources:\n  web:\n    window: {kind: hexagonal, size: 1m}\n"
        )
        running.wait_batches(3)
        # A file that is not UTF-8 (Latin-1 "é", as another platform's editor may save it) is
        # refused the same way: it must not stop the query.
        (conf / "tenants" / "cafe.yaml").write_bytes(b"id: caf\xe9\nsources: [web]\n")
        running.wait_batches(3)
        assert snapshot_count(pipeline) == published
        pipeline.produce(
            [
                record("acme", "web", T0_MS + 7_000, event_id="acme-after-invalid"),
                record("newco", "web", T0_MS + 20_000, event_id="n20"),
                record("broken", "web", T0_MS + 7_000, event_id="broken"),
            ]
        )

        def after_invalid() -> bool:
            events, quarantine = pipeline.table("events"), pipeline.table("quarantine")
            return {"acme-after-invalid", "n20"} <= set(events["event_id"]) and "broken" in set(
                quarantine["tenant"]
            )

        running.wait_for("records after the invalid change", after_invalid)
        quarantine = pipeline.table("quarantine")
        assert of_key(quarantine, "broken")["reason"].tolist() == ["unknown_tenant"]

        # A changed window rule (1m -> 5m) applies to windows opened after the change.
        published = snapshot_count(pipeline)
        (conf / "tenants" / "broken.yaml").unlink()
        (conf / "tenants" / "cafe.yaml").unlink()
        write_tenant(conf, "newco", {"web": {"window": {"kind": "tumbling", "size": "5m"}}})
        running.wait_for("the changed rule", lambda: snapshot_count(pipeline) == published + 1)
        pipeline.produce(
            [
                # [0, 5m) is a new 5-minute window; the open [0, 1m) keeps its minute.
                record("newco", "web", T0_MS + 30 * SECOND_MS, event_id="n30"),
                # W = 5m50s: [0, 1m) is final (end + 1m lateness); [0, 5m) fires ON_TIME.
                record("newco", "web", T0_MS + 6 * MINUTE_MS, event_id="n6m"),
                # W = 19m50s: every window so far is final.
                record("newco", "web", T0_MS + 20 * MINUTE_MS, event_id="n20m"),
            ]
        )

        def newco_finals() -> pd.DataFrame | None:
            windows = of_key(pipeline.table("windows"), "newco", "web")
            finals = windows[windows["is_final"]]
            return finals if len(finals) >= 3 else None

        finals = running.wait_for("newco's final panes", newco_finals)
        events = of_key(pipeline.table("events"), "newco", "web")
        running.assert_healthy()
    finally:
        running.stop()

    sizes = {
        row["event_id"]: (ms(row["window_start"]) - T0_MS, ms(row["window_end"]) - T0_MS)
        for _, row in events.iterrows()
    }
    minute, five = (0, MINUTE_MS), (0, 5 * MINUTE_MS)
    assert sizes == {
        "n5": minute,
        "n15": minute,
        "n20": minute,
        "n30": five,
        "n6m": (5 * MINUTE_MS, 10 * MINUTE_MS),
        "n20m": (20 * MINUTE_MS, 25 * MINUTE_MS),
    }
    totals = {
        (ms(s) - T0_MS, ms(e) - T0_MS): int(c)
        for s, e, c in zip(
            finals["window_start"], finals["window_end"], finals["count"], strict=True
        )
    }
    assert totals == {minute: 3, five: 1, (5 * MINUTE_MS, 10 * MINUTE_MS): 1}


# --- 4. tenant_status --------------------------------------------------------------------------


def test_tenant_status_has_a_row_per_key_and_batch_with_counters_matching_the_tables(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    s = SECOND_MS
    values: list[dict[str, Any] | bytes] = [
        record("acme", "web", T0_MS + 5 * s),
        record("acme", "web", T0_MS + 70 * s),  # W 60 s: [0, 1m) fires ON_TIME
        record("acme", "web", T0_MS + 30 * s),  # late for [0, 1m)
        record("globex", "billing", T0_MS + 10 * s),
        {"tenant": "acme", "source": "web", "ts": "not a time"},  # bad_event_time, key acme/web
        record("acme", "web", T0_MS + 135 * s),  # W 125 s: [0, 1m) final
        record("acme", "web", T0_MS + 50 * s),  # too late for [0, 1m)
        record("globex", "billing", T0_MS + 400 * s),
        {"tenant": "acme", "source": "mobile", "ts": 1},  # unknown_source: no such key
        record("initech", "web", T0_MS + 3 * s),
        record("globex", "billing", T0_MS + 20 * s),
        b"{not json",
        record("acme", "web", T0_MS + 140 * s),
        record("acme", "web", T0_MS + 60 * s),  # late for [1m, 2m): W 130 s < 2m + 1m
    ]
    pipeline = Pipeline.create(kafka, tmp_path, conf_dir, max_offsets_per_trigger=3)
    pipeline.produce(values)

    pipeline.run_available_now(spark)

    all_status = pipeline.table("tenant_status")
    events, late, quarantine = (pipeline.table(n) for n in ("events", "late_events", "quarantine"))
    assert all_status["batch_id"].notna().all()
    assert not all_status.duplicated(["tenant", "source", "batch_id"]).any()
    keys = {("acme", "web"), ("globex", "billing"), ("initech", "web")}
    status = all_status[all_status["lifecycle"] == "active"]
    assert set(zip(status["tenant"], status["source"], strict=True)) == keys
    # Batch 0 also announces every other configured key, with no watermark and zero counters.
    configured = all_status[all_status["lifecycle"] == "configured"]
    registry = pipeline.registry()
    every_key = {
        (tenant, source)
        for tenant in registry.tenants
        for source in registry.tenants[tenant].sources
    }
    first = status[status["batch_id"] == 0]
    in_batch_0 = set(zip(first["tenant"], first["source"], strict=True))
    assert set(zip(configured["tenant"], configured["source"], strict=True)) == (
        every_key - in_batch_0
    )
    assert set(configured["batch_id"]) == {0}
    assert configured["watermark"].isna().all()
    assert (configured["on_time_records"] == 0).all()

    quarantine_of_keys = quarantine[quarantine["tenant"].notna()]
    for tenant, source in keys:
        rows = of_key(status, tenant, source).sort_values("batch_id")
        key_events, key_late = of_key(events, tenant, source), of_key(late, tenant, source)
        key_quarantine = of_key(quarantine_of_keys, tenant, source)
        batches_with_records = (
            set(key_events["batch_id"])
            | set(key_late["batch_id"])
            | set(key_quarantine["batch_id"])
        )
        assert set(rows["batch_id"]) == batches_with_records, (tenant, source)
        for _, row in rows.iterrows():
            upto = row["batch_id"]
            seen = key_events[key_events["batch_id"] <= upto]
            assert row["on_time_records"] == (seen["timing"] == "ON_TIME").sum(), row
            assert row["late_records"] == (seen["timing"] == "LATE").sum(), row
            assert row["too_late_records"] == (key_late["batch_id"] <= upto).sum(), row
            assert row["quarantined_records"] == (key_quarantine["batch_id"] <= upto).sum(), row
        latest = rows.iloc[-1]
        assert latest["on_time_records"] + latest["late_records"] == len(key_events)
        assert latest["too_late_records"] == len(key_late)
        assert latest["quarantined_records"] == len(key_quarantine)
        rules = pipeline.registry().resolve(tenant, source)
        assert rules is not None
        assert (
            ms(latest["watermark"])
            == ms(latest["max_event_time"]) - rules.rules.out_of_orderness_ms
        )
        assert ms(latest["max_event_time"]) == ms(key_events["event_time"].max())

    acme = of_key(status, "acme", "web").sort_values("batch_id").iloc[-1]
    assert (acme["on_time_records"], acme["late_records"]) == (4, 2)
    assert (acme["too_late_records"], acme["quarantined_records"]) == (1, 1)
    assert set(quarantine["reason"]) == {"bad_event_time", "unknown_source", "malformed_json"}


# --- 5. agreement with Spark SQL -------------------------------------------------------------


def test_final_windows_agree_with_spark_sql_window_aggregates(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    conf = copy_conf(conf_dir, tmp_path)
    exact = {"out_of_orderness": "0s", "allowed_lateness": "0s", "metrics": METRICS}
    add_sources(
        conf,
        {
            "tum": epoch_source(window={"kind": "tumbling", "size": "1m"}, **exact),
            "sld": epoch_source(window={"kind": "sliding", "size": "1m", "slide": "20s"}, **exact),
        },
    )
    write_tenant(conf, "t1", {"tum": {}, "sld": {}})
    write_tenant(conf, "t2", {"tum": {"emit": "final_only"}, "sld": {"accumulation": "discarding"}})
    sizes = {"tum": ("1 minute", "1 minute"), "sld": ("1 minute", "20 seconds")}

    rng = random.Random(5)
    per_key: list[list[dict[str, Any]]] = []
    closing: list[dict[str, Any]] = []
    for tenant in ("t1", "t2"):
        for source in ("tum", "sld"):
            ts = T0_MS + rng.randrange(0, 30_000)
            records = []
            for _ in range(45):
                ts += rng.randrange(1_000, 15_000)  # in order: nothing is late
                extra: dict[str, Any] = {"level": rng.choice(["INFO", "INFO", "WARN", "ERROR"])}
                if rng.random() < 0.85:
                    extra["amount"] = round(rng.uniform(-50, 200), 2)
                records.append(rec(tenant, source, ts, **extra))
            per_key.append(records)
            # Far ahead in event time: its W closes every window above; its own stays open.
            closing.append(rec(tenant, source, ts + 10 * MINUTE_MS))
    rows = [r for records in per_key for r in records]
    # Interleave the keys at random; each key's records stay in event-time order.
    produced: list[dict[str, Any]] = []
    queues = [list(records) for records in per_key]
    while any(queues):
        produced.append(rng.choice([q for q in queues if q]).pop(0))
    pipeline = Pipeline.create(kafka, tmp_path, conf, max_offsets_per_trigger=80)
    pipeline.produce([*produced, *closing])

    pipeline.run_available_now(spark)

    assert pipeline.table("quarantine").empty
    assert pipeline.table("late_events").empty
    windows = pipeline.table("windows")
    finals = windows[windows["is_final"]]
    assert not finals.duplicated(["tenant", "source", "window_start"]).any()
    actual = {
        (row["tenant"], row["source"], ms(row["window_start"]), ms(row["window_end"])): (
            int(row["count"]),
            metrics_of(row["metrics"]),
        )
        for _, row in finals.iterrows()
    }

    schema = StructType(
        [
            StructField("tenant", StringType()),
            StructField("source", StringType()),
            StructField("ts", LongType()),
            StructField("level", StringType()),
            StructField("amount", DoubleType()),
        ]
    )
    frame = spark.createDataFrame(
        [(r["tenant"], r["source"], r["ts"], r.get("level"), r.get("amount")) for r in rows],
        schema,
    ).withColumn("event_time", F.expr("timestamp_millis(ts)"))
    expected: dict[tuple[str, str, int, int], tuple[int, dict[str, float | None]]] = {}
    for source, (size, slide) in sizes.items():
        grouped = (
            frame.where(F.col("source") == source)
            .groupBy("tenant", "source", F.window("event_time", size, slide).alias("w"))
            .agg(
                F.count("*").alias("count"),
                F.expr("count_if(level = 'ERROR')").alias("errors"),
                F.sum("amount").alias("revenue"),
                F.max("amount").alias("top"),
                F.min("amount").alias("low"),
                F.avg("amount").alias("avg"),
            )
            .select(
                "*",
                F.expr("unix_millis(w.start)").alias("start_ms"),
                F.expr("unix_millis(w.end)").alias("end_ms"),
            )
        )
        for row in grouped.collect():
            key = (row["tenant"], row["source"], row["start_ms"], row["end_ms"])
            expected[key] = (
                row["count"],
                {name: None if row[name] is None else float(row[name]) for name in METRICS},
            )

    assert len(expected) > 40
    # Every window of the records above is final (the closing records push W past them all).
    assert set(actual) == set(expected)
    for key, (count, metrics) in expected.items():
        actual_count, actual_metrics = actual[key]
        assert actual_count == count, key
        assert set(actual_metrics) == set(metrics), key
        for name, value in metrics.items():
            if value is None:
                assert actual_metrics[name] is None, (key, name)
            else:
                assert actual_metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-9), (key, name)


# --- 6. batch boundaries do not matter -------------------------------------------------------


def _random_stream(seed: int, count: int) -> list[tuple[int, dict[str, Any]]]:
    """(partition, record) pairs: three tenants, sliding and session sources, out of order."""
    rng = random.Random(seed)
    keys = [(t, s) for t in ("ta", "tb", "tc") for s in ("sess", "sld")]
    clocks = dict.fromkeys(keys, T0_MS)
    stream: list[tuple[int, dict[str, Any]]] = []
    for number in range(count):
        key = rng.choice(keys)
        clocks[key] += rng.choice([rng.randrange(0, 8_000)] * 9 + [rng.randrange(50_000, 90_000)])
        roll = rng.random()
        if roll < 0.78:
            delay = rng.randrange(0, 10_000)  # within out_of_orderness
        elif roll < 0.92:
            delay = rng.randrange(20_000, 70_000)  # late, or too late for some windows
        else:
            delay = rng.randrange(120_000, 300_000)  # too late
        extra: dict[str, Any] = {"event_id": f"r{number}", "amount": rng.randrange(0, 100)}
        if rng.random() < 0.2:
            extra["level"] = "ERROR"
        partition = {"ta": 0, "tb": 1, "tc": 0}[key[0]]
        stream.append((partition, rec(key[0], key[1], clocks[key] - delay, **extra)))
    return stream


def _members_of_final_windows(
    events: pd.DataFrame, finals: pd.DataFrame
) -> tuple[dict[tuple[str, str, str], list[str]], list[str]]:
    """Event ids per final window; session events mapped through merges.

    The tables do not record merges, so an events row whose session was absorbed is mapped to
    the final session of its key that contains the row's (then) session bounds. Returns the
    members and the event ids that more than one final session could hold.
    """
    bounds: dict[tuple[str, str], list[tuple[str, int, int]]] = {}
    for _, row in finals.iterrows():
        bounds.setdefault((row["tenant"], row["source"]), []).append(
            (row["window_id"], ms(row["window_start"]), ms(row["window_end"]))
        )
    members: dict[tuple[str, str, str], list[str]] = {}
    ambiguous: list[str] = []
    for _, row in events.iterrows():
        key = (row["tenant"], row["source"])
        candidates = bounds.get(key, [])
        final_ids = [window_id for window_id, _, _ in candidates]
        if row["window_id"] in final_ids:
            into = [row["window_id"]]
        elif row["source"] == "sess":
            start, end = ms(row["window_start"]), ms(row["window_end"])
            into = [w for w, s, e in candidates if s <= start and end <= e]
        else:
            into = []  # a fixed window still open at the end of the input
        if len(into) > 1:
            ambiguous.append(row["event_id"])
        elif into:
            members.setdefault((*key, into[0]), []).append(row["event_id"])
    return {k: sorted(v) for k, v in members.items()}, ambiguous


def _run_outputs(pipeline: Pipeline) -> dict[str, Any]:
    events = pipeline.table("events")
    late = pipeline.table("late_events")
    windows = pipeline.table("windows")
    finals = windows[windows["is_final"]]
    status = pipeline.table("tenant_status")
    return {
        "classification": sorted(
            zip(
                events["tenant"],
                events["source"],
                events["partition"].astype(int),
                events["offset"].astype(int),
                events["event_id"],
                events["window_id"],
                events["window_start"].map(ms),
                events["window_end"].map(ms),
                events["timing"],
                strict=True,
            )
        ),
        "late": sorted(
            zip(
                late["tenant"],
                late["source"],
                late["partition"].astype(int),
                late["offset"].astype(int),
                late["event_id"],
                late["window_start"].map(ms),
                late["window_end"].map(ms),
                late["lateness_ms"].astype(int),
                late["watermark"].map(ms),
                strict=True,
            )
        ),
        "finals": sorted(
            (
                row["tenant"],
                row["source"],
                row["window_id"],
                ms(row["window_start"]),
                ms(row["window_end"]),
                int(row["count"]),
                sorted(metrics_of(row["metrics"]).items()),
            )
            for _, row in finals.iterrows()
        ),
        "members": _members_of_final_windows(events, finals),
        "final_counts": {
            (row["tenant"], row["source"], row["window_id"]): int(row["count"])
            for _, row in finals.iterrows()
        },
        "batches": int(max(windows["batch_id"].max(), events["batch_id"].max())) + 1,
        "quarantine": len(pipeline.table("quarantine")),
        "open_sessions": int(
            sum(
                of_key(status, tenant, "sess").sort_values("batch_id")["open_windows"].iloc[-1]
                for tenant in set(status.loc[status["source"] == "sess", "tenant"])
            )
        ),
    }


def test_classification_and_final_totals_do_not_depend_on_batch_boundaries(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    conf = copy_conf(conf_dir, tmp_path)
    metrics = {"revenue": {"kind": "sum", "field": "amount"}, "errors": METRICS["errors"]}
    add_sources(
        conf,
        {
            "sess": epoch_source(
                window={"kind": "session", "gap": "30s"},
                out_of_orderness="20s",
                allowed_lateness="30s",
                metrics=metrics,
            ),
            "sld": epoch_source(
                window={"kind": "sliding", "size": "1m", "slide": "30s"},
                out_of_orderness="15s",
                allowed_lateness="45s",
                metrics={**metrics, "top": METRICS["top"]},
            ),
        },
    )
    write_tenant(conf, "ta", {"sess": {}, "sld": {}})
    write_tenant(conf, "tb", {"sess": {"emit": "final_only"}, "sld": {}})
    write_tenant(conf, "tc", {"sess": {}, "sld": {"emit": "final_only"}})
    stream = _random_stream(seed=23, count=420)

    outputs = []
    for name, per_trigger in (("big", 100_000), ("small", 37)):
        workdir = tmp_path / name
        workdir.mkdir()
        pipeline = Pipeline.create(
            kafka, workdir, conf, partitions=2, max_offsets_per_trigger=per_trigger
        )
        produce_partitioned(pipeline, stream)
        pipeline.run_available_now(spark)
        outputs.append(_run_outputs(pipeline))
    big, small = outputs

    assert big["batches"] == 1 and small["batches"] >= 10
    assert big["quarantine"] == small["quarantine"] == 0
    # The stream exercises what it should: late and too-late records, sessions that merged.
    assert any(row[8] == "LATE" for row in big["classification"])
    assert len(big["late"]) > 10
    landed = {row[4] for row in big["classification"]} | {row[4] for row in big["late"]}
    assert landed == {value["event_id"] for _, value in stream}
    session_ids = {row[5] for row in big["classification"] if row[1] == "sess"}
    final_session_ids = {row[2] for row in big["finals"] if row[1] == "sess"}
    # Ids that never got a final pane and are not still open were absorbed by a merge.
    assert len(session_ids - final_session_ids) > big["open_sessions"], "no session merged"
    assert len(big["finals"]) > 50

    for run in (big, small):
        members, ambiguous = run["members"]
        assert ambiguous == [], "events rows that several final sessions could hold"
        # The set of records per final window, sessions through their merges, is the count.
        assert {k: len(v) for k, v in members.items()} == run["final_counts"]
    assert small["members"] == big["members"]
    assert small["classification"] == big["classification"]
    assert small["late"] == big["late"]
    assert small["finals"] == big["finals"]


# --- 7. bad metric values ------------------------------------------------------------------

NUMBER = "<number>"


def with_number(body: Mapping[str, Any], number_text: str) -> bytes:
    """The record as JSON with the string NUMBER replaced by a raw JSON number literal."""
    return json.dumps(body).replace(json.dumps(NUMBER), number_text).encode()


def shop_conf(conf_dir: Path, tmp_path: Path) -> Path:
    """The sample config plus a source `shop` (epoch ms `ts`) with a sum over `order.amount`."""
    conf = copy_conf(conf_dir, tmp_path)
    add_sources(
        conf,
        {
            "shop": epoch_source(
                window={"kind": "tumbling", "size": "1m"},
                out_of_orderness="0s",
                metrics={"revenue": {"kind": "sum", "field": "order.amount"}},
            )
        },
    )
    write_tenant(conf, "acme", {"web": {}, "billing": {}, "shop": {}})
    return conf


def test_a_non_numeric_metric_value_is_quarantined_naming_the_field(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    pipeline = Pipeline.create(kafka, tmp_path, shop_conf(conf_dir, tmp_path))
    values = [  # offset = position
        rec("acme", "shop", T0_MS + 1_000, event_id="good", order={"amount": 12.5}),
        rec("acme", "shop", T0_MS + 2_000, event_id="text", order={"amount": "12.5"}),
        rec("acme", "shop", T0_MS + 3_000, event_id="bool", order={"amount": True}),
        rec("acme", "shop", T0_MS + 4_000, event_id="missing", order={}),
        # A valid JSON number no double holds: quarantined too, not fatal to the query.
        with_number(
            rec("acme", "shop", T0_MS + 5_000, event_id="huge", order={"amount": NUMBER}),
            "1" + "0" * 400,
        ),
        # A number longer than Python's int/str limit (4300 digits), in an unused field: the
        # value cannot be decoded, so it is malformed, and must not stop the query either.
        with_number(
            rec("acme", "shop", T0_MS + 6_000, event_id="long", n=NUMBER, order={"amount": 1}),
            "9" * 5_000,
        ),
        rec("acme", "shop", T0_MS + 70_000, event_id="closer", order={"amount": 1}),
    ]
    pipeline.produce(values)

    pipeline.run_available_now(spark)

    quarantine = pipeline.table("quarantine").sort_values("offset")
    assert quarantine["offset"].tolist() == [1, 2, 4, 5]
    assert quarantine["reason"].tolist() == ["bad_metric_value"] * 3 + ["malformed_json"]
    metric_rows = quarantine[quarantine["reason"] == "bad_metric_value"]
    assert set(metric_rows["tenant"]) == {"acme"} and set(metric_rows["source"]) == {"shop"}
    for error in metric_rows["error"]:
        assert "order.amount" in error and "revenue" in error, error
    assert sorted(pipeline.table("events")["event_id"]) == ["closer", "good", "missing"]
    windows = pipeline.table("windows")
    first = windows[windows["is_final"] & (windows["window_start"].map(ms) == T0_MS)]
    assert first["count"].tolist() == [2]
    assert metrics_of(first["metrics"].iloc[0]) == {"revenue": 12.5}
    status = latest_status(pipeline, "acme", "shop")
    assert status is not None and status["quarantined_records"] == 3
