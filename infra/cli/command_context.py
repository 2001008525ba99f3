"""What every command group shares: the settings flags, and what a cluster or a dev-only
command needs before it starts."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class SettingsFlag:
    """A flag that overrides one setting of `conf/app.yaml` for one command."""

    flag: str
    key: str
    """The setting's dotted key in `app.yaml` (and `TW_*`), which the flag's value overrides."""
    attribute: str
    """Where the product reads it on `AppSettings` (a key's field can have another name)."""
    help: str
    type: Callable[[str], Any] = str
    dest: str = ""

    @property
    def name(self) -> str:
        return self.dest or self.flag.removeprefix("--").replace("-", "_")


CONF_DIR = SettingsFlag(
    "--conf", "conf_dir", "conf_dir", "tenant config directory (conf_dir)", Path, "conf_dir"
)
BOOTSTRAP_SERVERS = SettingsFlag(
    "--bootstrap-servers",
    "kafka.bootstrap_servers",
    "kafka.bootstrap_servers",
    "the Kafka brokers, host:port[,host:port] (kafka.bootstrap_servers)",
)
TOPIC = SettingsFlag("--topic", "kafka.topic", "kafka.topic", "the input topic (kafka.topic)")
MAX_OFFSETS_PER_TRIGGER = SettingsFlag(
    "--max-offsets-per-trigger",
    "kafka.max_offsets_per_trigger",
    "kafka.max_offsets_per_trigger",
    "records per micro-batch at most (kafka.max_offsets_per_trigger)",
    int,
)
STARTING_OFFSETS = SettingsFlag(
    "--starting-offsets",
    "kafka.starting_offsets",
    "kafka.starting_offsets",
    "where a new checkpoint starts: earliest, latest or Spark's JSON form (kafka.starting_offsets)",
)
LAKE_ROOT = SettingsFlag(
    "--lake-root",
    "lake.root",
    "lake.root",
    "the lake: a local path or s3://bucket/prefix (lake.root)",
)
CHECKPOINT_DIR = SettingsFlag(
    "--checkpoint-dir",
    "stream.checkpoint_dir",
    "stream.checkpoint_dir",
    "Spark's checkpoint of the stream (stream.checkpoint_dir)",
)
TRIGGER_INTERVAL = SettingsFlag(
    "--trigger-interval",
    "stream.trigger_interval",
    "stream.trigger_interval_ms",
    "how often a micro-batch starts, e.g. 5s (stream.trigger_interval)",
)
STREAM_NAME = SettingsFlag(
    "--stream-name", "stream.name", "stream.name", "the stream's identity (stream.name)"
)
STREAM_METRICS_PORT = SettingsFlag(
    "--metrics-port",
    "stream.metrics_port",
    "stream.metrics_port",
    "serve Prometheus metrics on this port (stream.metrics_port; 0: any free port)",
    int,
)
QUERY_METRICS_PORT = SettingsFlag(
    "--metrics-port",
    "query.metrics_port",
    "query.metrics_port",
    "serve Prometheus metrics on this port, apart from --port (query.metrics_port; "
    "0: any free port)",
    int,
    "query_metrics_port",
)
SETTINGS_FLAGS = (
    CONF_DIR,
    BOOTSTRAP_SERVERS,
    TOPIC,
    MAX_OFFSETS_PER_TRIGGER,
    STARTING_OFFSETS,
    LAKE_ROOT,
    CHECKPOINT_DIR,
    TRIGGER_INTERVAL,
    STREAM_NAME,
    STREAM_METRICS_PORT,
    QUERY_METRICS_PORT,
)
# The flags of the broker a command talks to, and of the stream it reads about.
KAFKA_ENDPOINT = (BOOTSTRAP_SERVERS, TOPIC)
STREAM_FLAGS = (
    CONF_DIR,
    *KAFKA_ENDPOINT,
    MAX_OFFSETS_PER_TRIGGER,
    STARTING_OFFSETS,
    LAKE_ROOT,
    CHECKPOINT_DIR,
    TRIGGER_INTERVAL,
    STREAM_NAME,
)


def add_settings_flags(parser: argparse.ArgumentParser, *flags: SettingsFlag) -> None:
    """`--app-config`, and the flags of the settings this command reads: a command offers only
    the flags that change what it does."""
    parser.add_argument(
        "--app-config",
        type=Path,
        default=DEFAULT_APP_CONFIG,
        help=f"the settings file (default {DEFAULT_APP_CONFIG}); TW_* variables and the "
        "flags below override its values",
    )
    for flag in flags:
        metavar = flag.flag.removeprefix("--").replace("-", "_").upper()
        parser.add_argument(
            flag.flag, dest=flag.name, type=flag.type, metavar=metavar, help=flag.help
        )


def settings_from(args: argparse.Namespace) -> AppSettings:
    """`app.yaml`, `TW_*` variables, then the settings flags this command's parser offers."""
    overrides = {flag.key: getattr(args, flag.name, None) for flag in SETTINGS_FLAGS}
    app_file = args.app_config if args.app_config.exists() else None
    return load_settings(app_file, overrides=overrides)


def cluster_conf(master: str | None) -> dict[str, str]:
    """What executors on other machines need: they have neither this checkout nor its venv."""
    from streaming.pipeline.spark_session import is_local_master

    if master is None or is_local_master(master):
        return {}
    from infra.cluster.ship import build_artifacts

    return build_artifacts().spark_conf()
