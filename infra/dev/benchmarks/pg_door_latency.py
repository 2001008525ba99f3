"""The Postgres door's latency: a psql session step by step, then 20 psycopg connections of 5
tenants running the latency corpus, beside the same corpus over HTTP in the same run.

    .venv/bin/python -m infra.dev.benchmarks.pg_door_latency [--seconds 60] [--tenants 5]

It writes a lake with the real stream (a local broker, sample load, `run --available-now`),
starts the query service in this process on loopback (FAIR scheduler and the in-process engine,
as `serve` runs them) with its HTTP API and its Postgres door, issues each tenant a key and then
measures:

1. `psql`: a psql session's steps on a warm service, each timed by a client: the handshake,
   the statement psql sends for `\\dt`, a `GROUP BY` over `windows`, disconnecting; and Debian's
   psql as a whole process (`-c '\\q'`, `-c '\\dt'`), whose own start is part of its time;
2. `postgres`: `--connections` psycopg connections, spread over the tenants, each running the
   corpus in a loop for `--seconds`: p50, p99, errors, and rows naming another tenant;
3. `http`: the same clients and corpus over `POST /v1/query`: the baseline.

The corpus is `query_latency`'s small statement, the same made distinct per request (so the
service remembers no result for it), and a grouping that returns the tenant column, whose every
row must be the connection's own tenant. Tenants are allowed 8 statements at once (the default
is 2), so 4 connections of one tenant measure the door, not the concurrency limit.
Every loop is bounded by `--seconds` and by a request count.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import requests
import uvicorn
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from infra.dev.benchmarks.query_latency import SMALL
from infra.dev.benchmarks.sample_lake import PROJECT_CONF, stream_sample_lake
from infra.dev.load_generator import LoadSpec
from infra.dev.local_stack import LocalKafka
from infra.service.pg_door import PgDoor, PgDoorConfig
from infra.service.query_api import create_app
from infra.service.query_metrics import QueryMetrics
from infra.service.tenant_access import KeyCheck, TenantLimits
from storage.lake.delta_lake import DeltaLake
from storage.query.local_sql import LocalSql
from storage.query.query_service import QueryService, fair_scheduler_conf
from streaming.observe.stream_status import tenant_key_status
from streaming.pipeline.spark_session import build_spark
from tenants.api_keys import issue_key
from tenants.conf_reader import ConfReader
from tenants.models import QueryLimits
from tenants.settings import AppSettings, LakeSettings, QuerySettings

GROUPED = "SELECT tenant, source, count(*) AS n FROM windows GROUP BY tenant, source"
# What psql 15 sends for `\\dt`, the listing of the tables.
PSQL_DT = """SELECT n.nspname as "Schema", c.relname as "Name",
  CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
  WHEN 'i' THEN 'index' WHEN 'S' THEN 'sequence' WHEN 't' THEN 'TOAST table'
  WHEN 'f' THEN 'foreign table' WHEN 'p' THEN 'partitioned table'
  WHEN 'I' THEN 'partitioned index' END as "Type",
  pg_catalog.pg_get_userbyid(c.relowner) as "Owner"
FROM pg_catalog.pg_class c
     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r','p','')
      AND n.nspname <> 'pg_catalog'
      AND n.nspname !~ '^pg_toast'
      AND n.nspname <> 'information_schema'
  AND pg_catalog.pg_table_is_visible(c.oid)
ORDER BY 1,2;"""
MAX_REQUESTS_PER_CLIENT = 50_000
PSQL_RUNS = 5
LAKE_ATTEMPTS = 3
TENANT_QUERY_LIMITS = "query: {max_queries_per_minute: 1000000, max_concurrent_queries: 8}\n"


def corpus(number: int) -> str:
    """The `number`th statement of a client's loop."""
    kind = number % 3
    if kind == 0:
        return SMALL
    if kind == 1:
        return f"{SMALL} AND count > -{number}"
    return GROUPED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=5)
    parser.add_argument("--connections", type=int, default=20)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--lake",
        type=Path,
        help="a folder with a lake/ and its conf/ written before (copied, then read; its first "
        "--tenants tenants query): no stream runs here, for a machine too busy to start one",
    )
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tw-pg-door-latency-"))
    if args.lake is not None:
        try:
            spark = build_spark(
                "tenant-windows-pg-door-latency",
                shuffle_partitions=4,
                extra_conf=fair_scheduler_conf(workdir),
            )
            try:
                _measure(spark, *_copied_lake(args.lake, workdir, args.tenants), args)
            finally:
                spark.stop()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return 0
    try:
        with LocalKafka(workdir / "kafka") as kafka:
            spark = build_spark(
                "tenant-windows-pg-door-latency",
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
        (conf / "tenants" / f"{tenant}.yaml").write_text(
            f"id: {tenant}\nsources: [web, billing]\n{TENANT_QUERY_LIMITS}"
        )
    spec = LoadSpec(tenants=tenants, sources=("web", "billing"), count=args.records, seed=7)
    _, lake = _sample_lake(spark, kafka, conf, workdir, spec)
    _measure(spark, conf, lake, tenants, args)


def _copied_lake(
    source: Path, workdir: Path, count: int
) -> tuple[Path, DeltaLake, tuple[str, ...]]:
    """A copy of `source`'s lake and conf, its first `count` tenants allowed the load."""
    shutil.copytree(source / "lake", workdir / "lake")
    shutil.copytree(source / "conf", workdir / "conf")
    tenant_files = sorted((workdir / "conf" / "tenants").glob("*.yaml"))[:count]
    for path in tenant_files:
        path.write_text(path.read_text().rstrip("\n") + "\n" + TENANT_QUERY_LIMITS)
    lake = DeltaLake.from_settings(LakeSettings(root=str(workdir / "lake")))
    return workdir / "conf", lake, tuple(path.stem for path in tenant_files)


def _measure(
    spark: SparkSession,
    conf: Path,
    lake: DeltaLake,
    tenants: tuple[str, ...],
    args: argparse.Namespace,
) -> None:
    limits = TenantLimits(QueryLimits(), ConfReader(conf), 60.0)
    service = QueryService(spark, lake, limits, LocalSql.of_settings(lake, QuerySettings()))
    keys_check = KeyCheck(conf, None, 60.0)
    metrics = QueryMetrics()
    app = create_app(service, keys_check, lambda tenant: tenant_key_status(lake, tenant), metrics)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/v1/query"
    keys = {tenant: issue_key(conf, tenant) for tenant in tenants}
    try:
        with PgDoor(service, keys_check, metrics, limits, PgDoorConfig(port=0)) as door:
            for tenant in tenants:  # warm: each tenant's key verified, rows read once
                with _connect(door, tenant, keys[tenant]) as connection:
                    for number in range(3):
                        connection.execute(corpus(number)).fetchall()
            print(_psql_steps(door, tenants[0], keys[tenants[0]]))
            print(f"{'door':<9} {'conns':>5} {'requests':>8} {'p50 ms':>7} {'p99 ms':>7}  note")
            clients = [tenants[n % len(tenants)] for n in range(args.connections)]
            for name, client in (
                ("postgres", _pg_client(door, keys)),
                ("http", _http_client(url, keys)),
            ):
                print(_phase(name, clients, client, args.seconds))
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        service.close()


def _sample_lake(
    spark: SparkSession, kafka: LocalKafka, conf: Path, workdir: Path, spec: LoadSpec
) -> tuple[AppSettings, DeltaLake]:
    """The sample lake; written again (a topic and folder of its own) when Spark gave up on a
    Python worker that a busy machine started too slowly (Spark waits 10 s for it)."""
    for attempt in range(LAKE_ATTEMPTS):
        folder = workdir / f"attempt-{attempt}"
        folder.mkdir()
        try:
            return stream_sample_lake(spark, kafka, conf, folder, f"pg-latency-{attempt}", spec)
        except StreamingQueryException as error:
            if "failed to connect back" not in str(error) or attempt == LAKE_ATTEMPTS - 1:
                raise
            print(f"writing the sample lake: {str(error).splitlines()[0][:120]}; again")
    raise AssertionError("unreachable")


def _connect(door: PgDoor, tenant: str, key: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(
        host="127.0.0.1",
        port=door.port,
        user=tenant,
        password=key,
        dbname="lake",
        autocommit=True,
        connect_timeout=30,
    )


def _psql_steps(door: PgDoor, tenant: str, key: str) -> str:
    """Each step of a psql session: the handshake, `\\dt`, a `GROUP BY`, disconnecting."""
    psql = shutil.which("psql")
    if psql is None:
        return "psql: not installed (apt-get install -y postgresql-client)"
    base = [psql, "-X", "-h", "127.0.0.1", "-p", str(door.port), "-U", tenant, "-d", "lake"]
    env = {**os.environ, "PGPASSWORD": key}
    steps: dict[str, list[float]] = {
        name: []
        for name in ("connect", "\\dt", "GROUP BY", "disconnect", "psql -c \\q", "psql -c \\dt")
    }
    for _ in range(PSQL_RUNS):
        # The door's own time for each step, timed by a client (psql's \timing leaves out \dt).
        started = time.monotonic()
        connection = _connect(door, tenant, key)
        steps["connect"].append(time.monotonic() - started)
        started = time.monotonic()
        connection.execute(PSQL_DT).fetchall()
        steps["\\dt"].append(time.monotonic() - started)
        started = time.monotonic()
        connection.execute(f"{GROUPED} ORDER BY source").fetchall()
        steps["GROUP BY"].append(time.monotonic() - started)
        started = time.monotonic()
        connection.close()
        steps["disconnect"].append(time.monotonic() - started)
        # psql itself, as a whole process: starting it costs as much as the door's answer.
        for name, command in (("psql -c \\q", "\\q"), ("psql -c \\dt", "\\dt")):
            started = time.monotonic()
            subprocess.run(
                [*base, "-c", command], env=env, check=True, capture_output=True, timeout=60
            )
            steps[name].append(time.monotonic() - started)
    return f"psql session steps, ms (median of {PSQL_RUNS} [max]): " + ", ".join(
        f"{name} {_ms(values, 1000)}" for name, values in steps.items()
    )


def _ms(values: list[float], scale: float = 1.0) -> str:
    return f"{statistics.median(values) * scale:.1f} [{max(values) * scale:.1f}]"


def _pg_client(door: PgDoor, keys: dict[str, str]):  # type: ignore[no-untyped-def]
    def run(tenant: str, deadline: float) -> tuple[list[float], Counter[str], int]:
        latencies, outcomes, foreign = [], Counter[str](), 0
        with _connect(door, tenant, keys[tenant]) as connection:
            for number in range(MAX_REQUESTS_PER_CLIENT):
                if time.monotonic() >= deadline:
                    break
                statement = corpus(number)
                started = time.monotonic()
                try:
                    cursor = connection.execute(statement)
                    rows = cursor.fetchall()
                    names = [column.name for column in cursor.description or ()]
                except psycopg.Error as error:
                    outcomes[f"error {error.sqlstate}"] += 1
                    continue
                latencies.append(time.monotonic() - started)
                outcomes["ok"] += 1
                if "tenant" in names:
                    at = names.index("tenant")
                    foreign += sum(row[at] != tenant for row in rows)
        return latencies, outcomes, foreign

    return run


def _http_client(url: str, keys: dict[str, str]):  # type: ignore[no-untyped-def]
    def run(tenant: str, deadline: float) -> tuple[list[float], Counter[str], int]:
        latencies, outcomes, foreign = [], Counter[str](), 0
        with requests.Session() as session:
            for number in range(MAX_REQUESTS_PER_CLIENT):
                if time.monotonic() >= deadline:
                    break
                started = time.monotonic()
                answer = session.post(
                    url,
                    json={"sql": corpus(number)},
                    headers={"Authorization": f"Bearer {keys[tenant]}"},
                    timeout=120,
                )
                if answer.status_code != 200:
                    outcomes[f"error {answer.status_code}"] += 1
                    continue
                latencies.append(time.monotonic() - started)
                outcomes["ok"] += 1
                body = answer.json()
                names = [column["name"] for column in body["columns"]]
                if "tenant" in names:
                    at = names.index("tenant")
                    foreign += sum(row[at] != tenant for row in body["rows"])
        return latencies, outcomes, foreign

    return run


def _phase(name: str, clients: list[str], client, seconds: float) -> str:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(clients)) as pool:
        parts = list(pool.map(lambda tenant: client(tenant, deadline), clients))
    latencies = sorted(latency for part in parts for latency in part[0])
    outcomes = sum((part[1] for part in parts), Counter[str]())
    foreign = sum(part[2] for part in parts)
    p50 = statistics.median(latencies) * 1000 if latencies else float("nan")
    p99 = (
        latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000
        if latencies
        else float("nan")
    )
    return (
        f"{name:<9} {len(clients):>5} {len(latencies):>8} {p50:>7.1f} {p99:>7.1f}  "
        f"outcomes {dict(outcomes)}; rows of another tenant: {foreign}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
