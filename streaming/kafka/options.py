"""The `tw_kafka` reader's options: Spark's Kafka source option names, parsed and validated.

Spark hands options over as strings; everything is validated once here, on the driver, so a
typo fails the query at start instead of inside an executor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from streaming.kafka.client import PLAINTEXT, KafkaSecurity

SOURCE_NAME = "tw_kafka"

# Kafka's own markers in `startingOffsets` JSON, as in Spark's Kafka source.
EARLIEST = -2
LATEST = -1

DEFAULT_STARTING_OFFSETS = "latest"  # Spark's default for streaming queries
DEFAULT_POLL_TIMEOUT_MS = 120_000
# The driver's budget for one offset lookup, retries included; as long as pollTimeoutMs, so a
# broker outage stops the query after about the same time whether it hits planning or reading.
DEFAULT_FETCH_OFFSET_TIMEOUT_MS = 120_000
DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS = 500


@dataclass(frozen=True)
class StartingOffsets:
    """Where a new query starts: one marker for every partition, or a position per partition.

    `every_partition` is EARLIEST or LATEST; it is None when `per_partition` (the JSON form)
    is given. `per_partition` holds (partition, offset-or-marker) pairs; a tuple keeps the
    object immutable and picklable.
    """

    every_partition: int | None
    per_partition: tuple[tuple[int, int], ...] = ()


AT_MS_KEY = "_at_ms"
"""The one key of a `tw_kafka` offset that is not a partition: when the batch was planned, in
ms since the epoch (streaming.kafka.deferral_planning). Offsets written before deferral lack it."""


def partition_offsets(offset: Mapping[str, object]) -> dict[int, int]:
    """`{partition: next offset}` of a `tw_kafka` offset as Spark stores it; ValueError or
    TypeError for anything else."""
    return {
        partition_number(key): int(value)  # type: ignore[call-overload]
        for key, value in offset.items()
        if key != AT_MS_KEY
    }


def kafka_offsets(offset: Mapping[str, int]) -> dict[str, int]:
    """A `tw_kafka` offset's partitions, as Spark stores them, without `_at_ms`."""
    return {key: value for key, value in offset.items() if key != AT_MS_KEY}


def partition_number(key: str | int) -> int:
    """A partition key (JSON gives strings) as its number; anything else is rejected."""
    try:
        number = int(key)
    except (TypeError, ValueError):
        raise ValueError(f"a partition must be a non-negative integer; got {key!r}") from None
    if number < 0 or isinstance(key, bool):
        raise ValueError(f"a partition must be a non-negative integer; got {key!r}")
    return number


def parse_starting_offsets(text: str | None, topic: str) -> StartingOffsets:
    """Parse Spark's `startingOffsets` option: `earliest`, `latest` or JSON for `topic`.

    JSON looks like `{"topic": {"0": 23, "1": -2}}`, with -2 meaning earliest and -1 latest.
    """
    if text is None or not text.strip():
        text = DEFAULT_STARTING_OFFSETS
    word = text.strip().lower()
    if word == "earliest":
        return StartingOffsets(every_partition=EARLIEST)
    if word == "latest":
        return StartingOffsets(every_partition=LATEST)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"startingOffsets must be 'earliest', 'latest' or JSON like "
            f'{{"{topic}": {{"0": 23, "1": -2}}}}; got {text!r} ({error})'
        ) from None
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise ValueError(
            f'startingOffsets JSON must map a topic to {{"partition": offset}}; got {text!r}'
        )
    other_topics = sorted(set(parsed) - {topic})
    if other_topics:
        raise ValueError(
            f"startingOffsets names topics {other_topics} that are not subscribed "
            f"(subscribe={topic!r})"
        )
    if topic not in parsed:
        raise ValueError(f"startingOffsets JSON has no entry for the subscribed topic {topic!r}")
    pairs: list[tuple[int, int]] = []
    for key, offset in parsed[topic].items():
        partition = partition_number(key)
        # bool is an int in Python; `true` as an offset is a typo, not offset 1.
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
            raise ValueError(
                f"startingOffsets for {topic}/{key} must be an offset >= 0, -2 (earliest) or "
                f"-1 (latest); got {offset!r}"
            )
        pairs.append((partition, offset))
    return StartingOffsets(every_partition=None, per_partition=tuple(sorted(pairs)))


def _optional_int(options: Mapping[str, str], name: str, allow_zero: bool = False) -> int | None:
    raw = options.get(name.lower())
    if raw is None or str(raw).strip() == "":
        return None
    expected = "a non-negative integer" if allow_zero else "a positive integer"
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {name} must be {expected}; got {raw!r}") from None
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"option {name} must be {expected}; got {raw!r}")
    return value


@dataclass(frozen=True)
class KafkaSourceOptions:
    """The validated reader options: Spark's Kafka source names, plus `fetchOffset.timeoutMs`.

    Supported: `kafka.bootstrap.servers`, `subscribe` (one topic), `startingOffsets`,
    `maxOffsetsPerTrigger`, `minPartitions`, `pollTimeoutMs`, `kafka.request.timeout.ms`,
    `fetchOffset.timeoutMs` and `fetchOffset.retryIntervalMs`; and this source's own
    `triggerIntervalMs` with `triggerPhaseMs` (`trigger_phase`).

    `pollTimeoutMs` bounds an executor read without progress; `fetchOffset.timeoutMs` bounds a
    driver-side offset lookup, retried every `fetchOffset.retryIntervalMs` meanwhile. Past
    either, the query fails with a `KafkaUnavailableError` instead of waiting forever.
    """

    bootstrap_servers: str
    topic: str
    starting_offsets: StartingOffsets
    max_offsets_per_trigger: int | None
    poll_timeout_ms: int
    request_timeout_ms: int | None
    fetch_offset_timeout_ms: int = DEFAULT_FETCH_OFFSET_TIMEOUT_MS
    fetch_offset_retry_interval_ms: int = DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS
    # Spark's `minPartitions`: None keeps one task per Kafka partition with data.
    min_partitions: int | None = None
    # The query's processing-time trigger, and how long after each of its ticks a batch takes
    # its end offsets (`trigger_phase`); no interval: at once.
    trigger_interval_ms: int | None = None
    trigger_phase_ms: int = 0
    security: KafkaSecurity = PLAINTEXT
    """Not an option: options are strings that plans show (`source.register`)."""

    @classmethod
    def from_options(
        cls, options: Mapping[str, str], security: KafkaSecurity = PLAINTEXT
    ) -> KafkaSourceOptions:
        # Spark hands over a case-insensitive dict; a plain dict (tests, callers) is lowered here.
        lowered = {str(k).lower(): str(v) for k, v in options.items()}
        for unsupported in ("subscribepattern", "assign"):
            if unsupported in lowered:
                raise ValueError(
                    f"option {unsupported!r} is not supported by {SOURCE_NAME}; "
                    "use subscribe with exactly one topic"
                )
        servers = lowered.get("kafka.bootstrap.servers", "").strip()
        if not servers:
            raise ValueError("option kafka.bootstrap.servers is required")
        topic = lowered.get("subscribe", "").strip()
        if not topic or "," in topic:
            raise ValueError(f"option subscribe must name exactly one topic; got {topic!r}")
        poll_timeout_ms = _optional_int(lowered, "pollTimeoutMs")
        fetch_timeout_ms = _optional_int(lowered, "fetchOffset.timeoutMs")
        retry_interval_ms = _optional_int(lowered, "fetchOffset.retryIntervalMs")
        trigger_interval_ms = _optional_int(lowered, "triggerIntervalMs")
        trigger_phase_ms = _optional_int(lowered, "triggerPhaseMs", allow_zero=True) or 0
        if trigger_phase_ms and (
            trigger_interval_ms is None or trigger_phase_ms >= trigger_interval_ms
        ):
            raise ValueError(
                f"option triggerPhaseMs ({trigger_phase_ms}) needs a longer triggerIntervalMs; "
                f"got {trigger_interval_ms}"
            )
        return cls(
            bootstrap_servers=servers,
            topic=topic,
            starting_offsets=parse_starting_offsets(lowered.get("startingoffsets"), topic),
            max_offsets_per_trigger=_optional_int(lowered, "maxOffsetsPerTrigger"),
            poll_timeout_ms=poll_timeout_ms or DEFAULT_POLL_TIMEOUT_MS,
            request_timeout_ms=_optional_int(lowered, "kafka.request.timeout.ms"),
            fetch_offset_timeout_ms=fetch_timeout_ms or DEFAULT_FETCH_OFFSET_TIMEOUT_MS,
            fetch_offset_retry_interval_ms=(
                retry_interval_ms or DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS
            ),
            min_partitions=_optional_int(lowered, "minPartitions"),
            trigger_interval_ms=trigger_interval_ms,
            trigger_phase_ms=trigger_phase_ms,
            security=security,
        )
