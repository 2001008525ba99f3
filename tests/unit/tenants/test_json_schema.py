"""The JSON Schemas under conf/schema/: current with the models, named by every example file, and
agreeing with the models on what a file may say."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel, ValidationError

from infra.cli.main import main
from tenants.json_schema import (
    APP_SCHEMA,
    RULE_SETS_SCHEMA,
    SCHEMA_DIR,
    SOURCES_SCHEMA,
    TENANT_SCHEMA,
    config_schemas,
    stale_schemas,
)
from tenants.models import RuleSet, SourceConfig, TenantConfig
from tenants.settings import AppSettings
from tests.support.paths import ROOT

CONF_SCHEMAS = ROOT / "conf" / SCHEMA_DIR
EXAMPLE_FILES = sorted(
    [
        *(ROOT / "conf").glob("*.yaml"),
        *(ROOT / "conf" / "tenants").glob("*.yaml"),
        *(ROOT / "docs" / "examples").rglob("*.yaml"),
    ]
)
SCHEMA_LINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)\n")


class _Yaml12Loader(yaml.SafeLoader):
    """YAML as an editor's language server reads it (1.2: only true/false are booleans), so
    `on:` is a key, not True as PyYAML's YAML 1.1 has it."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _schema_for(path: Path) -> str:
    if path.name == "app.yaml":
        return APP_SCHEMA
    if path.name == "rule_sets.yaml":
        return RULE_SETS_SCHEMA
    return SOURCES_SCHEMA if path.name == "sources.yaml" else TENANT_SCHEMA


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = config_schemas()[name]
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_committed_schemas_are_the_models_own() -> None:
    stale = stale_schemas(CONF_SCHEMAS)
    assert not stale, f"stale: {stale}; run `tenant-windows config schema` and commit the result"


def test_the_command_writes_and_checks_the_schemas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "schema", "--conf", str(tmp_path), "--check"]) == 1
    assert "is stale" in capsys.readouterr().out
    assert main(["config", "schema", "--conf", str(tmp_path)]) == 0
    written = sorted(path.name for path in (tmp_path / SCHEMA_DIR).iterdir())
    assert written == sorted([APP_SCHEMA, SOURCES_SCHEMA, TENANT_SCHEMA, RULE_SETS_SCHEMA])
    assert main(["config", "schema", "--conf", str(tmp_path), "--check"]) == 0


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_example_file_names_its_schema_and_is_valid_under_it(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    named = SCHEMA_LINE.match(text)
    assert named, f"{path} does not start with its `# yaml-language-server: $schema=` line"
    schema_file = (path.parent / named.group(1)).resolve()
    assert schema_file == CONF_SCHEMAS / _schema_for(path)
    document = yaml.load(text, Loader=_Yaml12Loader)
    errors = [error.message for error in _validator(_schema_for(path)).iter_errors(document)]
    assert not errors, f"{path}: {errors}"


_SOURCE = {
    "event_time": {"field": "ts", "format": "iso8601"},
    "window": {"kind": "tumbling", "size": "1m"},
    "out_of_orderness": "5s",
}

# (model, schema, document): the schema and the model must agree on each.
_CASES: list[tuple[type[BaseModel], str, dict[str, Any]]] = [
    (TenantConfig, TENANT_SCHEMA, {"id": "acme", "sources": ["web", "app"]}),
    (TenantConfig, TENANT_SCHEMA, {"id": "acme", "sources": {"web": {"idle_timeout": 60000}}}),
    (TenantConfig, TENANT_SCHEMA, {"id": "Acme", "sources": ["web"]}),
    (TenantConfig, TENANT_SCHEMA, {"id": "acme", "sources": []}),
    (TenantConfig, TENANT_SCHEMA, {"id": "acme", "sources": {"web": {"idle_timeout": "0s"}}}),
    (TenantConfig, TENANT_SCHEMA, {"id": "acme", "sources": {"web": {"idle_timeout": "1.5s"}}}),
    (TenantConfig, TENANT_SCHEMA, {"id": "acme", "sources": {"web": {"windw": {}}}}),
    (TenantConfig, TENANT_SCHEMA, {"id": "acme", "sources": ["web"], "quota": {"burst": 5}}),
    (SourceConfig, "SourceConfig", _SOURCE),
    (SourceConfig, "SourceConfig", {**_SOURCE, "event_time": {"field": "ts"}}),
    (SourceConfig, "SourceConfig", {**_SOURCE, "window": {"kind": "hopping", "size": "1m"}}),
    (SourceConfig, "SourceConfig", {**_SOURCE, "out_of_orderness": "-5s"}),
    (SourceConfig, "SourceConfig", {**_SOURCE, "out_of_orderness": "0s"}),
    (RuleSet, "RuleSet", {"sources": ["web", "app"]}),
    (RuleSet, "RuleSet", {"sources": {"web": {"window": {"kind": "session", "gap": "1m"}}}}),
    (RuleSet, "RuleSet", {"sources": ["web"], "quota": {"burst": 5}}),
    (RuleSet, "RuleSet", {"id": "acme", "sources": ["web"]}),
    (RuleSet, "RuleSet", {"sources": []}),
    (AppSettings, APP_SCHEMA, {"stream": {"trigger_interval": "5s"}}),
    (AppSettings, APP_SCHEMA, {"stream": {"trigger_interval": "5 seconds"}}),
    (AppSettings, APP_SCHEMA, {"kafka": {"topic": "events", "partitions": 3}}),
]


@pytest.mark.parametrize(("model", "schema", "document"), _CASES)
def test_the_schema_accepts_and_refuses_what_the_model_does(
    model: type[BaseModel], schema: str, document: dict[str, Any]
) -> None:
    try:
        model.model_validate(document)
        model_accepts = True
    except ValidationError:
        model_accepts = False
    if schema == "SourceConfig":  # a source's schema is a definition inside sources.yaml's
        document = {"sources": {"web": document}}
        schema = SOURCES_SCHEMA
    if schema == "RuleSet":  # a rule set's schema is a definition inside rule_sets.yaml's
        document = {"rule_sets": {"standard": document}}
        schema = RULE_SETS_SCHEMA
    schema_accepts = _validator(schema).is_valid(document)
    assert schema_accepts == model_accepts, json.dumps(document)
