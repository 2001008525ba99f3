"""A misspelt config key is answered with the known field it is closest to, where it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from tenants.conf_reader import load_registry
from tenants.field_suggestions import closest_field, field_names_at
from tenants.models import SourceConfig
from tenants.registry import ConfigError
from tenants.settings import AppSettings, load_settings
from tests.support.sample_conf import SAMPLE_CONF, copy_conf, write_tenant


@pytest.mark.parametrize(
    ("rules", "field", "suggestion"),
    [
        ("{allowed_latenes: 1m}", "sources.web.allowed_latenes", "allowed_lateness"),
        ("{out_of_ordreness: 5s}", "sources.web.out_of_ordreness", "out_of_orderness"),
        ("{windw: {kind: tumbling, size: 1m}}", "sources.web.windw", "window"),
        # Inside a discriminated union: the chosen kind's fields, by their YAML names.
        ("{window: {kind: sliding, size: 10m, slid: 1m}}", "sources.web.window.slid", "slide"),
    ],
)
def test_a_tenant_files_misspelt_key_says_did_you_mean(
    tmp_path: Path, rules: str, field: str, suggestion: str
) -> None:
    conf = copy_conf(SAMPLE_CONF, tmp_path)
    write_tenant(conf, "acme", f"id: acme\nsources:\n  web: {rules}\n")
    with pytest.raises(ConfigError) as refused:
        load_registry(conf)
    assert (
        f"acme.yaml: {field}: Extra inputs are not permitted; did you mean `{suggestion}`?"
        in str(refused.value)
    )


def test_a_sources_files_misspelt_key_says_did_you_mean(tmp_path: Path) -> None:
    conf = copy_conf(SAMPLE_CONF, tmp_path)
    sources = conf / "sources.yaml"
    sources.write_text(sources.read_text().replace("    idle_timeout: 2m", "    idle_timout: 2m"))
    with pytest.raises(
        ConfigError, match=r"sources\.web\.idle_timout: .*did you mean `idle_timeout`"
    ):
        load_registry(conf)


def test_a_key_far_from_every_field_gets_no_guess(tmp_path: Path) -> None:
    conf = copy_conf(SAMPLE_CONF, tmp_path)
    write_tenant(conf, "acme", "id: acme\nsources:\n  web: {colour: red}\n")
    with pytest.raises(ConfigError) as refused:
        load_registry(conf)
    assert "sources.web.colour: Extra inputs are not permitted" in str(refused.value)
    assert "did you mean" not in str(refused.value)


def test_app_settings_say_did_you_mean_for_files_and_variables(tmp_path: Path) -> None:
    app_file = tmp_path / "app.yaml"
    app_file.write_text((SAMPLE_CONF / "app.yaml").read_text().replace("  root: ", "  rot: "))
    with pytest.raises(ConfigError, match=r"lake\.rot: .*did you mean `root`\?"):
        load_settings(app_file, environ={})
    with pytest.raises(ConfigError, match=r"stream\.triger_interval: .*`trigger_interval`\?"):
        load_settings(SAMPLE_CONF / "app.yaml", environ={"TW_STREAM__TRIGER_INTERVAL": "5s"})


def test_the_known_names_follow_the_location() -> None:
    assert "allowed_lateness" in field_names_at(SourceConfig, [])
    assert {"size", "slide"} <= field_names_at(SourceConfig, ["window", "sliding"])
    assert "bootstrap_servers" in field_names_at(AppSettings, ["kafka"])
    assert "bootstrap_servers" not in field_names_at(AppSettings, ["lake"])


@pytest.mark.parametrize(
    ("unknown", "expected"),
    [
        ("allowed_latenes", "allowed_lateness"),  # a letter left out
        ("alowed_lateness", "allowed_lateness"),
        ("allowed_latneess", "allowed_lateness"),  # two letters swapped
        ("size", "size"),
        ("sise", "size"),
        ("gpa", "gap"),
        ("colour", None),
        ("x", None),
    ],
)
def test_closest_field_within_a_short_edit_distance(unknown: str, expected: str | None) -> None:
    known = ["allowed_lateness", "out_of_orderness", "size", "slide", "gap", "window"]
    assert closest_field(unknown, known) == expected
