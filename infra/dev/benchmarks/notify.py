"""Delivery throughput and isolation of the notifier, without Spark.

    .venv/bin/python -m infra.dev.benchmarks.notify [--tenants 40] [--batches 5] [--panes 5]

Commits a backlog of `windows` batches (tenants x panes final panes per batch, with the stream's
transaction ids, as the sink would) to a local lake, publishes a config in which every tenant
has a webhook on a local HTTP server, and runs the notifier until it has drained. Two runs over
the same backlog, in one process:
- `all fast`: every endpoint answers at once;
- `one slow`: tenant 0's endpoint takes longer than its timeout, so each of its deliveries
  times out `max_attempts` times and is dead-lettered.
For each it prints the deliveries per second, when the last delivery of the *other* tenants
arrived (isolation: it should not grow with the slow endpoint), and when everything drained.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import WINDOWS, with_layout
from streaming.notify.notifier import Notifier
from tenants.conf_reader import load_registry
from tenants.config_store import ConfigSnapshots
from tenants.settings import AppSettings, load_settings

STREAM = "bench"
WINDOW_MS = 60_000
START_MS = 1_767_225_600_000


@dataclass(frozen=True)
class Figures:
    scenario: str
    deliveries: int
    others_done_s: float
    drained_s: float

    @property
    def rate(self) -> float:
        return self.deliveries / self.drained_s if self.drained_s else 0.0


class _Endpoint:
    """Records when each tenant's requests arrived; `slow` paths sleep before answering."""

    def __init__(self, slow_s: float) -> None:
        self.slow_s = slow_s
        self.slow_tenant: str | None = None
        self.lock = threading.Lock()
        self.last_ok_s: dict[str, float] = {}
        self.ok = 0

    def answer(self, tenant: str) -> int:
        if tenant == self.slow_tenant:
            time.sleep(self.slow_s)
            return 503
        with self.lock:
            self.last_ok_s[tenant] = time.monotonic()
            self.ok += 1
        return 200


def _serve(endpoint: _Endpoint) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            status = endpoint.answer(self.path.rsplit("/", 1)[-1])
            try:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
            except OSError:
                pass  # the client timed out and left

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _write_conf(conf: Path, tenants: int, port: int) -> None:
    (conf / "tenants").mkdir(parents=True)
    (conf / "sources.yaml").write_text(
        "sources:\n  web:\n    event_time: {field: ts, format: iso8601}\n"
        "    window: {kind: tumbling, size: 1m}\n    out_of_orderness: 1s\n"
    )
    for n in range(tenants):
        (conf / "tenants" / f"t{n}.yaml").write_text(
            f"id: t{n}\nsources:\n  web:\n    notify:\n"
            f"      - {{kind: webhook, url: 'http://127.0.0.1:{port}/t/t{n}', timeout: 500ms}}\n"
        )


def _commit_backlog(lake: DeltaLake, tenants: int, batches: int, panes: int) -> int:
    total = 0
    for batch in range(batches):
        rows = []
        for n in range(tenants):
            for pane in range(panes):
                start_ms = START_MS + (batch * panes + pane) * WINDOW_MS
                end_ms = start_ms + WINDOW_MS
                rows.append(
                    {
                        "tenant": f"t{n}", "source": "web", "window_id": str(start_ms),
                        "window_start": start_ms * 1000, "window_end": end_ms * 1000,
                        "window_date": start_ms // 86_400_000, "pane_index": 0, "timing": "ON_TIME",
                        "is_final": True, "count": 10 + pane, "metrics": [("errors", 1.0)],
                        "merged_window_ids": None, "watermark": start_ms * 1000, "batch_id": batch,
                    }
                )  # fmt: skip
        write_deltalake(
            lake.table_uri(WINDOWS),
            with_layout(pa.Table.from_pylist(rows, schema=WINDOWS.schema), WINDOWS, settled=True),
            mode="append",
            partition_by=list(WINDOWS.partition_by),
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id=STREAM, version=batch)]
            ),
        )
        total += len(rows)
    return total


def run_scenario(
    name: str, workdir: Path, args: argparse.Namespace, endpoint: _Endpoint, port: int
) -> Figures:
    conf = workdir / "conf"
    _write_conf(conf, args.tenants, port)
    settings: AppSettings = load_settings(
        None,
        environ={},
        overrides={
            "conf_dir": str(conf),
            "lake.root": str(workdir / "lake"),
            "stream.name": STREAM,
            "stream.checkpoint_dir": str(workdir / "checkpoint"),
            "notify.max_attempts": args.max_attempts,
            "notify.first_backoff": "100ms",
            "notify.max_backoff": "400ms",
            "notify.poll_interval": "100ms",
            "notify.endpoint_workers": args.workers,
        },
    )
    lake = DeltaLake.from_settings(settings.lake)
    lake.ensure_tables()
    deliveries = _commit_backlog(lake, args.tenants, args.batches, args.panes)
    snapshots = ConfigSnapshots(str(workdir / "checkpoint" / "tenant_config"))
    snapshots.publish(load_registry(conf), effective_from_ms=0)
    stopping, abandon = threading.Event(), threading.Event()
    notifier = Notifier(settings, lake, snapshots)
    started = time.monotonic()
    thread = notifier.start(stopping)
    timer = threading.Timer(args.timeout, abandon.set)
    timer.start()
    try:
        drained = notifier.wait_until_drained(abandon)
    finally:
        timer.cancel()
        stopping.set()
        thread.join()
    if not drained:
        raise SystemExit(f"{name}: not drained within {args.timeout}s")
    drained_s = time.monotonic() - started
    others = [at for tenant, at in endpoint.last_ok_s.items() if tenant != endpoint.slow_tenant]
    return Figures(name, deliveries, max(others) - started, drained_s)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=40)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--panes", type=int, default=5, help="final panes per tenant and batch")
    parser.add_argument("--workers", type=int, default=8, help="notify.endpoint_workers")
    parser.add_argument("--max-attempts", type=int, default=3)
    parser.add_argument("--slow", type=float, default=1.0, help="slow endpoint's delay, s")
    parser.add_argument("--timeout", type=float, default=600, help="give up after, s")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = []
    for name, slow_tenant in (("all fast", None), ("one slow", "t0")):
        endpoint = _Endpoint(args.slow)
        endpoint.slow_tenant = slow_tenant
        server = _serve(endpoint)
        try:
            with tempfile.TemporaryDirectory() as workdir:
                results.append(
                    run_scenario(name, Path(workdir), args, endpoint, server.server_address[1])
                )
        finally:
            server.shutdown()
            server.server_close()
    print(
        f"{args.tenants} tenants x {args.batches} batches x {args.panes} final panes; "
        f"{args.workers} endpoint workers; slow endpoint: {args.slow}s per request, "
        f"timeout 0.5s, {args.max_attempts} attempts"
    )
    print("| scenario | deliveries | deliveries/s | other tenants done s | drained s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for figures in results:
        print(
            f"| {figures.scenario} | {figures.deliveries:,} | {figures.rate:,.0f} | "
            f"{figures.others_done_s:.2f} | {figures.drained_s:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
