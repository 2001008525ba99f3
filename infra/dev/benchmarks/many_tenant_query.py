"""One tenant's statement over a lake of many tenants: `sql --tenant` as a whole process, and the
query service just after a settle.

    .venv/bin/python -m infra.dev.benchmarks.many_tenant_query --lake DIR --tenants 1000000

`DIR` holds a lake written by the real stream (`sql_cli --lake DIR` writes one: three tenants,
`acme`, `globex`, `initech`). A copy of it gets `--tenants` more tenants, settled: one commit per
table partitioned by tenant (`events`, `windows`, `late_events`) that adds a settled file per
tenant, with the statistics a real settled file has, then a log checkpoint, as a settle of that
many tenants leaves the log. Only the log holds those tenants: their files are not written (a
million Parquet files would take hours to write here), so a reader that opened any file but
its own tenant's would fail, which is what this shows it does not do.

It prints, for `acme`'s statement:
- `sql --tenant` as a whole process, min / median / max over `--runs`, and the CPU seconds;
- the query service (`QueryService.run`, the in-process engine) over the lake before the many
  tenants' commit, then the first statements just after it lands (the service follows new
  commits in a thread, as `serve` does), then once the commit has been read.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from storage.lake.delta_log import DeltaLog
from storage.lake.log_checkpoint import write_checkpoint
from storage.lake.tables import EVENTS, LATE_EVENTS, WINDOWS, TableSpec

ROOT = Path(__file__).resolve().parents[3]
TENANT = "acme"
STATEMENT = "SELECT source, count(*) AS n FROM events GROUP BY source ORDER BY source"
"""Answered in-process before this release too (its ORDER BY), so both time the reading."""
PHANTOM_TABLES = (EVENTS, WINDOWS, LATE_EVENTS)
CLI = (sys.executable, "-m", "infra.cli", "sql")


def add_settled_tenants(table_path: Path, spec: TableSpec, tenants: int) -> int:
    """Commit a settled file for each of `tenants` new tenants to the table at `table_path`
    (statistics copied from one of its own settled files), then checkpoint the log; returns the
    new version. The files themselves are not written."""
    from deltalake import DeltaTable

    log_dir = table_path / "_delta_log"
    version = max(int(p.stem) for p in log_dir.glob("*.json"))
    template = _settled_add(log_dir)
    template_values: dict[str, str | None] = template["partitionValues"]
    partition = spec.partition_by
    stats = orjson.loads(template["stats"])
    with (log_dir / f"{version + 1:020d}.json").open("wb") as commit:
        commit.write(
            orjson.dumps(
                {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "WRITE"}}
            )
            + b"\n"
        )
        for number in range(tenants):
            tenant = f"p{number:07d}"
            values = dict(template_values)
            values[partition[0]] = tenant
            path = "/".join(f"{name}={values[name]}" for name in partition)
            stats["minValues"]["tenant"] = stats["maxValues"]["tenant"] = tenant
            add = {
                **template,
                "path": f"{path}/settled-phantom-{number:07d}.parquet",
                "partitionValues": values,
                "stats": orjson.dumps(stats).decode(),
            }
            commit.write(orjson.dumps({"add": add}) + b"\n")
    # As the stream checkpoints its log: from the previous checkpoint (delta-rs writes the
    # first, of the few versions before), sorted by tenant with each row group's tenant range
    # (`log_checkpoint`), which a one-tenant reader skips by.
    DeltaTable(str(table_path), version=version).create_checkpoint()
    if not write_checkpoint(DeltaLog(str(table_path), None), version + 1):
        raise RuntimeError(f"the stream's checkpoint writer declined {table_path}")
    return version + 1


def _settled_add(log_dir: Path) -> dict[str, Any]:
    for path in sorted(log_dir.glob("*.json"), reverse=True):
        for line in path.read_bytes().splitlines():
            action = orjson.loads(line)
            add = action.get("add")
            if add and not str(add["path"]).startswith("layout_tenant=_staged"):
                return dict(add)
    raise RuntimeError(f"no settled file in {log_dir}")


def time_cli(lake: Path, conf: Path, runs: int, checkout: Path = ROOT) -> list[tuple[float, float]]:
    """Wall and CPU seconds of `sql --tenant` over `lake`, each run a new process started in
    `checkout` (another checkout: the figures before a change)."""
    timings = []
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TW_")}
    environ["PYTHONPATH"] = str(checkout)
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        done = subprocess.run(
            [*CLI, "--tenant", TENANT, STATEMENT, "--lake-root", str(lake), "--conf", str(conf)],
            cwd=checkout,
            env=environ,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise RuntimeError(f"sql exited {done.returncode}: {done.stderr[-800:]}")
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        timings.append((wall, cpu))
    return timings


def time_service(source: Path, lake: Path, tenants: int, statements: int) -> None:
    """The query service over `lake` (a copy of `source`), before and just after the many
    tenants' commits land."""
    from storage.lake.delta_lake import DeltaLake
    from storage.query.local_sql import LocalSql
    from storage.query.query_service import QueryService
    from streaming.pipeline.spark_session import build_spark
    from tenants.models import QueryLimits

    limits = QueryLimits(max_queries_per_minute=1_000_000)
    spark = build_spark("tenant-windows-many-tenant-query", shuffle_partitions=2)
    try:
        delta = DeltaLake(str(lake))
        local = LocalSql(delta, 256 << 20, 1 << 30)
        service = QueryService(spark, delta, lambda _: limits, local=local)
        service.follow_tables(0.5)
        try:
            first = service.run(TENANT, STATEMENT)
            print(f"service, before the commit: first {first.elapsed_ms} ms", flush=True)
            print(f"service, before: {_runs(service, statements)}", flush=True)
            landed = time.monotonic()
            for spec in PHANTOM_TABLES:
                add_settled_tenants(lake / spec.name, spec, tenants)
            print(f"  ({tenants:,} tenants' commits written in {time.monotonic() - landed:.1f} s)")
            print(f"service, just after: {_runs(service, statements)}", flush=True)
            caught_up = _wait_for_version(service, lake, timeout_s=900)
            print(f"  (the service read the commits after {caught_up:.1f} s)", flush=True)
            print(f"service, once read: {_runs(service, statements)}", flush=True)
        finally:
            service.close()
    finally:
        spark.stop()
    del source


def _runs(service: object, statements: int) -> str:
    from storage.query.query_service import QueryService

    assert isinstance(service, QueryService)
    elapsed = []
    for number in range(statements):
        # A statement of its own each time: no remembered result.
        started = time.monotonic()
        service.run(
            TENANT, STATEMENT.replace(" ORDER BY", f" HAVING count(*) > -{number} ORDER BY")
        )
        elapsed.append((time.monotonic() - started) * 1000)
    return (
        f"{statements} statements, ms min {min(elapsed):.1f} / median "
        f"{statistics.median(elapsed):.1f} / max {max(elapsed):.1f}"
    )


def _wait_for_version(service: object, lake: Path, timeout_s: float) -> float:
    from storage.lake.tables import EVENTS
    from storage.query.query_service import QueryService

    assert isinstance(service, QueryService)
    started = time.monotonic()
    log_dir = lake / EVENTS.name / "_delta_log"
    newest = max(int(p.stem) for p in log_dir.glob("*.json"))
    while time.monotonic() - started < timeout_s:
        if service._newest.version(EVENTS) >= newest:
            return time.monotonic() - started
        time.sleep(0.5)
    raise TimeoutError("the service did not read the commits")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--lake", type=Path, required=True, help="sql_cli's --lake folder")
    parser.add_argument("--tenants", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--statements", type=int, default=20)
    parser.add_argument("--work", type=Path, help="where to copy the lake (default: beside it)")
    parser.add_argument("--no-service", action="store_true")
    parser.add_argument(
        "--reuse", action="store_true", help="time the copy a previous run left (no service)"
    )
    parser.add_argument("--before", type=Path, help="another checkout to time `sql` in too")
    parser.add_argument(
        "--events-only", action="store_true", help="add the tenants to `events` only (quicker)"
    )
    args = parser.parse_args(argv)
    source = args.lake.resolve() / "lake"
    conf = args.lake.resolve() / "conf"
    work = (args.work or args.lake.resolve().parent / f"many-tenants-{args.tenants}").resolve()
    if args.reuse:
        cli_lake = work / "lake"
    elif not args.no_service:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(source, work / "service-lake")
        time_service(source, work / "service-lake", args.tenants, args.statements)
        cli_lake = work / "service-lake"
    else:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(source, work / "lake")
        cli_lake = work / "lake"
        started = time.monotonic()
        for spec in (EVENTS,) if args.events_only else PHANTOM_TABLES:
            add_settled_tenants(cli_lake / spec.name, spec, args.tenants)
        print(f"({args.tenants:,} tenants' commits written in {time.monotonic() - started:.1f} s)")
    checkouts = [("after", ROOT)]
    if args.before:
        checkouts.insert(0, ("before", args.before.resolve()))
    for _ in range(2):  # alternating, so load that comes and goes weighs on both alike
        for label, checkout in checkouts:
            timings = time_cli(cli_lake, conf, args.runs, checkout)
            walls = [wall for wall, _ in timings]
            print(
                f"sql --tenant over {args.tenants:,} more tenants, {label}: wall s min "
                f"{min(walls):.2f} / median {statistics.median(walls):.2f} / max "
                f"{max(walls):.2f}, CPU s median {statistics.median(c for _, c in timings):.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
