"""Notification endpoints in the tenant config: what is refused, what overrides what, and that a
URL never shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from tenants.conf_reader import load_registry
from tenants.models import NotifyKind, NotifyOn, NotifyTarget, SourceConfig
from tenants.registry import ConfigError
from tests.support.sample_conf import SAMPLE_CONF


def _write_conf(tmp_path: Path, notify_yaml: str) -> Path:
    (tmp_path / "tenants").mkdir()
    (tmp_path / "sources.yaml").write_text(
        "sources:\n  web:\n    event_time: {field: ts, format: iso8601}\n"
        "    window: {kind: tumbling, size: 1m}\n    out_of_orderness: 1s\n"
    )
    (tmp_path / "tenants" / "acme.yaml").write_text(
        f"id: acme\nsources:\n  web:\n    notify:\n{notify_yaml}"
    )
    return tmp_path


@pytest.mark.parametrize(
    ("notify_yaml", "problem"),
    [
        ("      - {kind: webhook, url: 'ftp://127.0.0.1/x'}\n", "only http and https"),
        ("      - {kind: webhook, url: 'file:///etc/passwd'}\n", "only http and https"),
        ("      - {kind: webhook, url: 'http:///no-host'}\n", "no host"),
        ("      - {kind: email, url: 'http://127.0.0.1/x'}\n", "webhook"),
        ("      - {kind: webhook, url: 'http://127.0.0.1/x', on: sometimes}\n", "final"),
        ("      - {kind: webhook, url: 'http://127.0.0.1/x', timeout: soon}\n", "duration"),
        ("      - {kind: webhook, url: 'secret:'}\n", "file path"),
        ("      - {kind: webhook, url: 'http://127.0.0.1:99999/no-host'}\n", "host and port"),
        ("      - {kind: webhook, url: 'http://127.0.0.1/a no-host'}\n", "spaces"),
    ],
)
def test_a_bad_endpoint_is_refused_naming_the_file_and_field(
    tmp_path: Path, notify_yaml: str, problem: str
) -> None:
    conf = _write_conf(tmp_path, notify_yaml)
    with pytest.raises(ConfigError) as refused:
        load_registry(conf)
    message = str(refused.value)
    assert str(conf / "tenants" / "acme.yaml") in message
    assert "sources.web.notify.0" in message
    assert problem in message
    assert "passwd" not in message and "no-host" not in message  # the URL itself is not quoted


def test_a_tenant_override_replaces_the_source_endpoints(tmp_path: Path) -> None:
    conf = _write_conf(tmp_path, "      - {kind: slack, url: '${ACME_SLACK}', on: every_pane}\n")
    registry = load_registry(conf)
    source = registry.sources["web"]
    targets = source.notify_targets(registry.tenants["acme"].sources["web"])
    assert [(t.kind, t.on, t.timeout_ms) for t in targets] == [
        (NotifyKind.SLACK, NotifyOn.EVERY_PANE, 5_000)
    ]
    assert source.notify_targets(None) == ()
    # Window rules never carry endpoints: the windows' state must hold no secret.
    assert "notify" not in registry.resolve("acme", "web").rules.model_dump()  # type: ignore[union-attr]


def test_a_url_is_never_shown_but_survives_the_config_snapshot() -> None:
    url = "https://hooks.slack.com/services/T0/B0/XyZ"
    target = NotifyTarget(kind=NotifyKind.SLACK, url=SecretStr(url))
    assert "XyZ" not in repr(target) and "XyZ" not in str(target)
    source = SourceConfig.model_validate(
        {
            "event_time": {"field": "ts", "format": "iso8601"},
            "window": {"kind": "tumbling", "size": "1m"},
            "out_of_orderness": "1s",
            "notify": [{"kind": "slack", "url": url}],
        }
    )
    assert SourceConfig.model_validate_json(source.model_dump_json()) == source


@pytest.mark.parametrize(
    ("notify_yaml", "notifies"),
    [
        ("      - {kind: webhook, url: 'http://127.0.0.1/x'}\n", True),
        ("      []\n", False),
    ],
)
def test_the_registry_knows_whether_any_key_has_an_endpoint(
    tmp_path: Path, notify_yaml: str, notifies: bool
) -> None:
    assert load_registry(_write_conf(tmp_path, notify_yaml)).notifies_anyone() is notifies


def test_the_project_conf_notifies_nobody() -> None:
    assert not load_registry(SAMPLE_CONF).notifies_anyone()
