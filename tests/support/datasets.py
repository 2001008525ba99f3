"""Sample load on a topic, and streams that read such a topic again.

A fault test produces its records once, runs a stream without the fault over them for the
tables to expect, and runs the faulty stream over the same topic: same batches, same rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from infra.dev.load_generator import LoadSpec, SampleRecord, generate
from tenants.conf_reader import load_registry
from tenants.registry import TenantRegistry
from tests.support.pipeline_harness import Broker, Pipeline
from tests.support.table_snapshots import snapshot


def sample_records(registry: TenantRegistry, spec: LoadSpec) -> Iterator[SampleRecord]:
    """`spec`'s records, each source's event time in the format the registry gives it."""
    return generate(spec, {name: source.event_time for name, source in registry.sources.items()})


def produce_dataset(
    kafka: Broker, conf_dir: Path, workdir: Path, spec: LoadSpec, partitions: int = 2
) -> str:
    """A new topic holding `spec`'s records for the config in `conf_dir`; its name."""
    registry = load_registry(conf_dir)
    samples = sample_records(registry, spec)
    producer = Pipeline.create(kafka, workdir, conf_dir, partitions=partitions)
    producer.produce_samples(samples)
    return producer.topic


def replay_pipeline(
    kafka: Broker, conf_dir: Path, workdir: Path, topic: str, batch_size: int, **options: Any
) -> Pipeline:
    """A stream in `workdir` (made if missing) over the existing two-partition `topic`, at most
    `batch_size` records a micro-batch."""
    workdir.mkdir(parents=True, exist_ok=True)
    return Pipeline(
        kafka,
        workdir,
        conf_dir,
        topic,
        partitions=2,
        max_offsets_per_trigger=batch_size,
        **options,
    )


def clean_run(
    kafka: Broker,
    spark: Any,
    conf_dir: Path,
    workdir: Path,
    topic: str,
    batch_size: int,
    **options: Any,
) -> dict[str, pd.DataFrame]:
    """The tables a run without any fault writes from `topic` (`replay_pipeline`'s stream, run
    to its end), as `snapshot` gives them: what a faulty run over the topic must end with."""
    pipeline = replay_pipeline(kafka, conf_dir, workdir, topic, batch_size, **options)
    pipeline.run_available_now(spark)
    return snapshot(pipeline)
