"""CPU cost of the stateful stage per record, at several tenant counts, without Spark.

    .venv/bin/python -m infra.dev.benchmarks.bucket_cost [--tenants 10,10000] [--profile]

It does what one `applyInPandasWithState` call does for each bucket of keys, in one process:
the scale benchmark's records (same generator, seed and shape) are routed, split into micro-
batches and into `stream.state_buckets` buckets, and each bucket's state goes through
`bucket_processor.run_bucket` (decode, process, the output frame, encode),
batch after batch. Spark's own costs (shipping rows and state between the JVM and Python, the
state store) are not in it: this isolates what the product's Python does per key and per record.
Times are this process's CPU time. `--profile` prints the top functions (cProfile).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import tempfile
import time
import zlib
from pathlib import Path

import pandas as pd

from infra.dev.benchmarks.sample_lake import write_tenants_conf
from infra.dev.load_generator import LoadSpec, generate
from streaming.records.routing import route_frame
from streaming.state.bucket_processor import run_bucket, sorted_batch
from tenants.conf_reader import load_registry
from tenants.registry import TenantRegistry

T0_MS = 1_767_225_600_000


def routed_batches(
    registry: TenantRegistry,
    tenants: int,
    sources: tuple[str, ...],
    records: int,
    batch_size: int,
) -> list[pd.DataFrame]:
    tenant_ids = tuple(f"t{n:06d}" for n in range(tenants))
    spec = LoadSpec(
        tenants=tenant_ids,
        sources=sources,
        count=records,
        jitter=5_000,
        late_share=0.02,
        malformed_share=0.0,
        seed=20261123,
    )
    samples = list(generate(spec, {n: s.event_time for n, s in registry.sources.items()}))
    frame = pd.DataFrame(
        {
            "key": [sample.key for sample in samples],
            "value": [sample.value for sample in samples],
            "topic": "bench",
            "partition": [index % 4 for index in range(len(samples))],
            "offset": list(range(len(samples))),
            "kafka_timestamp_ms": T0_MS,
        }
    )
    routed = route_frame(frame, registry, 1_048_576)
    return [routed.iloc[start : start + batch_size] for start in range(0, len(routed), batch_size)]


def run(registry: TenantRegistry, batches: list[pd.DataFrame], buckets: int) -> float:
    """CPU seconds of the stateful stage over every batch."""
    blobs: dict[int, bytes] = {}
    # Which bucket each record goes to is Spark's work in the stream: not timed here.
    bucket_of = [
        (batch["tenant"].fillna("") + "/" + batch["source"].fillna("")).map(
            lambda key: zlib.crc32(key.encode()) % buckets
        )
        for batch in batches
    ]
    started = time.process_time()
    for batch, buckets_of_batch in zip(batches, bucket_of, strict=True):
        # A stream that keeps up: processing time just past the batch's newest event time, so
        # no record is quarantined as being from the future.
        now_ms = int(batch["event_time_ms"].max()) + 60_000
        for bucket, rows in batch.groupby(buckets_of_batch):
            sorted_rows = sorted_batch([rows.reset_index(drop=True)])
            result = run_bucket(blobs.get(int(bucket)), sorted_rows, registry, now_ms)
            if result.blob is not None:
                blobs[int(bucket)] = result.blob
    return time.process_time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", default="10,10000")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=50_000)
    parser.add_argument("--buckets", type=int, default=64)
    parser.add_argument("--sources", type=int, default=2, choices=[1, 2])
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    print(f"{'tenants':>8} {'records':>8} {'CPU s':>7} {'us/record':>10}")
    for tenants in (int(n) for n in args.tenants.split(",")):
        sources = ("web", "billing")[: args.sources]
        workdir = Path(tempfile.mkdtemp(prefix="tw-bucket-cost-"))
        try:
            # A tenant list, as the scale benchmark onboards its tenants: a million files would
            # take longer to write than the run.
            conf = write_tenants_conf(
                workdir / "conf", (f"t{n:06d}" for n in range(tenants)), sources, listed=True
            )
            registry = load_registry(conf)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        batches = routed_batches(registry, tenants, sources, args.records, args.batch_size)
        profiler = cProfile.Profile() if args.profile else None
        if profiler is not None:
            profiler.enable()
        seconds = run(registry, batches, args.buckets)
        if profiler is not None:
            profiler.disable()
        records = sum(len(batch) for batch in batches)
        print(f"{tenants:>8} {records:>8} {seconds:>7.2f} {seconds * 1e6 / records:>10.1f}")
        if profiler is not None:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
