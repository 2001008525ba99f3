"""How the executors' Kafka read treats the consumer's errors, with a scripted consumer: a failed
lookup of the group coordinator (a group the reader never uses) is no reason to fail a read; an
error of the partition's data is."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from streaming.kafka import reader
from streaming.kafka.reader import KafkaInputPartition, read_partition

TOPIC = "events"
COORDINATOR_ERROR = "FindCoordinator response error: Local: Bad message format"


@dataclass(frozen=True)
class _Error:
    text: str

    def str(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class _Message:
    topic_name: str | None
    offset_value: int | None
    failure: _Error | None = None

    def error(self) -> _Error | None:
        return self.failure

    def topic(self) -> str | None:
        return self.topic_name

    def offset(self) -> int | None:
        return self.offset_value

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return f"v{self.offset_value}".encode()

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_767_225_600_000)

    def headers(self) -> None:
        return None


class _ScriptedConsumer:
    def __init__(self, script: list[list[_Message]]) -> None:
        self.script: Iterator[list[_Message]] = iter(script)
        self.closed = False

    def assign(self, _partitions: Any) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        return next(self.script, [])

    def close(self) -> None:
        self.closed = True


def _read(monkeypatch: pytest.MonkeyPatch, script: list[list[_Message]]) -> list[int]:
    consumer = _ScriptedConsumer(script)
    monkeypatch.setattr(reader, "librdkafka_consumer", lambda *args, **kwargs: consumer)
    split = KafkaInputPartition(TOPIC, 0, 0, 3, "127.0.0.1:9", 1_000, None)
    try:
        return [row["offset"] for batch in read_partition(split) for row in batch.to_pylist()]
    finally:
        assert consumer.closed


def test_a_failed_coordinator_lookup_does_not_fail_the_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = [
        [_Message(None, None, _Error(COORDINATOR_ERROR)), _Message(TOPIC, 0)],
        [_Message(TOPIC, 1), _Message(TOPIC, 2)],
    ]
    assert _read(monkeypatch, script) == [0, 1, 2]


def test_an_error_of_the_partitions_data_fails_the_read(monkeypatch: pytest.MonkeyPatch) -> None:
    script = [[_Message(TOPIC, 0), _Message(TOPIC, None, _Error("Broker: Offset out of range"))]]
    with pytest.raises(RuntimeError, match=r"events/0 offsets \[0, 3\).*Offset out of range"):
        _read(monkeypatch, script)
