"""`run --metrics-port`: a scrape of a real stream balances with its tables and its checkpoint;
the alert rules and the dashboard ask only for metrics the stream or the query service exports."""

from __future__ import annotations

import json
import re
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from infra.dev.load_generator import LoadSpec
from infra.service.query_metrics import QueryMetrics
from streaming.app import StreamApp
from streaming.checkpoint.checkpoint_log import COMMITS_DIR, CheckpointLog
from tenants.conf_reader import load_registry
from tests.support.datasets import sample_records
from tests.support.paths import ROOT
from tests.support.pipeline_harness import Pipeline

pytestmark = pytest.mark.integration

OBSERVABILITY = ROOT / "infra" / "observability"
RECORDS = 900
Samples = dict[str, list[tuple[dict[str, str], float]]]


@pytest.fixture(scope="module")
def scraped(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Pipeline, Samples, int]:
    """Three batches with malformed and too-late records, scraped before the stream stops;
    also the writer epoch."""
    pipeline = Pipeline.create(
        kafka,
        tmp_path_factory.mktemp("metrics"),
        conf_dir,
        partitions=2,
        max_offsets_per_trigger=RECORDS // 3,
        # Three sample tenants: two get series of their own, the third is `_other`.
        environ={"TW_STREAM__METRICS_PORT": "0", "TW_STREAM__METRICS_TOP_TENANTS": "2"},
    )
    registry = load_registry(conf_dir)
    spec = LoadSpec(count=RECORDS, malformed_share=0.05, late_share=0.05, seed=5)
    pipeline.produce_samples(sample_records(registry, spec))
    app = StreamApp(pipeline.settings, pipeline.lake).start(spark, True)
    try:
        assert app.query.awaitTermination(timeout=240), "the stream did not finish"
        assert app.query.exception() is None, app.query.exception()
        assert app.progress.drain(30), "a batch's progress was not reported"
        assert app.metrics is not None and app.metrics.port
        url = f"http://127.0.0.1:{app.metrics.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            text = response.read().decode()
        epoch = app.lease.epoch
        assert epoch is not None
    finally:
        app.stop()
    with pytest.raises(OSError):  # the endpoint went with the stream
        urllib.request.urlopen(url, timeout=5)
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        samples.setdefault(family.name, [])  # exported, if with no series yet
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return pipeline, samples, epoch


def _value(samples: Samples, name: str, **labels: str) -> float:
    matching = [value for found, value in samples[name] if labels.items() <= found.items()]
    assert len(matching) == 1, (name, labels, samples.get(name))
    return matching[0]


def _by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {found[label]: value for found, value in samples.get(name, [])}


def test_the_counts_balance_with_the_tables(scraped: tuple[Pipeline, Samples, int]) -> None:
    pipeline, samples, _ = scraped
    assert _value(samples, "tenant_windows_records_read_total") == RECORDS
    for table in ("events", "windows", "late_events", "quarantine", "tenant_status"):
        rows = len(pipeline.table(table))
        assert _value(samples, "tenant_windows_rows_written_total", table=table) == rows, table
    events = pipeline.table("events")
    outcomes = _by_label(samples, "tenant_windows_record_windows_total", "outcome")
    assert outcomes == {
        "on_time": (events["timing"] == "ON_TIME").sum(),
        "late": (events["timing"] == "LATE").sum(),
        "too_late": len(pipeline.table("late_events")),
    }
    assert outcomes["too_late"] > 0 and outcomes["late"] + outcomes["on_time"] == len(events)
    quarantined = _by_label(samples, "tenant_windows_quarantined_records_total", "reason")
    assert quarantined == dict(Counter(pipeline.table("quarantine")["reason"]))
    assert sum(quarantined.values()) > 0
    assert _value(samples, "tenant_windows_deferred_records_total") == 0


def test_batches_lag_lease_and_notifications(scraped: tuple[Pipeline, Samples, int]) -> None:
    pipeline, samples, epoch = scraped
    committed = CheckpointLog(pipeline.settings.stream.checkpoint_dir).latest_batch(COMMITS_DIR)
    assert committed is not None and committed >= 2
    assert _value(samples, "tenant_windows_last_committed_batch") == committed
    assert _value(samples, "tenant_windows_batch_duration_seconds_count") == committed + 1
    assert _value(samples, "tenant_windows_batch_duration_seconds_sum") > 0
    # Everything in the topic was read: no lag on either partition.
    assert _by_label(samples, "tenant_windows_kafka_lag_records", "partition") == {
        "0": 0,
        "1": 0,
    }
    assert _value(samples, "tenant_windows_writer_lease_held") == 1
    assert _value(samples, "tenant_windows_writer_epoch") == epoch
    assert _value(samples, "tenant_windows_dead_letter_notifications") == 0
    assert "tenant_windows_notification_backlog_batches" in samples


def test_keys_open_windows_and_the_tenants_that_trail_most(
    scraped: tuple[Pipeline, Samples, int],
) -> None:
    pipeline, samples, _ = scraped
    status = pipeline.table("tenant_status").sort_values("batch_id")
    latest = status.groupby(["tenant", "source"]).last().reset_index()
    held = latest[latest["lifecycle"] == "active"]
    assert _value(samples, "tenant_windows_keys") == len(held) > 0
    assert _value(samples, "tenant_windows_open_windows") == held["open_windows"].sum() > 0
    held = held.assign(delay_s=(held["max_event_time"] - held["watermark"]).dt.total_seconds())
    per_tenant = held.groupby("tenant").agg(
        watermark=("watermark", "min"), delay_s=("delay_s", "max")
    )
    per_tenant["watermark_s"] = per_tenant["watermark"].map(lambda at: at.timestamp())
    ranked = per_tenant.sort_values(["watermark_s"]).reset_index()
    assert len(ranked) == 3 and (ranked["delay_s"] > 0).all()
    watermarks = _by_label(samples, "tenant_windows_watermark_timestamp_seconds", "tenant")
    delays = _by_label(samples, "tenant_windows_watermark_delay_seconds", "tenant")
    slowest, third = ranked.iloc[:2], ranked.iloc[2]
    assert set(watermarks) == set(delays) == {*slowest["tenant"], "_other"}
    for row in slowest.itertuples():
        assert (watermarks[row.tenant], delays[row.tenant]) == (row.watermark_s, row.delay_s)
    # The third tenant is the remainder.
    assert (watermarks["_other"], delays["_other"]) == (third["watermark_s"], third["delay_s"])
    assert _value(samples, "tenant_windows_deferred_backlog_records") == 0
    assert samples["tenant_windows_tenant_deferred_backlog_records"] == []


def _metric_names(expression: str) -> set[str]:
    return set(re.findall(r"\btenant_windows_[a-z_]+", expression))


def test_the_alerts_and_the_dashboard_ask_for_exported_metrics(
    scraped: tuple[Pipeline, Samples, int],
) -> None:
    _, samples, _ = scraped
    # The query service's series all exist from its start (every outcome at 0).
    served = {
        sample.name for family in QueryMetrics().registry.collect() for sample in family.samples
    }
    rules = yaml.safe_load((OBSERVABILITY / "alerts.yml").read_text())
    alerts = {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}
    assert {
        "TenantWindowsStalled",
        "TenantWindowsDeadLetters",
        "TenantWindowsLeaseLost",
        "TenantWindowsQueryLatencyHigh",
    } <= set(alerts)
    dashboard = json.loads((OBSERVABILITY / "grafana-dashboard.json").read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    asked = set().union(*map(_metric_names, [*alerts.values(), *queries]))
    assert asked, "no metric found in the rules and the dashboard"
    exported = set(samples) | served
    assert asked <= exported, f"not exported: {sorted(asked - exported)}"
    assert asked & served and asked & set(samples), "no rule or panel for the stream or the service"
