"""The Kafka source's offset arithmetic, without a broker or Spark."""

from __future__ import annotations

import itertools
import json
import pickle
import random

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from streaming.kafka.offsets import (
    BrokerBehindError,
    advance_offsets,
    check_not_behind,
    max_rows_of,
    normalise_offsets,
    partition_ranges,
    register_new_partitions,
    resolve_starting_offsets,
    split_budget,
    split_ranges,
)
from streaming.kafka.options import (
    EARLIEST,
    LATEST,
    KafkaSourceOptions,
    StartingOffsets,
    parse_starting_offsets,
)
from streaming.kafka.source import KafkaStreamReader

BASE_OPTIONS = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "events"}


# -- normalise_offsets ---------------------------------------------------------------------


def test_normalise_offsets_sorts_keys_numerically_as_strings() -> None:
    offsets = normalise_offsets({"10": 5, "2": 7, "0": 1})
    assert list(offsets) == ["0", "2", "10"]
    assert offsets == {"0": 1, "2": 7, "10": 5}
    assert normalise_offsets({3: 1, 1: 2}) == {"1": 2, "3": 1}


def test_normalise_offsets_gives_the_same_json_for_any_key_order() -> None:
    a = normalise_offsets({"1": 3, "0": 4, "11": 0})
    b = normalise_offsets(json.loads(json.dumps({"11": 0, "0": 4, "1": 3})))
    assert json.dumps(a) == json.dumps(b)


@pytest.mark.parametrize(
    "offsets",
    [{"x": 1}, {"-1": 1}, {"0": -3}, {"0": 1.5}, {"0": True}, {"0": "7"}],
)
def test_normalise_offsets_rejects_garbage(offsets: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        normalise_offsets(offsets)  # type: ignore[arg-type]


# -- split_budget ----------------------------------------------------------------------------


def test_split_budget_is_proportional_and_exact() -> None:
    shares = split_budget({"0": 1000, "1": 1000, "2": 1000}, 500)
    assert shares == {"0": 167, "1": 167, "2": 166}
    assert sum(shares.values()) == 500


def test_split_budget_gives_everything_when_it_fits() -> None:
    assert split_budget({"0": 3, "1": 0, "2": 4}, 500) == {"0": 3, "1": 0, "2": 4}


def test_split_budget_never_starves_with_a_budget_of_one() -> None:
    shares = split_budget({"0": 5, "1": 7}, 1)
    assert sum(shares.values()) == 1


def test_split_budget_treats_negative_lag_as_none() -> None:
    assert split_budget({"0": -4, "1": 10}, 5) == {"0": 0, "1": 5}


def test_split_budget_rejects_a_non_positive_budget() -> None:
    with pytest.raises(ValueError, match="budget"):
        split_budget({"0": 1}, 0)


def test_split_budget_bound_fairness_and_determinism_on_random_lags() -> None:
    rng = random.Random(1234)
    for _ in range(2_000):
        lags = {str(p): rng.choice([0, 1, 2, rng.randrange(1_000_000)]) for p in range(7)}
        budget = rng.randrange(1, 5_000)
        shares = split_budget(lags, budget)
        total_lag = sum(lags.values())
        assert list(shares) == [str(p) for p in range(7)]
        assert sum(shares.values()) == min(budget, total_lag)
        for key, lag in lags.items():
            assert 0 <= shares[key] <= lag
            if total_lag > budget:
                # Largest-remainder rounding: within one offset of the exact proportional share.
                exact = budget * lag / total_lag
                assert abs(shares[key] - exact) < 1
        assert split_budget(dict(reversed(list(lags.items()))), budget) == shares


# -- advance_offsets, register_new_partitions, partition_ranges --------------------------------


def test_advance_offsets_reads_all_available_without_a_limit() -> None:
    end = advance_offsets({"1": 5, "0": 10}, {"0": 20, "1": 5, "2": 9}, None, topic="t")
    # Partition 2 is new: advance_offsets leaves it to register_new_partitions.
    assert end == {"0": 20, "1": 5}
    assert list(end) == ["0", "1"]


def test_advance_offsets_honours_the_row_budget() -> None:
    start = {"0": 0, "1": 100, "2": 0}
    end = advance_offsets(start, {"0": 900, "1": 200, "2": 0}, 500, topic="t")
    advanced = {k: end[k] - start[k] for k in start}
    assert sum(advanced.values()) == 500
    assert advanced == {"0": 450, "1": 50, "2": 0}


def test_advance_offsets_returns_start_unchanged_when_there_is_nothing_new() -> None:
    start = {"0": 7, "1": 3}
    end = advance_offsets(start, {"1": 3, "0": 7}, 500, topic="t")
    assert json.dumps(end) == json.dumps(normalise_offsets(start))


def test_advance_offsets_keeps_partitions_the_broker_no_longer_reports() -> None:
    assert advance_offsets({"0": 4, "1": 2}, {"0": 6}, None, topic="t") == {"0": 6, "1": 2}


def test_advance_offsets_fails_loudly_when_offsets_go_backwards() -> None:
    with pytest.raises(ValueError, match=r"t/0 went back from at least 50 to 10"):
        advance_offsets({"0": 50}, {"0": 10}, None, topic="t")


def test_check_not_behind_accepts_new_partitions_and_growth() -> None:
    check_not_behind({"0": 4}, {"0": 4, "1": 0}, topic="t")
    check_not_behind({"0": 4, "1": 2}, {"0": 9, "1": 2}, topic="t")
    check_not_behind({}, {}, topic="t")


@pytest.mark.parametrize(
    ("latest", "message"),
    [
        ({"0": 6}, r"partitions \['1'\] of t are in the checkpoint but the broker does not list"),
        ({"0": 3, "1": 2}, r"t/0 went back from at least 4 to 3"),
        ({}, r"partitions \['0', '1'\] of t"),
    ],
)
def test_check_not_behind_rejects_a_broker_behind_the_checkpoint(
    latest: dict[str, int], message: str
) -> None:
    # A restarting broker can answer like this for a moment; the reader retries, then fails.
    with pytest.raises(BrokerBehindError, match=message):
        check_not_behind({"0": 4, "1": 2}, latest, topic="t")


def test_repeated_budgets_drain_every_partition_exactly() -> None:
    latest = {"0": 1234, "1": 17, "2": 999}
    offsets = {"0": 0, "1": 0, "2": 0}
    for _ in range(100):
        following = advance_offsets(offsets, latest, 100, topic="t")
        if following == offsets:
            break
        assert 0 < sum(following[k] - offsets[k] for k in offsets) <= 100
        offsets = following
    assert offsets == latest


def test_register_new_partitions_adds_them_at_their_beginning_only() -> None:
    merged = register_new_partitions({"1": 40, "0": 12}, {"1": 0, "2": 5, "10": 0})
    assert merged == {"0": 12, "1": 40, "2": 5, "10": 0}
    assert list(merged) == ["0", "1", "2", "10"]


def test_partition_ranges_skip_empty_and_newly_registered_partitions() -> None:
    start = {"0": 10, "1": 5}
    end = {"0": 20, "1": 5, "2": 3}
    assert partition_ranges(start, end) == [(0, 10, 20)]


def test_split_ranges_keeps_one_task_per_partition_without_min_partitions() -> None:
    ranges = [(0, 10, 20), (1, 0, 5)]
    assert split_ranges(ranges, None) == ranges
    assert split_ranges(ranges, 2) == ranges


def test_split_ranges_cuts_in_proportion_to_size_like_spark() -> None:
    # One partition on a two-core machine: two tasks instead of one idle core.
    assert split_ranges([(0, 100, 201)], 2) == [(0, 100, 150), (0, 150, 201)]
    # Shares follow the ranges' sizes, rounded (3.6 -> 4); every range keeps at least one piece.
    assert split_ranges([(0, 0, 90), (1, 0, 10)], 4) == [
        (0, 0, 22),
        (0, 22, 44),
        (0, 44, 67),
        (0, 67, 90),
        (1, 0, 10),
    ]
    # A range is never cut into empty pieces.
    assert split_ranges([(3, 7, 9)], 5) == [(3, 7, 8), (3, 8, 9)]


def test_split_ranges_cover_every_offset_once_in_contiguous_pieces() -> None:
    rng = random.Random(5)
    for _ in range(500):
        ranges = []
        for partition in range(rng.randint(1, 4)):
            start = rng.randint(0, 1_000)
            ranges.append((partition, start, start + rng.randint(1, 5_000)))
        min_partitions = rng.randint(1, 12)
        pieces = split_ranges(ranges, min_partitions)
        for partition, start, end in ranges:
            own = [(s, e) for p, s, e in pieces if p == partition]
            assert own[0][0] == start and own[-1][1] == end
            assert all(s < e for s, e in own)
            assert all(a[1] == b[0] for a, b in itertools.pairwise(own))
            # Nearly equal pieces: Spark's readers then finish at about the same time.
            sizes = [e - s for s, e in own]
            assert max(sizes) - min(sizes) <= 1
        assert len(pieces) >= min(min_partitions, sum(e - s for _, s, e in ranges)) - len(ranges)


def test_max_rows_of_read_limits() -> None:
    assert max_rows_of(ReadAllAvailable()) is None
    assert max_rows_of(ReadMaxRows(500)) == 500
    with pytest.raises(ValueError, match="ReadMinRows"):
        max_rows_of(ReadMinRows(5))


# -- startingOffsets ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, StartingOffsets(every_partition=LATEST)),
        ("", StartingOffsets(every_partition=LATEST)),
        ("earliest", StartingOffsets(every_partition=EARLIEST)),
        (" Latest ", StartingOffsets(every_partition=LATEST)),
        (
            '{"events": {"1": -2, "0": 23, "2": -1}}',
            StartingOffsets(every_partition=None, per_partition=((0, 23), (1, -2), (2, -1))),
        ),
    ],
)
def test_parse_starting_offsets(text: str | None, expected: StartingOffsets) -> None:
    assert parse_starting_offsets(text, "events") == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", r"startingOffsets must be 'earliest', 'latest' or JSON"),
        ("earliset", r"startingOffsets must be 'earliest', 'latest' or JSON"),
        ("[1, 2]", r"must map a topic to"),
        ('{"events": 5}', r"must map a topic to"),
        ('{"other": {"0": 1}}', r"not subscribed"),
        ("{}", r"no entry for the subscribed topic 'events'"),
        ('{"events": {"zero": 1}}', r"partition must be a non-negative integer"),
        ('{"events": {"0": -3}}', r"events/0 must be an offset >= 0"),
        ('{"events": {"0": "5"}}', r"events/0 must be an offset >= 0"),
        ('{"events": {"0": true}}', r"events/0 must be an offset >= 0"),
    ],
)
def test_parse_starting_offsets_rejects_bad_input_clearly(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_starting_offsets(text, "events")


def test_resolve_earliest_and_latest() -> None:
    beginning, end = {0: 3, 1: 0}, {0: 10, 1: 8}
    earliest = resolve_starting_offsets(StartingOffsets(EARLIEST), "t", beginning, end)
    latest = resolve_starting_offsets(StartingOffsets(LATEST), "t", beginning, end)
    assert earliest == {"0": 3, "1": 0}
    assert latest == {"0": 10, "1": 8}


def test_resolve_of_a_missing_topic_is_empty() -> None:
    assert resolve_starting_offsets(StartingOffsets(EARLIEST), "t", {}, {}) == {}


def test_resolve_specific_offsets_with_markers() -> None:
    spec = parse_starting_offsets('{"t": {"0": 5, "1": -2, "2": -1}}', "t")
    resolved = resolve_starting_offsets(spec, "t", {0: 0, 1: 4, 2: 0}, {0: 9, 1: 9, 2: 7})
    assert resolved == {"0": 5, "1": 4, "2": 7}


def test_resolve_specific_offsets_must_name_every_partition() -> None:
    spec = parse_starting_offsets('{"t": {"0": 5, "3": 1}}', "t")
    with pytest.raises(ValueError, match=r"missing \[1\], not in the topic \[3\]"):
        resolve_starting_offsets(spec, "t", {0: 0, 1: 0}, {0: 9, 1: 9})


def test_resolve_specific_offset_outside_the_log_is_an_error() -> None:
    spec = parse_starting_offsets('{"t": {"0": 50}}', "t")
    with pytest.raises(ValueError, match=r"t/0 is outside the available range \[0, 9\]"):
        resolve_starting_offsets(spec, "t", {0: 0}, {0: 9})


# -- options and pickling ----------------------------------------------------------------------


def test_options_use_spark_names_case_insensitively() -> None:
    options = KafkaSourceOptions.from_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9092",
            "subscribe": "events",
            "STARTINGOFFSETS": "earliest",
            "maxOffsetsPerTrigger": "500",
            "pollTimeoutMs": "1000",
            "kafka.request.timeout.ms": "5000",
            "FETCHOFFSET.timeoutMs": "7000",
            "fetchOffset.retryIntervalMs": "50",
            "minpartitions": "8",
            "triggerIntervalMs": "1000",
            "TRIGGERPHASEMS": "250",
        }
    )
    assert options == KafkaSourceOptions(
        bootstrap_servers="127.0.0.1:9092",
        topic="events",
        starting_offsets=StartingOffsets(EARLIEST),
        max_offsets_per_trigger=500,
        poll_timeout_ms=1000,
        request_timeout_ms=5000,
        fetch_offset_timeout_ms=7000,
        fetch_offset_retry_interval_ms=50,
        min_partitions=8,
        trigger_interval_ms=1000,
        trigger_phase_ms=250,
    )


def test_options_defaults() -> None:
    options = KafkaSourceOptions.from_options(BASE_OPTIONS)
    assert options.starting_offsets == StartingOffsets(LATEST)
    assert options.max_offsets_per_trigger is None
    assert options.poll_timeout_ms == 120_000
    assert options.request_timeout_ms is None
    # A broker outage fails a read or an offset lookup after about the same time.
    assert options.fetch_offset_timeout_ms == 120_000
    assert options.fetch_offset_retry_interval_ms == 500
    assert options.min_partitions is None
    # No trigger given: a batch takes its end offsets when Spark asks.
    assert (options.trigger_interval_ms, options.trigger_phase_ms) == (None, 0)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"subscribe": "a,b"}, "exactly one topic"),
        ({"subscribe": ""}, "exactly one topic"),
        ({"kafka.bootstrap.servers": " "}, "kafka.bootstrap.servers is required"),
        ({"subscribePattern": "e.*"}, "not supported"),
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger must be a positive integer"),
        ({"maxOffsetsPerTrigger": "lots"}, "maxOffsetsPerTrigger must be a positive integer"),
        ({"fetchOffset.timeoutMs": "-1"}, "fetchOffset.timeoutMs must be a positive integer"),
        ({"minPartitions": "0"}, "minPartitions must be a positive integer"),
        ({"startingOffsets": '{"events": '}, "startingOffsets must be"),
        ({"triggerPhaseMs": "-5"}, "triggerPhaseMs must be a non-negative integer"),
        ({"triggerPhaseMs": "250"}, r"triggerPhaseMs \(250\) needs a longer triggerIntervalMs"),
        (
            {"triggerIntervalMs": "250", "triggerPhaseMs": "250"},
            r"triggerPhaseMs \(250\) needs a longer triggerIntervalMs; got 250",
        ),
    ],
)
def test_options_reject_bad_values(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KafkaSourceOptions.from_options({**BASE_OPTIONS, **extra})


def test_default_read_limit_follows_max_offsets_per_trigger() -> None:
    limited = KafkaStreamReader(
        KafkaSourceOptions.from_options({**BASE_OPTIONS, "maxOffsetsPerTrigger": "500"})
    )
    unlimited = KafkaStreamReader(KafkaSourceOptions.from_options(BASE_OPTIONS))
    assert limited.getDefaultReadLimit() == ReadMaxRows(500)
    assert unlimited.getDefaultReadLimit() == ReadAllAvailable()


def test_reader_pickles_without_a_consumer() -> None:
    reader = KafkaStreamReader(KafkaSourceOptions.from_options(BASE_OPTIONS))
    reader.planner._consumer = object()  # type: ignore[assignment]  # stands in for a live client
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.planner._consumer is None
    assert copy.options == reader.options
    assert reader.planner._consumer is not None  # the original keeps its client


def test_budget_split_covers_small_partition_counts_exhaustively() -> None:
    for lags in itertools.product(range(5), repeat=3):
        as_dict = {str(p): lag for p, lag in enumerate(lags)}
        for budget in range(1, 8):
            shares = split_budget(as_dict, budget)
            assert sum(shares.values()) == min(budget, sum(lags))
            assert all(0 <= shares[k] <= as_dict[k] for k in as_dict)
