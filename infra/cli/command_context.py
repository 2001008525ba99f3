"""What every command group shares: the settings flags, and what a cluster or a dev-only
command needs before it starts."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

from tenants.settings import AppSettings, load_settings

DEFAULT_APP_CONFIG = Path("conf/app.yaml")
# `produce` and `demo` run development-only parts: `infra.dev`, which the wheel does not ship, and
# for the demo's local broker the noida-db binary from the dev extras.
DEV_PACKAGE = "infra.dev"


class DevToolsMissingError(Exception):
    """A command needs a development-only part that this installation does not have."""


def require_dev_tools(command: str, *modules: str) -> None:
    """Stop `command` before it starts when `infra.dev` or another module it needs is missing."""
    missing = [name for name in (DEV_PACKAGE, *modules) if importlib.util.find_spec(name) is None]
    if missing:
        raise DevToolsMissingError(
            f"`tenant-windows {command}` needs the development tools, which are not in the wheel "
            f"(missing here: {', '.join(missing)}); from a source checkout, run "
            "`pip install -e '.[dev]'`"
        )


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--app-config", type=Path, default=DEFAULT_APP_CONFIG)
    parser.add_argument("--conf", dest="conf_dir", type=Path, help="tenant config directory")
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--topic")
    parser.add_argument("--lake-root")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--trigger-interval", help="e.g. 5s")
    parser.add_argument("--max-offsets-per-trigger", type=int)
    parser.add_argument("--starting-offsets", help="earliest, latest or Spark's JSON form")
    parser.add_argument("--stream-name")


def settings_from(args: argparse.Namespace) -> AppSettings:
    overrides: dict[str, Any] = {
        "conf_dir": args.conf_dir,
        "kafka.bootstrap_servers": args.bootstrap_servers,
        "kafka.topic": args.topic,
        "kafka.max_offsets_per_trigger": args.max_offsets_per_trigger,
        "kafka.starting_offsets": args.starting_offsets,
        "lake.root": args.lake_root,
        "stream.checkpoint_dir": args.checkpoint_dir,
        "stream.trigger_interval": args.trigger_interval,
        "stream.name": args.stream_name,
        "stream.metrics_port": getattr(args, "metrics_port", None),
        # `serve --metrics-port`: the query service's endpoint, not the stream's.
        "query.metrics_port": getattr(args, "query_metrics_port", None),
    }
    app_file = args.app_config if args.app_config.exists() else None
    return load_settings(app_file, overrides=overrides)


def cluster_conf(master: str | None) -> dict[str, str]:
    """What executors on other machines need: they have neither this checkout nor its venv."""
    from streaming.pipeline.spark_session import is_local_master

    if master is None or is_local_master(master):
        return {}
    from infra.cluster.ship import build_artifacts

    return build_artifacts().spark_conf()
