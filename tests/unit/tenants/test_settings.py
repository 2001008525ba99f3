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


@pytest.mark.parametrize(
    ("stream", "phase_ms"),
    [
        ({}, 250),  # the default 5 s trigger
        ({"trigger_interval": "400ms"}, 100),  # a quarter of a short interval
        ({"trigger_interval": "1s", "trigger_phase": "600ms"}, 600),
        ({"trigger_interval": "1s", "trigger_phase": "0s"}, 0),
    ],
)
def test_trigger_phase_defaults_to_a_quarter_of_the_interval_at_most_250_ms(
    stream: dict[str, str], phase_ms: int
) -> None:
    settings = load_settings(
        None, environ={}, overrides={f"stream.{k}": v for k, v in stream.items()}
    )
    assert settings.stream.effective_trigger_phase_ms == phase_ms


def test_a_trigger_phase_as_long_as_the_interval_is_refused(tmp_path: Path) -> None:
    app = tmp_path / "app.yaml"
    app.write_text("stream:\n  trigger_interval: 1s\n  trigger_phase: 1s\n")
    with pytest.raises(
        ConfigError,
        match=r"app.yaml: stream: .*trigger_phase: 1000 ms must be shorter than trigger_interval",
    ):
        load_settings(app, environ={})
