"""Each micro-batch's Kafka offsets, planned on the driver.

Offsets are `{"<partition>": <next offset>}` for the subscribed topic and live only in Spark's
checkpoint. The arithmetic is kept in pure module-level functions so it can be tested without a
broker or Spark; `OffsetPlanner` asks the broker for the offsets it plans from, retrying within
`fetchOffset.timeoutMs`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from streaming.kafka.client import (
    KafkaUnavailableError,
    kafka_python_consumer,
    request_timeout_within,
)
from streaming.kafka.options import (
    EARLIEST,
    LATEST,
    SOURCE_NAME,
    KafkaSourceOptions,
    StartingOffsets,
    partition_number,
)

# kafka-python is imported by the lookups that use it: a planner travels inside the pickled
# stream reader to Spark's Python processes that never ask the broker (`client` says why).
if TYPE_CHECKING:
    from kafka import KafkaConsumer, TopicPartition

_T = TypeVar("_T")

# ---------------------------------------------------------------------------------------------
# Offset arithmetic (pure)
# ---------------------------------------------------------------------------------------------


def normalise_offsets(offsets: Mapping[str, int] | Mapping[int, int]) -> dict[str, int]:
    """String partition keys in numeric order, int values.

    Spark decides "no new data" by comparing offsets as JSON text, and JSON gives keys back as
    strings: the same offsets must always serialise to the same text.
    """
    by_number: dict[int, int] = {}
    for key, offset in offsets.items():
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset of partition {key!r} must be an int >= 0; got {offset!r}")
        by_number[partition_number(key)] = offset
    return {str(partition): by_number[partition] for partition in sorted(by_number)}


def resolve_starting_offsets(
    spec: StartingOffsets,
    topic: str,
    beginning: Mapping[int, int],
    end: Mapping[int, int],
) -> dict[str, int]:
    """Concrete start offsets for the partitions that exist now (the keys of `end`).

    As in Spark, the JSON form must name exactly the partitions the topic has, so a typo or a
    stale config fails loudly instead of silently reading from somewhere else.
    """
    existing = sorted(end)
    if spec.every_partition is not None:
        chosen = beginning if spec.every_partition == EARLIEST else end
        return normalise_offsets({p: chosen[p] for p in existing})
    requested = dict(spec.per_partition)
    missing = sorted(set(existing) - set(requested))
    unknown = sorted(set(requested) - set(existing))
    if missing or unknown:
        raise ValueError(
            f"startingOffsets must name every partition of {topic!r} ({existing}); "
            f"missing {missing}, not in the topic {unknown}"
        )
    resolved: dict[int, int] = {}
    for partition in existing:
        offset = requested[partition]
        if offset == EARLIEST:
            offset = beginning[partition]
        elif offset == LATEST:
            offset = end[partition]
        elif not beginning[partition] <= offset <= end[partition]:
            raise ValueError(
                f"startingOffsets {offset} for {topic}/{partition} is outside the available "
                f"range [{beginning[partition]}, {end[partition]}]"
            )
        resolved[partition] = offset
    return normalise_offsets(resolved)


def split_budget(lags: Mapping[str, int], budget: int) -> dict[str, int]:
    """How many offsets each partition may advance so that the total is at most `budget`.

    Shares are proportional to each partition's lag (largest-remainder rounding, ties broken by
    partition number), so the result is deterministic, sums to exactly `budget` when the lag
    exceeds it, never exceeds a partition's lag, and always makes progress when there is lag.
    """
    if budget < 1:
        raise ValueError(f"a read budget must be >= 1; got {budget}")
    shares = {key: max(lag, 0) for key, lag in lags.items()}
    total = sum(shares.values())
    if total <= budget:
        return normalise_offsets(shares)
    # Exact integer arithmetic: float rounding could overshoot the budget by one.
    remainders = {key: budget * lag % total for key, lag in shares.items()}
    shares = {key: budget * lag // total for key, lag in shares.items()}
    leftover = budget - sum(shares.values())
    by_largest_remainder = sorted(
        (key for key in shares if remainders[key] > 0),
        key=lambda key: (-remainders[key], partition_number(key)),
    )
    for key in by_largest_remainder[:leftover]:
        shares[key] += 1
    return normalise_offsets(shares)


def advance_offsets(
    start: Mapping[str, int],
    latest: Mapping[str, int],
    max_rows: int | None,
    *,
    topic: str,
) -> dict[str, int]:
    """The end offsets of the next batch for the partitions in `start`.

    `latest` holds the broker's end offsets; `max_rows` None means read everything available.
    Partitions that are in `latest` but not in `start` are not handled here (see
    `register_new_partitions`).
    """
    start = normalise_offsets(start)
    latest = normalise_offsets(latest)
    lags: dict[str, int] = {}
    for key, offset in start.items():
        end = latest.get(key, offset)
        if end < offset:
            raise ValueError(
                f"the end offset of {topic}/{key} went back from at least {offset} to {end}: "
                "the topic was probably deleted and recreated, or data was lost; "
                "start the query from a new checkpoint"
            )
        lags[key] = end - offset
    steps = lags if max_rows is None else split_budget(lags, max_rows)
    return normalise_offsets({key: offset + steps[key] for key, offset in start.items()})


class BrokerBehindError(Exception):
    """The broker's offsets are behind what the checkpoint already planned."""


def check_not_behind(known: Mapping[str, int], latest: Mapping[str, int], *, topic: str) -> None:
    """Raise `BrokerBehindError` unless every partition in `known` is in `latest`, at or past it.

    A restarting or failing-over broker can briefly list fewer partitions or lower end offsets
    (Spark's Kafka source retries those too). Planning from such an answer would stall the
    partition or, if it stays that way, hide lost data, so it is retried and then fails.
    """
    known = normalise_offsets(known)
    latest = normalise_offsets(latest)
    missing = [key for key in known if key not in latest]
    if missing:
        raise BrokerBehindError(
            f"partitions {missing} of {topic} are in the checkpoint but the broker does not list "
            "them: the topic was probably deleted or recreated; start the query from a new "
            "checkpoint"
        )
    for key, offset in known.items():
        if latest[key] < offset:
            raise BrokerBehindError(
                f"the end offset of {topic}/{key} went back from at least {offset} to "
                f"{latest[key]}: the topic was probably deleted and recreated, or data was lost; "
                "start the query from a new checkpoint"
            )


def register_new_partitions(
    offsets: Mapping[str, int], new_partition_beginnings: Mapping[str, int]
) -> dict[str, int]:
    """Add partitions that appeared since `offsets` was taken, at their beginning offset.

    A new partition enters the offset log positioned at its beginning and is read from the
    next batch on. That way every batch's ranges come from the checkpoint alone, and a replayed
    batch never has to ask the broker where a partition began.
    """
    merged = dict(normalise_offsets(offsets))
    for key, beginning in normalise_offsets(new_partition_beginnings).items():
        merged.setdefault(key, beginning)
    return normalise_offsets(merged)


def partition_ranges(
    start: Mapping[str, int], end: Mapping[str, int]
) -> list[tuple[int, int, int]]:
    """(partition, start offset, end offset) for each partition with something to read.

    A partition missing from `start` was registered by `register_new_partitions` in this batch
    and has nothing to read yet.
    """
    start = normalise_offsets(start)
    ranges = []
    for key, end_offset in normalise_offsets(end).items():
        start_offset = start.get(key)
        if start_offset is not None and start_offset < end_offset:
            ranges.append((int(key), start_offset, end_offset))
    return ranges


def split_ranges(
    ranges: Sequence[tuple[int, int, int]], min_partitions: int | None
) -> list[tuple[int, int, int]]:
    """Spark's `minPartitions`: cut the ranges into about `min_partitions` contiguous pieces.

    With fewer Kafka partitions than cores, one task per partition leaves cores idle. As in
    Spark's Kafka source, each range gets a share of the pieces proportional to its size (at
    least one), and is cut into nearly equal contiguous pieces that cover it exactly. With no
    `min_partitions`, or already that many ranges, every range stays one task.
    """
    if min_partitions is None or len(ranges) >= min_partitions:
        return list(ranges)
    total = sum(end - start for _, start, end in ranges)
    pieces: list[tuple[int, int, int]] = []
    for partition, start, end in ranges:
        size = end - start
        # Python's round() rounds halves to even; Spark's math.round rounds them up.
        parts = max(min((2 * size * min_partitions + total) // (2 * total), size), 1)
        remaining = size
        for part in range(parts):
            piece = remaining // (parts - part)
            pieces.append((partition, start, start + piece))
            start += piece
            remaining -= piece
    return pieces


def max_rows_of(limit: ReadLimit) -> int | None:
    """The row budget a read limit allows; None for "everything available"."""
    if isinstance(limit, ReadAllAvailable):
        return None
    if isinstance(limit, ReadMaxRows):
        return int(limit.max_rows)
    raise ValueError(f"{SOURCE_NAME} supports ReadAllAvailable and ReadMaxRows only; got {limit!r}")


# ---------------------------------------------------------------------------------------------
# Planning from the broker's offsets (driver)
# ---------------------------------------------------------------------------------------------


class OffsetPlanner:
    """Asks the broker for offsets and plans the next batch's end offsets from them.

    It lives in the stream reader, which Spark builds on the driver and also pickles to
    executors; those never plan and must not open connections, so the consumer is created on
    first use and left out of pickling.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._consumer: KafkaConsumer | None = None
        # End offsets fixed by fix_available_now_end; None outside AvailableNow.
        self._available_now_end: dict[str, int] | None = None
        self.latest_seen: dict[str, int] | None = None
        self._initial_offset: dict[str, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_consumer"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._consumer = None

    # -- broker lookups -------------------------------------------------------------------

    def _driver_consumer(self, budget_ms: int) -> KafkaConsumer:
        if self._consumer is None:
            self._consumer = kafka_python_consumer(
                self.options.bootstrap_servers,
                self.options.request_timeout_ms,
                client_id=f"{SOURCE_NAME}-planner-{self.options.topic}",
                budget_ms=budget_ms,
                security=self.options.security,
            )
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            from kafka.errors import KafkaError

            consumer, self._consumer = self._consumer, None
            # Closing a client of a broker that is gone may fail; it is dropped either way.
            with contextlib.suppress(KafkaError):
                consumer.close(autocommit=False)

    def _ask_broker(self, what: str, lookup: Callable[[KafkaConsumer, int], _T]) -> _T:
        """`lookup(consumer, timeout_ms)`, retried until it succeeds or fetchOffset.timeoutMs ends.

        A broker that restarts or fails over is unreachable for a while, and may briefly answer
        with metadata or offsets behind what it had: both are retried. Past the budget the
        query fails, so an outage never hangs it and a stale answer is never planned from.
        """
        from kafka.errors import KafkaError

        options = self.options
        started = time.monotonic()
        deadline = started + options.fetch_offset_timeout_ms / 1000
        attempts = 0
        while True:
            attempts += 1
            remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
            try:
                consumer = self._driver_consumer(remaining_ms)
                return lookup(
                    consumer, request_timeout_within(options.request_timeout_ms, remaining_ms)
                )
            except KafkaError as error:
                last_error: Exception = error
                # A new client after a failure bootstraps afresh instead of trusting the
                # connections and metadata it had before the outage.
                self.close()
            except BrokerBehindError as error:
                last_error = error
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                break
            time.sleep(min(options.fetch_offset_retry_interval_ms / 1000, remaining_s))
        if isinstance(last_error, BrokerBehindError):
            raise ValueError(
                f"{last_error} (still so after {options.fetch_offset_timeout_ms} ms of retries)"
            ) from None
        raise KafkaUnavailableError(
            f"{SOURCE_NAME}: {what} of topic {options.topic!r} from bootstrap servers "
            f"{options.bootstrap_servers} kept failing for "
            f"{(time.monotonic() - started) * 1000:.0f} ms (fetchOffset.timeoutMs "
            f"{options.fetch_offset_timeout_ms}, {attempts} attempts); last error: "
            f"{last_error!r}. The query "
            "stops; once the broker is reachable, restart it: it resumes from its checkpoint."
        ) from last_error

    def _topic_partitions(self, consumer: KafkaConsumer) -> list[TopicPartition]:
        # topics() always refreshes metadata, so a topic that was created or grew is seen;
        # partitions_for_topic alone would answer from a cache that is minutes old.
        from kafka import TopicPartition

        if self.options.topic not in consumer.topics():
            return []
        partitions = consumer.partitions_for_topic(self.options.topic)
        return [TopicPartition(self.options.topic, p) for p in sorted(partitions)]

    @staticmethod
    def _broker_offsets(
        consumer: KafkaConsumer,
        which: Literal["beginning", "end"],
        partitions: Sequence[TopicPartition],
        timeout_ms: int,
    ) -> dict[int, int]:
        if not partitions:
            return {}
        lookup = consumer.beginning_offsets if which == "beginning" else consumer.end_offsets
        found = lookup(list(partitions), timeout_ms=timeout_ms)
        return {tp.partition: int(offset) for tp, offset in found.items()}

    def _end_offsets(self, known: Mapping[str, int]) -> dict[str, int]:
        """The end offset of every partition, none behind `known` (offsets already planned)."""

        def lookup(consumer: KafkaConsumer, timeout_ms: int) -> dict[str, int]:
            partitions = self._topic_partitions(consumer)
            ends = normalise_offsets(self._broker_offsets(consumer, "end", partitions, timeout_ms))
            check_not_behind(known, ends, topic=self.options.topic)
            return ends

        return self._ask_broker("fetching end offsets", lookup)

    # -- planning -------------------------------------------------------------------------

    def initial_offsets(self) -> dict[str, int]:
        """Where the query starts, resolved from `startingOffsets` once per query run."""
        # Spark asks more than once before the first batch runs (measured: twice, with a
        # trigger in between). Resolving `latest` anew would skip whatever arrived meanwhile,
        # so resolve once per query run. Spark's own source also persists it in the
        # checkpoint; a Python source cannot, so a query stopped before its first batch
        # resolves it again on restart.
        if self._initial_offset is None:

            def lookup(
                consumer: KafkaConsumer, timeout_ms: int
            ) -> tuple[dict[int, int], dict[int, int]]:
                partitions = self._topic_partitions(consumer)
                return (
                    self._broker_offsets(consumer, "beginning", partitions, timeout_ms),
                    self._broker_offsets(consumer, "end", partitions, timeout_ms),
                )

            beginning, end = self._ask_broker("fetching starting offsets", lookup)
            self._initial_offset = resolve_starting_offsets(
                self.options.starting_offsets, self.options.topic, beginning=beginning, end=end
            )
        return dict(self._initial_offset)

    def fix_available_now_end(self) -> None:
        """Stop at today's end offsets: AvailableNow must not chase records produced later."""
        self._available_now_end = self._end_offsets({})

    def next_end(self, start: Mapping[str, int], max_rows: int | None) -> dict[str, int]:
        """The end offsets of the batch that starts at `start`, at most `max_rows` ahead."""
        if self._available_now_end is not None:
            latest = self._available_now_end
            # Fixed when the query started: a stale answer then cannot be retried away now.
            try:
                check_not_behind(start, latest, topic=self.options.topic)
            except BrokerBehindError as error:
                raise ValueError(str(error)) from None
        else:
            latest = self._end_offsets(start)
        self.latest_seen = latest
        end = advance_offsets(start, latest, max_rows, topic=self.options.topic)
        new_keys = [key for key in latest if key not in start]
        if new_keys:
            from kafka import TopicPartition

            new_partitions = [TopicPartition(self.options.topic, int(k)) for k in new_keys]
            beginnings = self._ask_broker(
                "fetching beginning offsets of new partitions",
                lambda consumer, timeout_ms: self._broker_offsets(
                    consumer, "beginning", new_partitions, timeout_ms
                ),
            )
            end = register_new_partitions(end, normalise_offsets(beginnings))
        return end
