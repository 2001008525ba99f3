"""JSON Schemas of the config files, taken from the pydantic models that validate them.

Editors that speak the YAML language server (VS Code, JetBrains, Neovim) check and complete a
file against the schema its first line names (`# yaml-language-server: $schema=...`), so a
mistake shows while the file is typed, not when the stream refuses it. The models stay the one
truth: the committed schemas under `conf/schema/` are regenerated from them
(`tenant-windows config schema`), and a test fails when they are stale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tenants.models import ID_PATTERN, RuleSet, SourceConfig, TenantConfig
from tenants.settings import AppSettings

SCHEMA_DIR = "schema"
"""Under the conf dir."""
APP_SCHEMA = "app.schema.json"
SOURCES_SCHEMA = "sources.schema.json"
TENANT_SCHEMA = "tenant.schema.json"
RULE_SETS_SCHEMA = "rule_sets.schema.json"
_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def config_schemas() -> dict[str, dict[str, Any]]:
    """File name -> schema, for `app.yaml`, `sources.yaml`, each `tenants/*.yaml` and
    `rule_sets.yaml` (tenant lists are CSV: `tenants validate` checks them)."""
    return {
        APP_SCHEMA: _document("app.yaml: the stream's settings", AppSettings.model_json_schema()),
        SOURCES_SCHEMA: _sources_document(),
        TENANT_SCHEMA: _document("tenants/*.yaml: one tenant", TenantConfig.model_json_schema()),
        RULE_SETS_SCHEMA: _rule_sets_document(),
    }


def write_schemas(schema_dir: Path) -> list[Path]:
    """Write every schema into `schema_dir`; the paths written."""
    schema_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in config_schemas().items():
        path = schema_dir / name
        path.write_text(render(schema), encoding="utf-8")
        written.append(path)
    return written


def stale_schemas(schema_dir: Path) -> list[Path]:
    """The schema files in `schema_dir` that are missing or differ from the models'."""
    stale = []
    for name, schema in config_schemas().items():
        path = schema_dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != render(schema):
            stale.append(path)
    return stale


def render(schema: dict[str, Any]) -> str:
    # Sorted keys and a final newline: a regenerated file differs only where a model did.
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _document(title: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"$schema": _DIALECT, **schema, "title": title}


def _sources_document() -> dict[str, Any]:
    source = SourceConfig.model_json_schema()
    definitions = source.pop("$defs", {})
    definitions["SourceConfig"] = source
    return {
        "$schema": _DIALECT,
        "title": "sources.yaml: the data sources and their default window rules",
        "type": "object",
        "additionalProperties": False,
        "required": ["sources"],
        "properties": {
            "sources": {
                "type": "object",
                "propertyNames": {"pattern": ID_PATTERN},
                "additionalProperties": {"$ref": "#/$defs/SourceConfig"},
            }
        },
        "$defs": definitions,
    }


def _rule_sets_document() -> dict[str, Any]:
    rule_set = RuleSet.model_json_schema()
    definitions = rule_set.pop("$defs", {})
    definitions["RuleSet"] = rule_set
    return {
        "$schema": _DIALECT,
        "title": "rule_sets.yaml: named rule sets, each shared by the tenants a tenant list "
        "names it for",
        "type": "object",
        "additionalProperties": False,
        "required": ["rule_sets"],
        "properties": {
            "rule_sets": {
                "type": "object",
                "minProperties": 1,
                "propertyNames": {"pattern": ID_PATTERN},
                "additionalProperties": {"$ref": "#/$defs/RuleSet"},
            }
        },
        "$defs": definitions,
    }
