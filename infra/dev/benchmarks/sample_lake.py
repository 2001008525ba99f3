"""A lake written by the real stream from sample load: what the query benchmarks read."""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from infra.dev.load_generator import LoadSpec, generate, send
from infra.dev.local_stack import LocalKafka
from storage.lake.delta_lake import DeltaLake
from streaming.app import StreamApp
from tenants.conf_reader import load_registry
from tenants.models import EventTimeSpec
from tenants.settings import AppSettings, load_settings

PROJECT_CONF = Path(__file__).resolve().parents[3] / "conf"


def write_tenants_conf(
    conf: Path,
    tenant_ids: Iterable[str],
    sources: tuple[str, ...],
    sources_from: Path = PROJECT_CONF,
    listed: bool = False,
) -> Path:
    """A config folder at `conf`: the sources of the config at `sources_from`, and the tenants,
    each with `sources` at their default rules: a file per tenant, or (`listed`) one tenant list
    naming one rule set, as an operator onboards many tenants."""
    (conf / "tenants").mkdir(parents=True)
    shutil.copy(sources_from / "sources.yaml", conf / "sources.yaml")
    body = f"sources: [{', '.join(sources)}]\n"
    if listed:
        (conf / "rule_sets.yaml").write_text(f"rule_sets:\n  bench:\n    {body}")
        (conf / "tenant_lists").mkdir()
        rows = "".join(f"{tenant},bench\n" for tenant in tenant_ids)
        (conf / "tenant_lists" / "bench.csv").write_text(f"tenant_id,rule_set\n{rows}")
        return conf
    for tenant in tenant_ids:
        (conf / "tenants" / f"{tenant}.yaml").write_text(f"id: {tenant}\n{body}")
    return conf


def bench_settings(
    conf: Path,
    bootstrap_servers: str,
    topic: str,
    workdir: Path,
    name: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> AppSettings:
    """The project's `app.yaml` for a benchmark's stream `name` (None: `app.yaml`'s): config
    `conf`, the topic, and its lake and checkpoint in `workdir`; `overrides` by dotted name on
    top."""
    named = {} if name is None else {"stream.name": name}
    return load_settings(
        PROJECT_CONF / "app.yaml",
        environ={},
        overrides={
            "conf_dir": str(conf),
            "kafka.bootstrap_servers": bootstrap_servers,
            "kafka.topic": topic,
            "lake.root": str(workdir / "lake"),
            "stream.checkpoint_dir": str(workdir / "checkpoint"),
            **named,
            **(overrides or {}),
        },
    )


def without_limits(settings: AppSettings, **stream: Any) -> AppSettings:
    """Capacity, not policy: the tenants of a benchmark run as fast as the stream can, so the
    project's default quota and window budget are lifted; `stream` changes more of its
    settings (by field name)."""
    lifted = settings.stream.model_copy(
        update={"default_quota": None, "window_budget": None, **stream}
    )
    return settings.model_copy(update={"stream": lifted})


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
    settings = bench_settings(
        conf, kafka.bootstrap_servers, name, workdir, name, {"stream.trigger_interval": "2s"}
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
