"""`config schema`: the JSON Schemas of the config files, for editors."""

from __future__ import annotations

import argparse
from pathlib import Path

from infra.cli.exit_codes import ExitCode


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`config schema`."""
    config = commands.add_parser("config", help="the config files themselves")
    config_commands = config.add_subparsers(required=True, metavar="ACTION")
    schema = config_commands.add_parser(
        "schema",
        help="write the JSON Schemas of app.yaml, sources.yaml and tenants/*.yaml "
        "to CONF/schema/, for editors",
    )
    schema.add_argument("--conf", type=Path, default=Path("conf"), help="config directory")
    schema.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a schema is stale"
    )
    schema.set_defaults(handler=_config_schema)


def _config_schema(args: argparse.Namespace) -> int:
    from tenants.json_schema import SCHEMA_DIR, stale_schemas, write_schemas

    schema_dir = args.conf / SCHEMA_DIR
    if args.check:
        stale = stale_schemas(schema_dir)
        for path in stale:
            print(f"{path} is stale: run `tenant-windows config schema --conf {args.conf}`")
        return ExitCode.FAILED if stale else ExitCode.OK
    for path in write_schemas(schema_dir):
        print(f"wrote {path}")
    return ExitCode.OK
