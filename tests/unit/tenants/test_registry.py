"""Tenant config: strict ids, rule overrides, and errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.cli.main import main
from tenants.conf_reader import load_registry, load_tenant
from tenants.models import Accumulation
from tenants.registry import ConfigError
from tests.support.sample_conf import SAMPLE_CONF, copy_conf, write_tenant


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    return copy_conf(SAMPLE_CONF, tmp_path)


def test_sample_config_is_valid_and_overrides_apply() -> None:
    registry = load_registry(SAMPLE_CONF)
    assert set(registry.tenants) == {"acme", "globex", "initech"}
    globex_web = registry.resolve("globex", "web")
    acme_web = registry.resolve("acme", "web")
    assert globex_web is not None and acme_web is not None
    assert globex_web.rules.allowed_lateness_ms == 300_000
    assert acme_web.rules.allowed_lateness_ms == 60_000
    initech_billing = registry.resolve("initech", "billing")
    assert initech_billing is not None
    assert initech_billing.rules.window.size_ms == 60_000
    assert initech_billing.rules.accumulation is Accumulation.DISCARDING


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ("id: Acme\nsources: [web]\n", "id", "should match pattern"),
        ("id: a/b\nsources: [web]\n", "id", "should match pattern"),
        (
            "id: ok\nsources:\n  web: {allowed_lateness: soon}\n",
            "sources.web.allowed_lateness",
            "invalid duration",
        ),
        (
            "id: ok\nsources:\n  web: {window: {kind: tumbling, size: 0s}}\n",
            "sources.web.window.size",
            "greater than 0",
        ),
        (
            "id: ok\nsources:\n  web: {out_of_orderness: -5}\n",
            "sources.web.out_of_orderness",
            "greater than or equal to 0",
        ),
        ("id: ok\nsources:\n  web: {colour: red}\n", "sources.web.colour", "Extra inputs"),
        ("id: ok\nsources:\n  mobile: {}\n", "sources.mobile", "unknown source"),
        ("id: ok\nsources: {}\n", "sources", "at least 1 item"),
        ("id: ok\nsources: [web\n", "(file)", "not valid YAML"),
        (
            "id: ok\nsources:\n  web: {window: {kind: sliding, size: 5m, slide: 2m}}\n",
            "sources.web.window",
            "multiple of slide",
        ),
        (
            "id: ok\nsources:\n  web: {window: {kind: session, gap: 0s}}\n",
            "sources.web.window.gap",
            "greater than 0",
        ),
        (
            "id: ok\nsources:\n  web: {window: {kind: hopping, size: 1m}}\n",
            "sources.web.window",
            "tumbling",
        ),
        (
            "id: ok\nsources:\n  web: {metrics: {total: {kind: sum}}}\n",
            "sources.web.metrics.total",
            "needs a numeric `field`",
        ),
        (
            "id: ok\nsources:\n  web: {metrics: {errors: {kind: count, field: level}}}\n",
            "sources.web.metrics.errors",
            "needs both",
        ),
        (
            "id: ok\nsources:\n  web: {metrics: {Bad-Name: {kind: count}}}\n",
            "sources.web.metrics.Bad-Name.[key]",
            "should match pattern",
        ),
        ("id: ok\nsources:\n  web: {emit: sometimes}\n", "sources.web.emit", "every_pane"),
        (
            "id: ok\nsources:\n  web: {idle_timeout: 0ms}\n",
            "sources.web.idle_timeout",
            "greater than 0",
        ),
    ],
)
def test_invalid_tenant_file_is_refused_naming_file_and_field(
    conf: Path, text: str, field: str, problem: str
) -> None:
    path = write_tenant(conf, "bad", text)
    with pytest.raises(ConfigError) as refused:
        load_registry(conf)
    message = str(refused.value)
    assert str(path) in message
    assert f": {field}: " in message
    assert problem in message


def test_duplicate_tenant_ids_across_files_are_refused(conf: Path) -> None:
    path = write_tenant(conf, "zz-copy", "id: acme\nsources: [web]\n")
    with pytest.raises(ConfigError, match="already defined in") as refused:
        load_registry(conf)
    assert str(path) in str(refused.value)


def test_cli_validate_exits_zero_on_valid_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tenants", "validate", "--conf", str(SAMPLE_CONF)]) == 0
    assert "3 tenants" in capsys.readouterr().out


def test_cli_validate_names_file_and_field_and_exits_non_zero(
    conf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_tenant(conf, "broken", "id: broken\nsources:\n  web: {allowed_lateness: 1y}\n")
    assert main(["tenants", "validate", "--conf", str(conf)]) == 2
    error = capsys.readouterr().err
    assert f"{path}: sources.web.allowed_lateness: " in error


def test_a_tenant_file_that_is_not_utf8_is_refused_naming_the_file(conf: Path) -> None:
    path = conf / "tenants" / "cafe.yaml"
    path.write_bytes(b"id: caf\xe9\nsources: [web]\n")
    with pytest.raises(ConfigError, match="not UTF-8") as refused:
        load_registry(conf)
    assert str(path) in str(refused.value)


def test_one_tenant_is_read_from_its_own_file_without_reading_the_others(conf: Path) -> None:
    # Another tenant's broken file would stop a whole-directory read; one tenant's lookup
    # reads its own file only.
    (conf / "tenants" / "broken.yaml").write_text("id: [not, an, id]\n")
    acme = load_tenant(conf, "acme")
    assert acme is not None and acme.id == "acme"
    assert acme == load_registry(SAMPLE_CONF).tenants["acme"]


def test_a_tenant_in_a_file_of_another_name_is_found_and_an_unknown_one_is_none(
    conf: Path,
) -> None:
    (conf / "tenants" / "acme.yaml").rename(conf / "tenants" / "first-customer.yaml")
    acme = load_tenant(conf, "acme")
    assert acme is not None and acme.id == "acme"
    assert load_tenant(conf, "nobody") is None
    assert load_tenant(conf, "../acme") is None


def test_a_file_named_after_a_tenant_that_defines_another_is_not_taken_for_it(
    conf: Path,
) -> None:
    (conf / "tenants" / "acme.yaml").rename(conf / "tenants" / "acme-old.yaml")
    write_tenant(conf, "acme", "id: wayne\nsources: [web]\n")
    acme = load_tenant(conf, "acme")
    assert acme is not None and acme.id == "acme"
