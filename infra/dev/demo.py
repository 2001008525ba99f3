"""The README's first command: a local broker, sample traffic, the stream, a summary, then stop.

One tenant (acme) runs an hour ahead in event time, to show that it does not make the other
tenants' data late.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

from infra.dev.load_generator import LoadSpec, generate, send
from infra.dev.local_stack import LocalKafka
from infra.progress_bar import ProgressBar
from storage.lake.delta_lake import DeltaLake
from storage.query.spark_views import register_views
from storage.upkeep.work_thread import WorkThread
from streaming.app import StreamApp
from streaming.observe.stream_status import backlog_records
from streaming.pipeline.stream_session import stream_session
from tenants.conf_reader import load_registry
from tenants.settings import load_settings

DEMO_TOPIC = "tenant-events"
SUMMARY_SQL = """
WITH accepted AS (
  SELECT tenant, source, count(DISTINCT partition, offset) AS records,
         count_if(timing = 'ON_TIME') AS on_time, count_if(timing = 'LATE') AS late
  FROM events GROUP BY tenant, source
), too_late AS (
  SELECT tenant, source, count(*) AS too_late FROM late_events GROUP BY tenant, source
), closed AS (
  SELECT tenant, source, count(*) AS final_windows FROM windows WHERE is_final
  GROUP BY tenant, source
), latest_status AS (
  SELECT tenant, source, max_by(watermark, batch_id) AS watermark FROM tenant_status
  GROUP BY tenant, source
)
SELECT a.tenant, a.source, a.records, a.on_time, a.late, coalesce(t.too_late, 0) AS too_late,
       coalesce(c.final_windows, 0) AS final_windows, s.watermark
FROM accepted a
LEFT JOIN too_late t USING (tenant, source)
LEFT JOIN closed c USING (tenant, source)
LEFT JOIN latest_status s USING (tenant, source)
ORDER BY tenant, source
"""
ERRORS_SQL = """
SELECT tenant, window_start, count AS lines, metrics['errors'] AS errors,
       round(metrics['avg_amount'], 1) AS avg_amount
FROM windows
WHERE source = 'web' AND is_final
ORDER BY tenant, window_start
LIMIT 6
"""
BALANCE_SQL = """
SELECT 'events' AS table_name, count(DISTINCT partition, offset) AS records FROM events
UNION ALL SELECT 'late_events', count(DISTINCT partition, offset) FROM late_events
UNION ALL SELECT 'quarantine', count(*) FROM quarantine
"""


def run_demo(workdir: Path, count: int) -> int:
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    with LocalKafka(workdir / "kafka") as kafka:
        kafka.create_topic(DEMO_TOPIC, partitions=4)
        settings = load_settings(
            Path("conf/app.yaml"),
            overrides={
                "kafka.bootstrap_servers": kafka.bootstrap_servers,
                "kafka.topic": DEMO_TOPIC,
                "kafka.max_offsets_per_trigger": max(1, count // 3),
                "lake.root": str(workdir / "lake"),
                "stream.checkpoint_dir": str(workdir / "checkpoint"),
            },
        )
        # The JVM starts while the records are produced, which needs no Spark.
        session = WorkThread(lambda: stream_session(settings), "spark-session")
        registry = load_registry(settings.conf_dir)
        spec = LoadSpec(count=count, ahead={"acme": 3_600_000})
        time_specs = {name: source.event_time for name, source in registry.sources.items()}
        sent = send(generate(spec, time_specs), kafka.bootstrap_servers, DEMO_TOPIC)
        print(f"produced {sent} records for {', '.join(spec.tenants)}; acme runs 1 h ahead")

        spark = session.result()
        try:
            lake = DeltaLake.from_settings(settings.lake)
            # On a terminal a progress bar; otherwise the progress log lines say the same.
            bar = ProgressBar(backlog_records(settings)) if sys.stderr.isatty() else None
            stream = StreamApp(settings, lake, on_batch=bar).start(spark, True)
            finished = stream.query.awaitTermination(timeout=600)
            stream.stop()
            if bar is not None:
                bar.close()
            if not finished:
                raise TimeoutError("the demo stream did not catch up within 600 s")
            if stream.query.exception() is not None:
                raise RuntimeError(f"the stream failed: {stream.query.exception()}")
            register_views(spark, lake)
            print("\nPer tenant and source (Spark SQL over the Delta tables):")
            spark.sql(SUMMARY_SQL).show(truncate=False)
            print("ERROR lines per minute (final panes of the web source):")
            spark.sql(ERRORS_SQL).show(truncate=False)
            print("Where every consumed record went:")
            spark.sql(BALANCE_SQL).show(truncate=False)
            print(try_lines(workdir / "lake", workdir / "checkpoint", tenant_windows_command()))
        finally:
            spark.stop()
    return 0


def try_lines(lake_root: Path, checkpoint: Path, tenant_windows: str) -> str:
    """The commands the demo ends with, runnable as printed from where it ran."""
    lake, checkpoint_dir = shlex.quote(str(lake_root)), shlex.quote(str(checkpoint))
    query = shlex.quote("SELECT * FROM windows LIMIT 5")
    return (
        f"Lake: {lake_root}\n"
        f"Try: {tenant_windows} sql --lake-root {lake} {query}\n"
        f"     {tenant_windows} status --lake-root {lake} --checkpoint-dir {checkpoint_dir}"
    )


def tenant_windows_command(cwd: Path | None = None) -> str:
    """How to run `tenant-windows` from `cwd` with the Python running the demo. infra/demo.sh
    does not put `.venv/bin` on the PATH, so a bare `tenant-windows` is "command not found":
    this is the console script beside the interpreter (`.venv/bin/tenant-windows` after
    infra/setup.sh), relative when it lies under `cwd`; without one, `python -m infra.cli`."""
    cwd = (Path.cwd() if cwd is None else cwd).absolute()
    # Not resolved: a venv's python is a symlink to the base interpreter, outside the venv.
    interpreter = Path(sys.executable).absolute()
    script = interpreter.parent / "tenant-windows"
    if script.is_file():
        return shlex.quote(_as_seen_from(script, cwd))
    return f"{shlex.quote(_as_seen_from(interpreter, cwd))} -m infra.cli"


def _as_seen_from(path: Path, cwd: Path) -> str:
    if not path.is_relative_to(cwd):
        return str(path)
    relative = path.relative_to(cwd)
    # A bare name would be looked up on the PATH.
    return str(relative) if len(relative.parts) > 1 else f"./{relative}"
