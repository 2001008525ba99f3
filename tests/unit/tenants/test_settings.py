"""The app settings: a file, then the environment, then flags; errors name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from tenants.registry import ConfigError
from tenants.settings import load_settings


def test_settings_layer_file_then_environment_then_flags(tmp_path: Path) -> None:
    app = tmp_path / "app.yaml"
    app.write_text(
        "kafka:\n  topic: from-file\n  bootstrap_servers: 127.0.0.1:1\nstream:\n  trigger_interval: 2s\n"
    )
    settings = load_settings(
        app,
        environ={"TW_KAFKA__TOPIC": "from-env", "TW_LAKE__ROOT": "/lake", "OTHER": "x"},
        overrides={"kafka.topic": "from-flag", "kafka.max_offsets_per_trigger": None},
    )
    assert settings.kafka.topic == "from-flag"
    assert settings.kafka.bootstrap_servers == "127.0.0.1:1"
    assert settings.lake.root == "/lake"
    assert settings.stream.trigger_interval_ms == 2_000
    assert settings.kafka.max_offsets_per_trigger == 50_000


def test_invalid_settings_name_the_field(tmp_path: Path) -> None:
    app = tmp_path / "app.yaml"
    app.write_text("stream:\n  name: Not/Valid\n")
    with pytest.raises(ConfigError, match=r"app.yaml: stream.name: String should match"):
        load_settings(app, environ={})
