"""docs/configuration.md is generated from the models; these tests keep it, and its examples, true.

Fast and Spark-free: they read the models, the generated file and `docs/examples/`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel

from infra import config_reference
from infra.config_reference import (
    DURATION_COUNTER_EXAMPLES,
    DURATION_EXAMPLES,
    EXAMPLES_DIR,
    REFERENCE_PATH,
    REGENERATE_COMMAND,
    SUPPLEMENTS,
    field_description,
    format_duration,
    render_reference,
)
from tenants.conf_reader import load_registry
from tenants.models import (
    Accumulation,
    Emit,
    EventTimeFormat,
    MetricKind,
    SessionWindow,
    SlidingWindow,
    SourceConfig,
    TenantConfig,
    TumblingWindow,
    parse_duration_ms,
)
from tenants.settings import AppSettings, load_settings
from tests.support.paths import ROOT

ROOT_MODELS: tuple[type[BaseModel], ...] = (AppSettings, SourceConfig, TenantConfig)
STALE = f"docs/configuration.md is stale: run `{REGENERATE_COMMAND}` and commit the result"


def _types_in(annotation: Any) -> Iterator[Any]:
    # Deliberately independent of the renderer's walk, so a type it skips is caught here.
    yield annotation
    for argument in get_args(annotation):
        yield from _types_in(argument)


def config_models() -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    pending = list(ROOT_MODELS)
    while pending:
        model = pending.pop(0)
        if model in found:
            continue
        found.append(model)
        for info in model.model_fields.values():
            pending += [
                nested
                for nested in _types_in(info.annotation)
                if isinstance(nested, type) and issubclass(nested, BaseModel)
            ]
    return found


def config_enums() -> list[tuple[type[BaseModel], str, type[Enum]]]:
    return [
        (model, name, enum)
        for model in config_models()
        for name, info in model.model_fields.items()
        for enum in _types_in(info.annotation)
        if isinstance(enum, type) and issubclass(enum, Enum)
    ]


def model_section(reference: str, model: type[BaseModel]) -> str:
    """The reference from the model's anchor to the next anchor."""
    start = reference.find(f'<a id="model-{model.__name__.lower()}"></a>')
    assert start >= 0, f"{model.__name__} has no section in docs/configuration.md"
    end = reference.find('<a id="', start + 1)
    return reference[start : end if end >= 0 else None]


@pytest.fixture(scope="module")
def reference() -> str:
    return render_reference()


# (a) the committed file is what the models render to


def test_committed_reference_is_up_to_date(reference: str) -> None:
    committed = REFERENCE_PATH.read_text(encoding="utf-8") if REFERENCE_PATH.exists() else ""
    if committed != reference:
        diff = difflib.unified_diff(
            committed.splitlines(), reference.splitlines(), "committed", "rendered", lineterm=""
        )
        pytest.fail(f"{STALE}\n" + "\n".join(list(diff)[:40]), pytrace=False)


def test_check_flag_reports_a_stale_file(tmp_path: Path) -> None:
    output = tmp_path / "configuration.md"
    assert config_reference.main(["--check", "--output", str(output)]) == 1
    assert config_reference.main(["--output", str(output)]) == 0
    assert config_reference.main(["--check", "--output", str(output)]) == 0
    output.write_text(output.read_text() + "hand edit\n")
    assert config_reference.main(["--check", "--output", str(output)]) == 1


# (b) the example directory is a valid config with the promised variety


def test_examples_resolve_every_tenant_and_source() -> None:
    registry = load_registry(EXAMPLES_DIR)
    kinds = {
        (tenant.id, source): type(route.rules.window)
        for tenant in registry.tenants.values()
        for source in tenant.sources
        if (route := registry.resolve(tenant.id, source)) is not None
    }
    assert kinds == {
        ("acme", "logs"): SlidingWindow,  # overridden from the source's tumbling window
        ("acme", "payments"): SlidingWindow,
        ("acme", "app"): SessionWindow,
        ("globex", "logs"): TumblingWindow,
        ("globex", "app"): SessionWindow,
    }
    assert registry.resolve("globex", "payments") is None  # not listed: unknown_source

    acme_payments = registry.resolve("acme", "payments")
    acme_app = registry.resolve("acme", "app")
    globex_app = registry.resolve("globex", "app")
    assert acme_payments is not None and acme_app is not None and globex_app is not None
    assert acme_payments.rules.allowed_lateness_ms == parse_duration_ms("15m")
    # An override's metrics replace the source's mapping rather than merging into it.
    assert set(acme_payments.rules.metrics) == {"revenue", "refunds"}
    assert acme_app.rules.window == SessionWindow.model_validate({"gap": "10m"})
    assert acme_app.rules.emit is Emit.FINAL_ONLY
    # What acme does not override keeps the source's value.
    assert acme_app.rules.idle_timeout_ms == globex_app.rules.idle_timeout_ms == 3_600_000


def test_example_sources_show_every_option() -> None:
    sources = load_registry(EXAMPLES_DIR).sources.values()
    assert {type(source.window) for source in sources} == {
        TumblingWindow,
        SlidingWindow,
        SessionWindow,
    }
    assert {source.event_time.format for source in sources} == set(EventTimeFormat)
    metrics = [metric for source in sources for metric in source.metrics.values()]
    assert {metric.kind for metric in metrics} == set(MetricKind)
    assert any(
        metric.kind is MetricKind.COUNT and metric.field == "level" and metric.equals == "ERROR"
        for metric in metrics
    )
    assert {metric.field for metric in metrics if metric.kind is not MetricKind.COUNT} == {"amount"}
    assert any(source.emit is Emit.FINAL_ONLY for source in sources)
    assert any(source.accumulation is Accumulation.DISCARDING for source in sources)
    assert any(
        source.idle_timeout_ms is not None and "max_future_skew_ms" in source.model_fields_set
        for source in sources
    )


def test_example_app_settings_load() -> None:
    settings = load_settings(EXAMPLES_DIR / "app.yaml", environ={})
    assert ROOT / settings.conf_dir == EXAMPLES_DIR


# (c) every field of every config model is documented


def test_the_walk_reaches_every_config_model() -> None:
    # Guards this test's own walk: were it to find nothing, the tests below would pass vacuously.
    names = {model.__name__ for model in config_models()}
    assert {"KafkaSettings", "EventTimeSpec", "SessionWindow", "MetricSpec", "RuleOverrides"} <= (
        names
    )


@pytest.mark.parametrize(
    ("model", "name"),
    [(model, name) for model in config_models() for name in model.model_fields],
    ids=lambda value: value.__name__ if isinstance(value, type) else str(value),
)
def test_every_field_is_in_the_reference(reference: str, model: type[BaseModel], name: str) -> None:
    key = model.model_fields[name].alias or name
    assert f"| `{key}` |" in model_section(reference, model), (
        f"{model.__name__}.{name} (`{key}`) is missing from its section; {STALE}"
    )
    assert field_description(model, name), (
        f"{model.__name__}.{name} has no description: give it `Field(description=...)`"
    )


@pytest.mark.parametrize(
    ("model", "name", "enum"),
    config_enums(),
    ids=lambda value: value.__name__ if isinstance(value, type) else str(value),
)
def test_every_enum_value_is_listed(
    reference: str, model: type[BaseModel], name: str, enum: type[Enum]
) -> None:
    key = model.model_fields[name].alias or name
    row = next(
        line
        for line in model_section(reference, model).splitlines()
        if line.startswith(f"| `{key}` |")
    )
    for member in enum:
        assert f"`{member.value}`" in row, f"{enum.__name__}.{member.name} is not listed"


def test_supplements_name_existing_fields() -> None:
    for model, name in SUPPLEMENTS:
        assert name in model.model_fields, f"SUPPLEMENTS names {model.__name__}.{name}, gone"


# (d) the YAML in the reference is real config


def test_every_yaml_block_in_the_reference_validates(reference: str, tmp_path: Path) -> None:
    blocks = re.findall(
        r"^### `docs/examples/([^`]+)`\n\n```yaml\n(.*?)^```$", reference, re.M | re.S
    )
    assert len(blocks) == reference.count("```yaml"), "a YAML block without its file heading"
    assert {path for path, _body in blocks} >= {"app.yaml", "sources.yaml"}
    for path, body in blocks:
        assert isinstance(yaml.safe_load(body), dict), path
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
    registry = load_registry(tmp_path)
    assert len(registry.tenants) >= 2
    load_settings(tmp_path / "app.yaml", environ={})


def test_duration_table_matches_the_parser(reference: str) -> None:
    for text in DURATION_EXAMPLES:
        assert f"| `{text}` | {parse_duration_ms(yaml.safe_load(text)):,} |" in reference
    for text in DURATION_COUNTER_EXAMPLES:
        with pytest.raises(ValueError):
            parse_duration_ms(text)


@pytest.mark.parametrize("ms", [0, 1, 999, 1_000, 1_500, 60_000, 90_000, 3_600_000, 86_400_001])
def test_shown_durations_read_back_as_the_same_value(ms: int) -> None:
    assert parse_duration_ms(format_duration(ms)) == ms
