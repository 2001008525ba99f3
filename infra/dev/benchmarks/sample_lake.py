"""A lake written by the real stream from sample load: what the query benchmarks read."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from infra.dev.load_generator import LoadSpec, generate, send
from infra.dev.local_stack import LocalKafka
from storage.lake.delta_lake import DeltaLake
from streaming.app import StreamApp
from tenants.models import EventTimeSpec
from tenants.registry import load_registry
from tenants.settings import AppSettings, load_settings

PROJECT_CONF = Path(__file__).resolve().parents[3] / "conf"


def event_times(conf: Path) -> dict[str, EventTimeSpec]:
    """Where each source of `conf` carries its event time: what the load generator writes."""
    return {source: rules.event_time for source, rules in load_registry(conf).sources.items()}


def stream_sample_lake(
    spark: SparkSession,
    kafka: LocalKafka,
    conf: Path,
    workdir: Path,
    name: str,
    spec: LoadSpec,
    timeout_s: int = 900,
) -> tuple[AppSettings, DeltaLake]:
    """Send `spec`'s records for the tenants of `conf` to topic `name`, stream them into
    `workdir/lake` with `run --available-now`'s path, compacted; the settings and the lake."""
    kafka.create_topic(name, 2)
    send(generate(spec, event_times(conf)), kafka.bootstrap_servers, name, timeout_s=timeout_s)
    settings = load_settings(
        PROJECT_CONF / "app.yaml",
        environ={},
        overrides={
            "conf_dir": str(conf),
            "kafka.bootstrap_servers": kafka.bootstrap_servers,
            "kafka.topic": name,
            "lake.root": str(workdir / "lake"),
            "stream.checkpoint_dir": str(workdir / "checkpoint"),
            "stream.name": name,
            "stream.trigger_interval": "2s",
        },
    )
    lake = DeltaLake.from_settings(settings.lake)
    stream = StreamApp(settings, lake).start(spark, True)
    try:
        if not stream.query.awaitTermination(timeout=timeout_s):
            raise RuntimeError(f"the stream did not catch up within {timeout_s:g} s")
        stream.compact_now(spark)
    finally:
        stream.stop()
    return settings, lake
