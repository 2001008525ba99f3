"""Mirroring the stream's offsets to its consumer group fails no batch: a broker that is gone makes
a warning. (The mirror against a real broker: tests/integration/kafka/test_group_offsets.py.)"""

from __future__ import annotations

import logging
import time

import pytest

from infra.dev.local_stack import find_free_loopback_port
from streaming.kafka.group_offsets import GroupOffsets
from tenants.settings import load_settings


def test_a_broker_that_is_gone_makes_a_warning_not_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = load_settings(
        None,
        environ={"TW_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{find_free_loopback_port()}"},
    )
    mirror = GroupOffsets(settings.kafka, "nobody-listens")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        assert mirror.mirror({0: 5}) is False
    assert time.monotonic() - started < 10
    assert "could not mirror offsets to consumer group nobody-listens" in caplog.text
    mirror.close()
