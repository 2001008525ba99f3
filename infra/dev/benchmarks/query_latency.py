"""Query service latency: 8 tenants querying a warm `serve` at once, alone and beside a heavy one.

    .venv/bin/python -m infra.dev.benchmarks.query_latency [--seconds 20] [--tenants 8]

It writes a lake with the real stream (a local broker, sample load for `--tenants` tenants,
`run --available-now`), starts the query service in this process on loopback (FAIR scheduler,
as `serve` runs it), issues each tenant a key and then measures, over HTTP:

1. `same`: every tenant runs a small scoped query (its final windows' count) in a loop, all at
   once; p50 and p95 per request. The statement repeats, as a dashboard's does, so most answers
   are the service's remembered result for the tables' current versions;
2. `distinct`: the same, but every statement differs, so none is a remembered result: the
   in-process engine answers each (`storage.query.local_sql`);
3. `distinct spark`: `distinct` with the in-process engine switched off (`query.local_engine:
   false`), so each statement is a Spark job: the baseline, measured in the same run;
4. `beside heavy`: `distinct`, while the first tenant runs a self-join of all its records on
   Spark (with a 10 s statement timeout); the small queries' p50 and p95, and how the heavy
   one ended;
5. `while writing`: `distinct`, while the stream runs in this process (a batch every 2 s) on
   records produced at `--write-rate` a second: every statement after a commit reads the
   tables' new versions, and the stream takes CPU from the same 2 cores.

Before `distinct spark`, each tenant's Spark views are opened once (untimed), as a warm
Spark-only server would have them.

Every loop is bounded by `--seconds` and by a request count.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import requests
import uvicorn
from pyspark.sql import SparkSession

from infra.dev.benchmarks.sample_lake import PROJECT_CONF, event_times, stream_sample_lake
from infra.dev.load_generator import LoadSpec, generate, send
from infra.dev.local_stack import LocalKafka
from infra.service.query_api import create_app
from infra.service.query_metrics import QueryMetrics
from infra.service.tenant_access import KeyCheck, TenantLimits
from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import WINDOWS
from storage.query.local_sql import LocalSql
from storage.query.query_service import QueryService, fair_scheduler_conf
from streaming.app import StreamApp
from streaming.observe.stream_status import tenant_key_status
from streaming.pipeline.spark_session import build_spark
from tenants.api_keys import issue_key
from tenants.conf_reader import ConfReader
from tenants.models import EventTimeSpec, QueryLimits
from tenants.settings import AppSettings

SMALL = "SELECT count(*) AS final_windows FROM windows WHERE is_final"
# Every pair of the tenant's records, hashed: seconds of CPU, in tasks that see a cancel.
HEAVY = (
    "SELECT count(DISTINCT sha2(concat(a.event_id, b.event_id), 512)) AS n "
    "FROM events a JOIN events b ON a.tenant = b.tenant"
)
HEAVY_TIMEOUT = "10s"
MAX_REQUESTS_PER_CLIENT = 2_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--write-rate", type=float, default=400.0)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tw-query-latency-"))
    try:
        with LocalKafka(workdir / "kafka") as kafka:
            spark = build_spark(
                "tenant-windows-query-latency",
                shuffle_partitions=4,
                extra_conf=fair_scheduler_conf(workdir),
            )
            try:
                _run(spark, kafka, workdir, args)
            finally:
                spark.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _run(spark: SparkSession, kafka: LocalKafka, workdir: Path, args: argparse.Namespace) -> None:
    tenants = tuple(f"q{n:02d}" for n in range(args.tenants))
    conf = workdir / "conf"
    (conf / "tenants").mkdir(parents=True)
    shutil.copy(PROJECT_CONF / "sources.yaml", conf / "sources.yaml")
    for tenant in tenants:
        # Clients that ask as fast as they are answered, past the default rate limit; only the
        # first tenant's statements may run long enough to be heavy.
        query_limits = "max_queries_per_minute: 1000000"
        if tenant == tenants[0]:
            query_limits += f", statement_timeout: {HEAVY_TIMEOUT}"
        (conf / "tenants" / f"{tenant}.yaml").write_text(
            f"id: {tenant}\nsources: [web, billing]\nquery: {{{query_limits}}}\n"
        )
    spec = LoadSpec(tenants=tenants, sources=("web", "billing"), count=args.records, seed=7)
    settings, lake = stream_sample_lake(spark, kafka, conf, workdir, "latency", spec)
    times = event_times(conf)

    limits = TenantLimits(QueryLimits(), ConfReader(conf), 60.0)
    local = LocalSql.of_settings(lake, settings.query)
    service = QueryService(spark, lake, limits, local)
    app = create_app(
        service,
        KeyCheck(conf, None, 60.0),
        lambda tenant: tenant_key_status(lake, tenant),
        QueryMetrics(),
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}/v1/query"
    keys = {tenant: issue_key(conf, tenant) for tenant in tenants}
    try:
        for tenant in tenants:  # each tenant's views opened once, as on a warm server
            _query(url, keys[tenant], SMALL)
        print(f"{'phase':<15} {'clients':>7} {'requests':>8} {'p50 s':>7} {'p95 s':>7}  note")
        for number, (phase, distinct, engine) in enumerate(
            (("same", False, local), ("distinct", True, local), ("distinct spark", True, None))
        ):
            service.local = engine
            if engine is None:
                for tenant in tenants:  # each tenant's Spark views opened, untimed
                    _query(url, keys[tenant], SMALL)
            latencies, statuses = _clients(
                url,
                list(keys.values()),
                args.seconds,
                distinct,
                first_number=number * MAX_REQUESTS_PER_CLIENT,  # no phase repeats another's
            )
            print(_row(phase, len(tenants), latencies, f"statuses {dict(statuses)}"))
        service.local = local
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            heavy = pool.submit(_query, url, keys[tenants[0]], HEAVY)
            others = [keys[tenant] for tenant in tenants[1:]]
            latencies, statuses = _clients(
                url, others, args.seconds, True, first_number=3 * MAX_REQUESTS_PER_CLIENT
            )
            status, heavy_s = heavy.result(timeout=600)
        note = f"statuses {dict(statuses)}; heavy: {status} after {heavy_s:.1f} s"
        print(_row("beside heavy", len(others), latencies, note))
        print(_while_writing(spark, settings, lake, kafka, url, keys, spec, times, args))
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _while_writing(
    spark: SparkSession,
    settings: AppSettings,
    lake: DeltaLake,
    kafka: LocalKafka,
    url: str,
    keys: dict[str, str],
    spec: LoadSpec,
    event_times: dict[str, EventTimeSpec],
    args: argparse.Namespace,
) -> str:
    """The `while writing` phase's row: small distinct statements while the stream commits."""
    newer = spec.model_copy(
        update={
            "count": int(args.write_rate * args.seconds),
            "seed": 8,
            "start_ms": spec.start_ms + spec.count * spec.step_ms // len(spec.tenants),
        }
    )
    versions_before = lake.open(WINDOWS).version()
    stream = StreamApp(settings, lake).start(spark, False)
    producer = threading.Thread(
        target=send,
        args=(generate(newer, event_times), kafka.bootstrap_servers, "latency"),
        kwargs={"rate_per_s": args.write_rate, "timeout_s": args.seconds + 60},
        daemon=True,
    )
    try:
        producer.start()
        latencies, statuses = _clients(
            url, list(keys.values()), args.seconds, True, first_number=4 * MAX_REQUESTS_PER_CLIENT
        )
        producer.join(timeout=args.seconds + 60)
    finally:
        stream.stop()
    versions = lake.open(WINDOWS).version() - versions_before
    note = f"statuses {dict(statuses)}; {versions} new versions of each table"
    return _row("while writing", len(keys), latencies, note)


def _query(url: str, key: str, sql: str) -> tuple[int, float]:
    started = time.monotonic()
    answer = requests.post(
        url, json={"sql": sql}, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )
    return answer.status_code, time.monotonic() - started


def _clients(
    url: str, keys: list[str], seconds: float, distinct: bool, first_number: int = 0
) -> tuple[list[float], Counter[int]]:
    """Each key's client queries in a loop for `seconds`: the latencies of the 200s, and how
    many answers had each status. `distinct`: every statement differs (numbered from
    `first_number`), so none is answered from the service's remembered results."""
    deadline = time.monotonic() + seconds

    def client(key: str) -> tuple[list[float], Counter[int]]:
        latencies, statuses = [], Counter[int]()
        for number in range(MAX_REQUESTS_PER_CLIENT):
            if time.monotonic() >= deadline:
                break
            statement = f"{SMALL} AND count > -{first_number + number}" if distinct else SMALL
            status, elapsed = _query(url, key, statement)
            statuses[status] += 1
            if status == 200:
                latencies.append(elapsed)
        return latencies, statuses

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(keys)) as pool:
        parts = list(pool.map(client, keys))
    return [latency for part, _ in parts for latency in part], sum(
        (statuses for _, statuses in parts), Counter()
    )


def _row(phase: str, clients: int, latencies: list[float], note: str) -> str:
    ordered = sorted(latencies)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else float("nan")
    p50 = statistics.median(ordered) if ordered else float("nan")
    return f"{phase:<15} {clients:>7} {len(ordered):>8} {p50:>7.3f} {p95:>7.3f}  {note}"


if __name__ == "__main__":
    raise SystemExit(main())
