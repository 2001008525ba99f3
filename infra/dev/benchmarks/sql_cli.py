"""`tenant-windows sql` end to end: each case timed as a whole process, process start included.

    .venv/bin/python -m infra.dev.benchmarks.sql_cli [--runs 5] [--lake DIR] [--before DIR]

It writes a small lake once with the real stream (a local broker, sample load for three
tenants, `run --available-now`), in a temporary folder, or in `--lake DIR` where it is kept
for the next run to reuse, then runs each case `--runs` times as a new process and prints the
minimum, median and maximum wall time:

- `scoped`: `sql --tenant` with a small statement (answered in-process where it can be);
- `operator`: `sql` without `--tenant`, a small statement over every tenant;
- `refused`: `sql --tenant` with a statement the guard refuses (exit 2);
- `missing lake`: `sql` over a lake root that does not exist (exit 2);
- with `--corpus`, every statement a user meets first: those of docs/querying.md, of
  `sql --help`, of the demo's `Try:` line and of the query latency benchmark, the same without
  `ORDER BY`, `SELECT *` with `LIMIT`, a misspelled column and table (exit 2), and two
  statements piped into the prompt.

`--before DIR` times the same cases with another checkout of the code too (`python -m
infra.cli` run in DIR, with this virtualenv's Python): the figures before a change, beside
the ones after it.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TENANTS = ("acme", "globex", "initech")
TOPIC = "sql-cli"
RUN_TIMEOUT_S = 300


@dataclass(frozen=True)
class Case:
    name: str
    arguments: tuple[str, ...]
    exit_code: int
    stdin: str | None = None


def cases(lake: Path, conf: Path) -> list[Case]:
    common = ("--lake-root", str(lake), "--conf", str(conf))
    return [
        Case(
            "scoped",
            (
                "sql",
                "--tenant",
                "acme",
                "SELECT source, count(*) AS n FROM events GROUP BY source ORDER BY source",
                *common,
            ),
            0,
        ),
        Case(
            "operator",
            (
                "sql",
                "SELECT tenant, count(*) AS n FROM windows WHERE is_final "
                "GROUP BY tenant ORDER BY tenant",
                *common,
            ),
            0,
        ),
        Case(
            "refused",
            ("sql", "--tenant", "acme", "SELECT * FROM parquet.`/etc`", *common),
            2,
        ),
        Case(
            "missing lake",
            (
                "sql",
                "SELECT count(*) FROM events",
                "--lake-root",
                str(lake.parent / "nowhere"),
                "--conf",
                str(conf),
            ),
            2,
        ),
    ]


def corpus_cases(lake: Path, conf: Path) -> list[Case]:
    """The statements a user meets first (see the module's doc), each as `sql` runs it."""
    common = ("--lake-root", str(lake), "--conf", str(conf))
    acme = ("--tenant", "acme")
    scoped = [
        (
            "docs 1",
            "SELECT source, count(*) AS records FROM events GROUP BY source ORDER BY source",
        ),
        (
            "docs 2",
            "SELECT source, window_start, pane_index, timing, count FROM windows "
            "WHERE is_final ORDER BY source, window_start LIMIT 10",
        ),
        (
            "docs 3",
            "SELECT w.source, w.window_start, w.count, count(e.offset) AS records "
            "FROM windows w JOIN events e ON e.window_id = w.window_id AND e.source = w.source "
            "AND e.pane_index <= w.pane_index WHERE w.is_final GROUP BY w.source, w.window_start, "
            "w.count ORDER BY w.source, w.window_start LIMIT 5",
        ),
        (
            "docs 4",
            "SELECT source, batch_id, watermark, sum(on_time_records) OVER (PARTITION BY "
            "source ORDER BY batch_id) AS on_time_so_far FROM tenant_status ORDER BY source, "
            "batch_id",
        ),
        (
            "docs 5",
            "SELECT window_id, pane_index, pane_timing, pane_count, count(*) AS records "
            "FROM window_contents WHERE source = 'web' GROUP BY window_id, pane_index, "
            "pane_timing, pane_count ORDER BY window_id, pane_index LIMIT 10",
        ),
        ("no order", "SELECT source, count(*) AS n FROM events GROUP BY source"),
        ("latency small", "SELECT count(*) AS final_windows FROM windows WHERE is_final"),
        ("star limit", "SELECT * FROM events LIMIT 5"),
    ]
    operator = [
        (
            "docs 7",
            "SELECT tenant, count(*) AS records FROM events GROUP BY tenant ORDER BY tenant",
        ),
        ("help", "SELECT tenant, count(*) FROM events GROUP BY tenant"),
        ("demo try", "SELECT * FROM windows LIMIT 5"),
    ]
    return [
        *(Case(name, ("sql", *acme, statement, *common), 0) for name, statement in scoped),
        Case("docs 6", ("sql", *acme, "--as-of-version", "1",
             "SELECT count(*) AS events_at_version_1 FROM events", *common), 0),
        *(Case(name, ("sql", statement, *common), 0) for name, statement in operator),
        Case("typo column", ("sql", *acme, "SELECT sourse FROM events", *common), 2),
        Case("typo table", ("sql", "SELECT count(*) FROM event", *common), 2),
        Case("prompt", ("sql", *acme, "--format", "json", *common), 0,
             "SELECT count(*) AS n FROM events;\nSELECT DISTINCT source FROM windows;\n"),
    ]  # fmt: skip


def write_lake(workdir: Path) -> Path:
    """A lake written by the stream from sample load; returns its root (`conf/` beside it)."""
    # Imported here: timing the CLI needs none of this once the lake exists.
    from infra.dev.benchmarks.sample_lake import stream_sample_lake
    from infra.dev.load_generator import LoadSpec
    from infra.dev.local_stack import LocalKafka
    from streaming.pipeline.spark_session import build_spark

    conf = workdir / "conf"
    shutil.rmtree(workdir / "checkpoint", ignore_errors=True)
    shutil.copytree(ROOT / "conf", conf, dirs_exist_ok=True)
    spec = LoadSpec(tenants=TENANTS, sources=("web", "billing"), count=3_000, seed=7)
    with LocalKafka(workdir / "kafka") as kafka:
        spark = build_spark("tenant-windows-sql-cli-bench", shuffle_partitions=4)
        try:
            stream_sample_lake(spark, kafka, conf, workdir, TOPIC, spec, timeout_s=RUN_TIMEOUT_S)
        finally:
            spark.stop()
    return workdir / "lake"


def time_case(checkout: Path, case: Case, runs: int) -> list[tuple[float, float]]:
    """Wall seconds of each run of `case` as a new process started in `checkout`, and its CPU
    seconds (user and system): the figure a busy machine disturbs least."""
    environ = {**os.environ, "PYTHONPATH": str(checkout)}
    environ = {name: value for name, value in environ.items() if not name.startswith("TW_")}
    seconds: list[tuple[float, float]] = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_before = before.ru_utime + before.ru_stime
        started = time.monotonic()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "infra.cli", *case.arguments],
                cwd=checkout,
                env=environ,
                capture_output=True,
                text=True,
                input=case.stdin,
                timeout=RUN_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"{case.name} in {checkout}: no answer in {RUN_TIMEOUT_S} s"
            ) from None
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        seconds.append((wall, after.ru_utime + after.ru_stime - cpu_before))
        if done.returncode != case.exit_code:
            raise RuntimeError(
                f"{case.name} in {checkout}: exit {done.returncode}, expected {case.exit_code}: "
                f"{done.stderr.strip()[-500:]}"
            )
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--lake", type=Path, help="a folder to write the lake in once and keep, then reuse"
    )
    parser.add_argument("--before", type=Path, help="another checkout to time the same cases in")
    parser.add_argument(
        "--corpus", action="store_true", help="also time the statements a user meets first"
    )
    parser.add_argument("--only-corpus", action="store_true", help="time those only")
    parser.add_argument("--case", action="append", default=[], help="time only these (by name)")
    args = parser.parse_args(argv)
    workdir = args.lake.resolve() if args.lake else Path(tempfile.mkdtemp(prefix="tw-sql-cli-"))
    try:
        lake = workdir / "lake" if (workdir / "lake").exists() else write_lake(workdir)
        checkouts = [("after", ROOT)]
        if args.before:
            checkouts.insert(0, ("before", args.before.resolve()))
        print(
            f"{'case':<14} {'code':<7} {'runs':>4} {'min s':>7} {'median s':>9} {'max s':>7} "
            f"{'CPU median s':>12}"
        )
        timed = [] if args.only_corpus else cases(lake, workdir / "conf")
        if args.corpus or args.only_corpus:
            timed += corpus_cases(lake, workdir / "conf")
        for case in (c for c in timed if not args.case or c.name in args.case):
            for label, checkout in checkouts:
                try:
                    timings = time_case(checkout, case, args.runs)
                except RuntimeError as failed:  # e.g. an exit code the other checkout gives
                    print(f"{case.name:<14} {label:<7} {failed}", flush=True)
                    continue
                seconds = [wall for wall, _ in timings]
                cpu = statistics.median(cpu for _, cpu in timings)
                print(
                    f"{case.name:<14} {label:<7} {len(seconds):>4} {min(seconds):>7.2f} "
                    f"{statistics.median(seconds):>9.2f} {max(seconds):>7.2f} {cpu:>12.2f}",
                    flush=True,
                )
    finally:
        if not args.lake:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
