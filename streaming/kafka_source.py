"""A Spark Structured Streaming source for one Kafka topic, as a Python Data Source.

No Maven repository is reachable here, so Spark's own Kafka connector jar is unavailable; this
source reads Kafka through kafka-python instead. It keeps the built-in source's option names and
output columns (those of `format("kafka")` with `includeHeaders=true`), so a cluster that has
the connector can switch formats by configuration alone.

Offsets are `{"<partition>": <next offset>}` for the subscribed topic and live only in Spark's
checkpoint. The offset arithmetic is kept in pure module-level functions so it can be tested
without a broker or Spark.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import pyarrow as pa
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streaming.hooks import NO_FAULTS, FaultHook, FaultPoint

SOURCE_NAME = "tw_kafka"

_T = TypeVar("_T")

# Kafka's own markers in `startingOffsets` JSON, as in Spark's Kafka source.
EARLIEST = -2
LATEST = -1

DEFAULT_STARTING_OFFSETS = "latest"  # Spark's default for streaming queries
DEFAULT_POLL_TIMEOUT_MS = 120_000
# The driver's budget for one offset lookup, retries included; as long as pollTimeoutMs, so a
# broker outage stops the query after about the same time whether it hits planning or reading.
DEFAULT_FETCH_OFFSET_TIMEOUT_MS = 120_000
DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS = 500
# kafka-python's own default; a lookup never gets more than what is left of its budget.
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
ARROW_BATCH_ROWS = 10_000

KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)

# Derived with Spark's own conversion: Spark rejects a RecordBatch whose schema differs from
# this one in any detail (timestamp unit, time zone, nullability, list field names).
ARROW_SCHEMA = to_arrow_schema(KAFKA_SCHEMA, timezone="UTC")


# ---------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartingOffsets:
    """Where a new query starts: one marker for every partition, or a position per partition.

    `every_partition` is EARLIEST or LATEST; it is None when `per_partition` (the JSON form)
    is given. `per_partition` holds (partition, offset-or-marker) pairs; a tuple keeps the
    object immutable and picklable.
    """

    every_partition: int | None
    per_partition: tuple[tuple[int, int], ...] = ()


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
        partition = _partition_number(key)
        # bool is an int in Python; `true` as an offset is a typo, not offset 1.
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
            raise ValueError(
                f"startingOffsets for {topic}/{key} must be an offset >= 0, -2 (earliest) or "
                f"-1 (latest); got {offset!r}"
            )
        pairs.append((partition, offset))
    return StartingOffsets(every_partition=None, per_partition=tuple(sorted(pairs)))


def _optional_positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name.lower())
    if raw is None or str(raw).strip() == "":
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {name} must be a positive integer; got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"option {name} must be a positive integer; got {raw!r}")
    return value


@dataclass(frozen=True)
class KafkaSourceOptions:
    """The validated reader options: Spark's Kafka source names, plus `fetchOffset.timeoutMs`.

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

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaSourceOptions:
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
        poll_timeout_ms = _optional_positive_int(lowered, "pollTimeoutMs")
        fetch_timeout_ms = _optional_positive_int(lowered, "fetchOffset.timeoutMs")
        retry_interval_ms = _optional_positive_int(lowered, "fetchOffset.retryIntervalMs")
        return cls(
            bootstrap_servers=servers,
            topic=topic,
            starting_offsets=parse_starting_offsets(lowered.get("startingoffsets"), topic),
            max_offsets_per_trigger=_optional_positive_int(lowered, "maxOffsetsPerTrigger"),
            poll_timeout_ms=poll_timeout_ms or DEFAULT_POLL_TIMEOUT_MS,
            request_timeout_ms=_optional_positive_int(lowered, "kafka.request.timeout.ms"),
            fetch_offset_timeout_ms=fetch_timeout_ms or DEFAULT_FETCH_OFFSET_TIMEOUT_MS,
            fetch_offset_retry_interval_ms=(
                retry_interval_ms or DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS
            ),
        )


# ---------------------------------------------------------------------------------------------
# Offset arithmetic (pure)
# ---------------------------------------------------------------------------------------------


def _partition_number(key: str | int) -> int:
    try:
        number = int(key)
    except (TypeError, ValueError):
        raise ValueError(f"a partition must be a non-negative integer; got {key!r}") from None
    if number < 0 or isinstance(key, bool):
        raise ValueError(f"a partition must be a non-negative integer; got {key!r}")
    return number


def normalise_offsets(offsets: Mapping[str, int] | Mapping[int, int]) -> dict[str, int]:
    """String partition keys in numeric order, int values.

    Spark decides "no new data" by comparing offsets as JSON text, and JSON gives keys back as
    strings: the same offsets must always serialise to the same text.
    """
    by_number: dict[int, int] = {}
    for key, offset in offsets.items():
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset of partition {key!r} must be an int >= 0; got {offset!r}")
        by_number[_partition_number(key)] = offset
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
        key=lambda key: (-remainders[key], _partition_number(key)),
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


def max_rows_of(limit: ReadLimit) -> int | None:
    """The row budget a read limit allows; None for "everything available"."""
    if isinstance(limit, ReadAllAvailable):
        return None
    if isinstance(limit, ReadMaxRows):
        return int(limit.max_rows)
    raise ValueError(f"{SOURCE_NAME} supports ReadAllAvailable and ReadMaxRows only; got {limit!r}")


# ---------------------------------------------------------------------------------------------
# Reading records (executors)
# ---------------------------------------------------------------------------------------------


class KafkaUnavailableError(TimeoutError):
    """The broker did not answer within the source's time budget; the query should fail."""


def consumer_config(
    bootstrap_servers: str,
    request_timeout_ms: int | None,
    client_id: str,
    bootstrap_timeout_ms: int | None = None,
) -> dict[str, Any]:
    """kafka-python settings for a consumer that never joins a group or commits."""
    config: dict[str, Any] = {
        "bootstrap_servers": bootstrap_servers,
        "client_id": client_id,
        # Offsets live in Spark's checkpoint; a group would only add rebalances and commits.
        "group_id": None,
        "enable_auto_commit": False,
        # A metadata lookup of a missing topic must not create it behind the producer's back.
        "allow_auto_create_topics": False,
        # Fail instead of silently jumping elsewhere when a requested offset is gone.
        "auto_offset_reset": "none",
    }
    if request_timeout_ms is not None:
        config["request_timeout_ms"] = request_timeout_ms
    if bootstrap_timeout_ms is not None:
        # Creating a consumer blocks until a broker answers; unbounded it would outlast the
        # caller's own deadline when the broker is down.
        config["bootstrap_timeout_ms"] = max(bootstrap_timeout_ms, 1)
    return config


def records_to_record_batch(records: Sequence[Any]) -> pa.RecordBatch:
    """Arrow rows in KAFKA_SCHEMA from kafka-python `ConsumerRecord`s."""
    headers_type = ARROW_SCHEMA.field("headers").type
    columns = [
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([r.topic for r in records], pa.string()),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        # Kafka timestamps are ms since the epoch; Spark's are us.
        pa.array([r.timestamp * 1000 for r in records], ARROW_SCHEMA.field("timestamp").type),
        # -1 is Kafka's NO_TIMESTAMP_TYPE, for records written without one.
        pa.array(
            [-1 if r.timestamp_type is None else r.timestamp_type for r in records], pa.int32()
        ),
        # Spark's Kafka source gives null, not an empty array, for a record without headers.
        pa.array([list(r.headers) if r.headers else None for r in records], headers_type),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """One Spark task: the offsets [start_offset, end_offset) of one Kafka partition."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    bootstrap_servers: str
    poll_timeout_ms: int
    request_timeout_ms: int | None


def read_partition(
    split: KafkaInputPartition, fault_hook: FaultHook = NO_FAULTS
) -> Iterator[pa.RecordBatch]:
    """Yield every record of `split` as Arrow batches of at most ARROW_BATCH_ROWS rows, or fail.

    Completion is judged by the consumer's position, not by counting records: offsets can
    have gaps (transaction markers, compaction). `poll_timeout_ms` bounds the time without any
    progress, connecting included, so a large range may take longer overall but a read against
    an unreachable broker fails. A read never ends early: returning fewer records than the
    range holds would lose them for good, because Spark commits the planned offsets.
    """
    where = (
        f"{split.topic}/{split.partition} offsets [{split.start_offset}, {split.end_offset}) "
        f"from bootstrap servers {split.bootstrap_servers}"
    )
    topic_partition = TopicPartition(split.topic, split.partition)
    # One deadline from the start: connecting to a broker that is down counts as no progress.
    progress_deadline = time.monotonic() + split.poll_timeout_ms / 1000
    try:
        consumer = KafkaConsumer(
            **consumer_config(
                split.bootstrap_servers,
                split.request_timeout_ms,
                client_id=f"{SOURCE_NAME}-reader-{split.topic}-{split.partition}",
                bootstrap_timeout_ms=split.poll_timeout_ms,
            ),
            max_poll_records=ARROW_BATCH_ROWS,
        )
    except KafkaError as error:
        raise KafkaUnavailableError(
            f"reading {where}: no broker answered within pollTimeoutMs "
            f"({split.poll_timeout_ms} ms): {error!r}"
        ) from error
    try:
        consumer.assign([topic_partition])
        consumer.seek(topic_partition, split.start_offset)
        position = split.start_offset
        pending: list[Any] = []
        while position < split.end_offset:
            remaining_ms = int((progress_deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                raise KafkaUnavailableError(
                    f"reading {where}: no progress for {split.poll_timeout_ms} ms "
                    f"(stuck at offset {position}); the broker is unreachable or no longer has "
                    "the range; raise pollTimeoutMs or check the broker"
                )
            try:
                polled = consumer.poll(timeout_ms=min(remaining_ms, 1_000))
                for record in polled.get(topic_partition, ()):
                    if split.start_offset <= record.offset < split.end_offset:
                        pending.append(record)
                new_position = consumer.position(topic_partition, timeout_ms=remaining_ms)
                fault_hook.reached(FaultPoint.KAFKA_READ, split.start_offset, split.end_offset - 1)
            except KafkaError as error:
                raise RuntimeError(f"reading {where} failed: {error!r}") from error
            if new_position is not None and new_position > position:
                position = new_position
                progress_deadline = time.monotonic() + split.poll_timeout_ms / 1000
            while len(pending) >= ARROW_BATCH_ROWS:
                yield records_to_record_batch(pending[:ARROW_BATCH_ROWS])
                pending = pending[ARROW_BATCH_ROWS:]
        if pending:
            yield records_to_record_batch(pending)
    finally:
        # Spark reuses Python workers: an unclosed consumer leaks its sockets into the next task.
        consumer.close(autocommit=False)


# ---------------------------------------------------------------------------------------------
# The Spark data source
# ---------------------------------------------------------------------------------------------


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches over one topic. Built on the driver, pickled to executors.

    The camelCase method names are Spark's API (hence the `noqa: N802`).
    """

    def __init__(self, options: KafkaSourceOptions, fault_hook: FaultHook = NO_FAULTS) -> None:
        self.options = options
        self.fault_hook = fault_hook
        # The driver-side consumer is created on first use: this object is also pickled to
        # executors, which never plan and must not open connections.
        self._consumer: KafkaConsumer | None = None
        # End offsets fixed by prepareForTriggerAvailableNow; None outside AvailableNow.
        self._available_now_end: dict[str, int] | None = None
        self._latest_seen: dict[str, int] | None = None
        self._initial_offset: dict[str, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_consumer"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._consumer = None

    # -- broker lookups (driver) ----------------------------------------------------------

    def _driver_consumer(self, budget_ms: int) -> KafkaConsumer:
        if self._consumer is None:
            self._consumer = KafkaConsumer(
                **consumer_config(
                    self.options.bootstrap_servers,
                    self.options.request_timeout_ms,
                    client_id=f"{SOURCE_NAME}-planner-{self.options.topic}",
                    bootstrap_timeout_ms=budget_ms,
                )
            )
        return self._consumer

    def _drop_driver_consumer(self) -> None:
        if self._consumer is not None:
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
        options = self.options
        deadline = time.monotonic() + options.fetch_offset_timeout_ms / 1000
        request_timeout_ms = options.request_timeout_ms or DEFAULT_REQUEST_TIMEOUT_MS
        attempts = 0
        while True:
            attempts += 1
            remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
            try:
                consumer = self._driver_consumer(remaining_ms)
                return lookup(consumer, min(request_timeout_ms, remaining_ms))
            except KafkaError as error:
                last_error: Exception = error
                # A new client after a failure bootstraps afresh instead of trusting the
                # connections and metadata it had before the outage.
                self._drop_driver_consumer()
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
            f"{options.bootstrap_servers} kept failing for {options.fetch_offset_timeout_ms} ms "
            f"(fetchOffset.timeoutMs, {attempts} attempts); last error: {last_error!r}. The query "
            "stops; once the broker is reachable, restart it: it resumes from its checkpoint."
        ) from last_error

    def _topic_partitions(self, consumer: KafkaConsumer) -> list[TopicPartition]:
        # topics() always refreshes metadata, so a topic that was created or grew is seen;
        # partitions_for_topic alone would answer from a cache that is minutes old.
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

    # -- DataSourceStreamReader -----------------------------------------------------------

    def initialOffset(self) -> dict[str, int]:  # noqa: N802
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

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        # AvailableNow must not chase records produced after the query started.
        self._available_now_end = self._end_offsets({})

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        if self._available_now_end is not None:
            latest = self._available_now_end
            # Fixed when the query started: a stale answer then cannot be retried away now.
            try:
                check_not_behind(start, latest, topic=self.options.topic)
            except BrokerBehindError as error:
                raise ValueError(str(error)) from None
        else:
            latest = self._end_offsets(start)
        self._latest_seen = latest
        end = advance_offsets(start, latest, max_rows_of(limit), topic=self.options.topic)
        new_keys = [key for key in latest if key not in start]
        if new_keys:
            new_partitions = [TopicPartition(self.options.topic, int(k)) for k in new_keys]
            beginnings = self._ask_broker(
                "fetching beginning offsets of new partitions",
                lambda consumer, timeout_ms: self._broker_offsets(
                    consumer, "beginning", new_partitions, timeout_ms
                ),
            )
            end = register_new_partitions(end, normalise_offsets(beginnings))
        return end

    def reportLatestOffset(self) -> dict[str, int] | None:  # noqa: N802
        # The end offsets latestOffset just fetched: asking the broker again would cost a
        # round trip per batch for a number that only feeds the progress report.
        return self._latest_seen

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[KafkaInputPartition]:
        return [
            KafkaInputPartition(
                topic=self.options.topic,
                partition=partition,
                start_offset=start_offset,
                end_offset=end_offset,
                bootstrap_servers=self.options.bootstrap_servers,
                poll_timeout_ms=self.options.poll_timeout_ms,
                request_timeout_ms=self.options.request_timeout_ms,
            )
            for partition, start_offset, end_offset in partition_ranges(start, end)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KafkaInputPartition):
            raise TypeError(f"expected a KafkaInputPartition, got {type(partition).__name__}")
        return read_partition(partition, self.fault_hook)

    def commit(self, end: dict[str, int]) -> None:
        # Nothing to do: the offsets live in Spark's checkpoint, which is the only truth a
        # restart uses. Committing them to a consumer group too would add a second, possibly
        # disagreeing, record of progress.
        return None

    def stop(self) -> None:
        self._drop_driver_consumer()


class KafkaDataSource(DataSource):
    """`spark.readStream.format("tw_kafka")`: one Kafka topic, Spark Kafka source columns."""

    fault_hook: FaultHook = NO_FAULTS

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:  # noqa: N802
        if schema != KAFKA_SCHEMA:
            raise ValueError(
                f"{SOURCE_NAME} has a fixed schema ({KAFKA_SCHEMA.simpleString()}); "
                f"got {schema.simpleString()}"
            )
        return KafkaStreamReader(KafkaSourceOptions.from_options(self.options), self.fault_hook)


def register(spark: SparkSession, fault_hook: FaultHook = NO_FAULTS) -> None:
    """Make `format("tw_kafka")` available in `spark`, reading with `fault_hook` installed."""
    if fault_hook is NO_FAULTS:
        spark.dataSource.register(KafkaDataSource)
        return

    # Spark builds the source from its class alone (options are strings), so the hook travels
    # as a class attribute of a local subclass, which cloudpickle ships by value.
    class HookedKafkaDataSource(KafkaDataSource):
        pass

    HookedKafkaDataSource.fault_hook = fault_hook
    spark.dataSource.register(HookedKafkaDataSource)
