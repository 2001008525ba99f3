"""`run`, `status`, `produce` and `demo`: the stream, what it is doing, and load for it."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from infra.cli.command_context import (
    CONF_DIR,
    KAFKA_ENDPOINT,
    STREAM_FLAGS,
    STREAM_METRICS_PORT,
    add_settings_flags,
    cluster_conf,
    require_dev_tools,
    settings_from,
)
from infra.cli.exit_codes import ExitCode
from tenants.conf_reader import load_registry
from tenants.models import parse_duration_ms
from tenants.settings import AppSettings

if TYPE_CHECKING:
    from infra.progress_bar import ProgressBar

log = logging.getLogger("tenant_windows")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`run`, `status`, `produce`, `demo`."""
    run = commands.add_parser("run", help="run the stream (continuously, or --available-now)")
    add_settings_flags(run, *STREAM_FLAGS, STREAM_METRICS_PORT)
    # A standby waits to take over a continuous stream; a run to the end has nothing to take over.
    how = run.add_mutually_exclusive_group()
    how.add_argument(
        "--available-now", action="store_true", help="process what is in the topic, then exit"
    )
    how.add_argument(
        "--standby",
        action="store_true",
        help="start warm and wait: take the stream over when its running instance stops or dies "
        "(on this host within stream.standby_poll_interval, elsewhere after stream.lease_ttl)",
    )
    run.add_argument(
        "--master",
        help="Spark master; outside spark-submit, default local[N]: two task slots a core. A "
        "cluster master (spark://, yarn, k8s://) gets the code and executor dependencies shipped",
    )
    run.set_defaults(handler=_run)

    status = commands.add_parser(
        "status",
        help="per-key watermarks and counters, Kafka lag, the last batch, the writer lease "
        "(reads only: works while the stream runs)",
    )
    add_settings_flags(status, *STREAM_FLAGS)
    status.add_argument(
        "--format", choices=["table", "json"], default="table", help="output format (default table)"
    )
    status.set_defaults(handler=_status)

    produce = commands.add_parser("produce", help="produce sample multi-tenant load")
    add_settings_flags(produce, CONF_DIR, *KAFKA_ENDPOINT)
    produce.add_argument(
        "--tenants",
        default="acme,globex,initech",
        help="comma-separated tenant ids the records are for (default acme,globex,initech)",
    )
    produce.add_argument(
        "--sources",
        default="web,billing",
        help="comma-separated source names (default web,billing)",
    )
    produce.add_argument(
        "--count", type=int, default=6000, help="records to produce (default 6000)"
    )
    produce.add_argument(
        "--rate", type=float, default=None, help="records per second (default: as fast as possible)"
    )
    produce.add_argument(
        "--jitter", default="5s", help="out-of-orderness of event times (default 5s)"
    )
    produce.add_argument(
        "--late-share",
        type=float,
        default=0.02,
        help="share of records sent 3 minutes behind their key's event time, late or too late "
        "for their window (default 0.02)",
    )
    produce.add_argument(
        "--malformed-share",
        type=float,
        default=0.01,
        help="share of malformed records, which the stream quarantines (default 0.01)",
    )
    produce.add_argument(
        "--ahead",
        action="append",
        default=[],
        metavar="TENANT=DURATION",
        help="give TENANT's event times this far ahead of the others' (repeatable)",
    )
    produce.add_argument(
        "--seed", type=int, default=7, help="random seed: the same seed, the same records"
    )
    produce.set_defaults(handler=_produce)

    demo = commands.add_parser(
        "demo", help="local broker + sample load + stream + summary, then stop"
    )
    demo.add_argument(
        "--workdir",
        type=Path,
        default=Path("data/demo"),
        help="where the demo keeps its broker, lake and checkpoint (default data/demo)",
    )
    demo.add_argument(
        "--count", type=int, default=12_000, help="sample records to produce (default 12000)"
    )
    demo.set_defaults(handler=_demo)


def _run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    _require_the_broker(settings)
    # Only now: Spark's start costs seconds a broker that cannot be used would waste. The JVM
    # starts before the stream's modules are imported, which takes most of a second on one
    # core: on the clock of every restart after a crash.
    from streaming.pipeline.stream_session import start_stream_session

    session = start_stream_session(settings, args.master, cluster_conf(args.master))
    from streaming.app import run_stream

    bar = _progress_bar(settings) if args.available_now and sys.stderr.isatty() else None
    try:
        return run_stream(
            settings,
            session,
            args.available_now,
            args.fault_hook,
            on_batch=bar,
            standby=args.standby,
        )
    finally:
        if bar is not None:
            bar.close()


def _require_the_broker(settings: AppSettings) -> None:
    """Before Spark starts and before the lake or the checkpoint exists: a broker that refuses
    connections, a silent one (after `kafka.broker_timeout`), and a refused certificate or
    password are each one line and exit 2, not a query that retries for the whole timeout
    and leaves a lake and a checkpoint behind."""
    from streaming.kafka.client import KafkaSecurity, require_an_answering_broker

    kafka = settings.kafka
    require_an_answering_broker(
        kafka.bootstrap_servers, KafkaSecurity.of(kafka), kafka.broker_timeout_ms / 1000
    )


def _progress_bar(settings: AppSettings) -> ProgressBar | None:
    from infra.progress_bar import ProgressBar
    from streaming.observe.stream_status import backlog_records

    try:
        return ProgressBar(backlog_records(settings))
    except Exception as error:  # the stream reports an unreachable broker itself
        log.warning("no progress bar: the backlog could not be read (%s)", error)
        return None


def _status(args: argparse.Namespace) -> int:
    from infra.cli.status_view import render_json, render_table
    from streaming.observe.stream_status import gather_status

    # An unreachable broker is the Kafka lag section's one line, not kafka-python's retries.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    sections = gather_status(settings_from(args))
    print(render_json(sections) if args.format == "json" else render_table(sections), end="")
    if args.format == "json":
        print()
    return ExitCode.OK


def _produce(args: argparse.Namespace) -> int:
    require_dev_tools("produce")
    from infra.dev.load_generator import LoadSpec, generate, send
    from streaming.kafka.client import KafkaSecurity

    settings = settings_from(args)
    _require_the_broker(settings)
    registry = load_registry(settings.conf_dir)
    ahead = {}
    for item in args.ahead:
        tenant, _, duration = item.partition("=")
        ahead[tenant] = parse_duration_ms(duration)
    spec = LoadSpec(
        tenants=tuple(args.tenants.split(",")),
        sources=tuple(args.sources.split(",")),
        count=args.count,
        jitter=args.jitter,
        late_share=args.late_share,
        malformed_share=args.malformed_share,
        ahead=ahead,
        seed=args.seed,
    )
    time_specs = {name: source.event_time for name, source in registry.sources.items()}
    sent = send(
        generate(spec, time_specs),
        settings.kafka.bootstrap_servers,
        settings.kafka.topic,
        args.rate,
        security=KafkaSecurity.of(settings.kafka),
    )
    print(json.dumps({"produced": sent, "topic": settings.kafka.topic}))
    return ExitCode.OK


def _demo(args: argparse.Namespace) -> int:
    require_dev_tools("demo", "noida_db")
    from infra.dev.demo import run_demo

    return run_demo(args.workdir, args.count)
