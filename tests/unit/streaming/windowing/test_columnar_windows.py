"""Keys advanced together as columns agree with the record-by-record reference, bit for bit.

Several keys with the same rules get random records, cut into the same random micro-batches.
`columnar_windows.advance_bucket` runs them all at once from the bucket's state (through its
bytes between batches, as Spark's state store keeps it); `windowing.advance` runs each key
alone. Every batch must give each key the same placements, too-late records, panes (metrics to
the last bit) and state.
"""

from __future__ import annotations

import itertools
import json
from typing import Any
from unittest.mock import patch

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streaming.state.bucket_state import BucketState
from streaming.windowing import columnar_windows
from streaming.windowing.columnar_windows import (
    BucketAdvance,
    RecordColumns,
    advance_bucket,
    handles_window,
    metric_names,
)
from streaming.windowing.key_state import KeyState, RecordInput
from streaming.windowing.key_windows import BatchResult, advance
from tenants.models import WindowRules, rules_id
from tests.support.windowing_reference import METRIC_CATALOG

fixed_windows = st.one_of(
    st.builds(lambda size: {"kind": "tumbling", "size": size}, st.sampled_from([1000, 3000])),
    st.builds(
        lambda slide, factor: {"kind": "sliding", "size": slide * factor, "slide": slide},
        st.sampled_from([500, 1000]),
        st.integers(1, 4),
    ),
)
rule_sets = st.builds(
    lambda window, ooo, lateness, accumulation, emit, metrics, idle: WindowRules.model_validate(
        {
            "window": window,
            "out_of_orderness": ooo,
            "allowed_lateness": lateness,
            "accumulation": accumulation,
            "emit": emit,
            "metrics": {name: METRIC_CATALOG[name] for name in metrics},
            "idle_timeout": idle,
        }
    ),
    fixed_windows,
    st.sampled_from([0, 500, 2000]),
    st.sampled_from([0, 1000, 4000]),
    st.sampled_from(["accumulating", "discarding"]),
    st.sampled_from(["every_pane", "final_only"]),
    st.lists(st.sampled_from(sorted(METRIC_CATALOG)), unique=True, max_size=4),
    st.sampled_from([None, 5000]),
)
# Amounts that make a sum's order visible in its last bits, and signed zeros for min and max.
amounts = st.one_of(
    st.none(),
    st.sampled_from([0.1, 0.2, 0.3, -0.0, 0.0, 1e16, -1e16, 1.5, 1e308]),
    st.floats(-1e6, 1e6, allow_nan=False),
)
records = st.lists(
    st.tuples(st.integers(-2500, 3000), st.sampled_from(["ERROR", "INFO"]), amounts),
    min_size=1,
    max_size=60,
)
keyed_records = st.lists(records, min_size=1, max_size=4)


def _metric_inputs(rules: WindowRules, level: str, amount: float | None) -> list[float | None]:
    values: list[float | None] = []
    for spec in rules.metrics.values():
        if spec.field is None:
            values.append(1.0)
        elif spec.field == "level":
            values.append(1.0 if level == spec.equals else 0.0)
        else:
            values.append(amount)
    return values


def _reference_rows(result: BatchResult) -> list[list[tuple[Any, ...]]]:
    return [
        [
            (
                a.record_index,
                a.window_id,
                a.window_start_ms,
                a.window_end_ms,
                a.pane_index,
                a.timing.value == "LATE",
            )
            for a in result.assignments
        ],
        [
            (t.record_index, t.window_start_ms, t.window_end_ms, t.watermark_ms)
            for t in result.too_late
        ],
        [
            (
                p.window_id,
                p.window_start_ms,
                p.window_end_ms,
                p.pane_index,
                p.timing.value == "LATE",
                p.is_final,
                p.count,
                json.dumps(p.metrics, sort_keys=True),
                p.watermark_ms,
                p.merged_window_ids,
            )
            for p in result.panes
        ],
    ]


def _bucket_rows(
    result: BucketAdvance, key: int, first_record: np.ndarray, names: list[str]
) -> list[list[tuple[Any, ...]]]:
    """Key `key`'s rows of a bucket's result, with record numbers counted within the key."""
    placed, rejected, panes = result.placements, result.rejections, result.panes
    record_key = np.searchsorted(first_record, np.arange(first_record[-1]), side="right") - 1
    mine = record_key[placed.record_index] == key
    too_late = record_key[rejected.record_index] == key
    pane_rows = panes.key == key
    # As the `windows` table holds them: a map per pane, compared as the reference's JSON.
    metrics = [
        json.dumps(dict(entries), sort_keys=True)
        for entries in panes.metrics_map(names).to_pylist()
    ]
    return [
        [
            (r - int(first_record[key]), f"{s}-{e}", s, e, pane, late)
            for r, s, e, pane, late in zip(
                placed.record_index[mine].tolist(),
                placed.window_start_ms[mine].tolist(),
                placed.window_end_ms[mine].tolist(),
                placed.pane_index[mine].tolist(),
                placed.late[mine].tolist(),
                strict=True,
            )
        ],
        [
            (r - int(first_record[key]), s, e, w)
            for r, s, e, w in zip(
                rejected.record_index[too_late].tolist(),
                rejected.window_start_ms[too_late].tolist(),
                rejected.window_end_ms[too_late].tolist(),
                rejected.watermark_ms[too_late].tolist(),
                strict=True,
            )
        ],
        [
            (f"{s}-{e}", s, e, pane, late, final, count, metrics[n], watermark, ())
            for n, s, e, pane, late, final, count, watermark in zip(
                np.flatnonzero(pane_rows).tolist(),
                panes.window_start_ms[pane_rows].tolist(),
                panes.window_end_ms[pane_rows].tolist(),
                panes.pane_index[pane_rows].tolist(),
                panes.late[pane_rows].tolist(),
                panes.is_final[pane_rows].tolist(),
                panes.count[pane_rows].tolist(),
                panes.watermark_ms[pane_rows].tolist(),
                strict=True,
            )
        ],
    ]


def _state_json(state: KeyState) -> str:
    """The state as the reference keeps it, keys sorted, floats to the last bit."""
    return json.dumps(state.to_json_dict(), sort_keys=True)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    rules=rule_sets,
    streams=keyed_records,
    cut_seed=st.integers(0, 2**32 - 1),
    fold_by_window=st.booleans(),
)
def test_keys_advanced_together_match_the_reference_key_by_key(
    rules: WindowRules,
    streams: list[list[tuple[int, str, float | None]]],
    cut_seed: int,
    fold_by_window: bool,
) -> None:
    # Both ways of folding a window's values: a position at a time across windows (short
    # windows), and a window at a time (long ones, as at 10 tenants).
    with patch.object(columnar_windows._Fold, "by_window_only", fold_by_window):
        _check_against_the_reference(rules, streams, cut_seed)


def _check_against_the_reference(
    rules: WindowRules, streams: list[list[tuple[int, str, float | None]]], cut_seed: int
) -> None:
    current_rules_id = rules_id(rules)
    names = metric_names(rules)
    keys = [(f"t{number}", "web") for number in range(len(streams))]
    rng = np.random.default_rng(cut_seed)
    event_times = [
        [1_000_000 + int(move) + 5000 for move in np.cumsum([offset for offset, _, _ in stream])]
        for stream in streams
    ]
    # The same cut points, as fractions, for every key: a batch holds a slice of each.
    fractions = sorted({0.0, 1.0, *rng.random(3).tolist()})
    references = [KeyState() for _ in keys]
    blob: bytes | None = None
    now_ms = 2_000_000
    for low, high in itertools.pairwise(fractions):
        now_ms += int(rng.choice([1000, 6000]))
        slices = [range(int(low * len(stream)), int(high * len(stream))) for stream in streams]
        inputs = [
            [_metric_inputs(rules, stream[i][1], stream[i][2]) for i in batch]
            for stream, batch in zip(streams, slices, strict=True)
        ]
        expected = [
            _reference_rows(
                advance(
                    reference,
                    [
                        RecordInput(times[i], dict(zip(rules.metrics, values, strict=True)))
                        for i, values in zip(batch, key_inputs, strict=True)
                    ],
                    rules,
                    now_ms,
                    current_rules_id,
                )
            )
            for reference, times, batch, key_inputs in zip(
                references, event_times, slices, inputs, strict=True
            )
        ]

        bucket = BucketState.from_bytes(blob)
        usable, positions = bucket.column_keys(keys, [current_rules_id] * len(keys))
        assert usable.all()
        columns = bucket.take_columns(keys, positions, len(names))
        order = [list(rules.metrics).index(name) for name in names]
        rows = [values for key_inputs in inputs for values in key_inputs]
        matrix = np.array(rows, dtype=np.float64).reshape(len(rows), len(order))[:, order]
        first_record = np.cumsum([0, *(len(batch) for batch in slices)])
        result = advance_bucket(
            columns,
            RecordColumns(
                np.repeat(np.arange(len(keys)), [len(batch) for batch in slices]),
                np.array(
                    [
                        times[i]
                        for times, batch in zip(event_times, slices, strict=True)
                        for i in batch
                    ],
                    dtype=np.int64,
                ),
                matrix,
            ),
            rules,
            now_ms,
        )
        bucket.put_columns(result.keys, current_rules_id, rules.model_dump(mode="json"))
        blob = bucket.to_bytes()
        stored = BucketState.from_bytes(blob)
        for number, key in enumerate(keys):
            assert _bucket_rows(result, number, first_record, names) == expected[number], key
            assert _state_json(stored.get(key).key_state) == _state_json(references[number]), key


def _rules(window: dict[str, object]) -> WindowRules:
    return WindowRules.model_validate(
        {"window": window, "out_of_orderness": 0, "allowed_lateness": 0}
    )


def test_sessions_and_keys_with_windows_of_other_rules_are_left_to_the_reference() -> None:
    tumbling = _rules({"kind": "tumbling", "size": 1000})
    state = KeyState()
    advance(state, [RecordInput(5_000)], tumbling, 10_000, rules_id(tumbling))
    bucket = BucketState()
    bucket.get(("acme", "web")).key_state = state
    stored = BucketState.from_bytes(bucket.to_bytes())
    wider = _rules({"kind": "tumbling", "size": 2000})
    keys = [("acme", "web"), ("acme", "web"), ("new", "web")]
    usable, positions = stored.column_keys(
        keys, [rules_id(tumbling), rules_id(wider), rules_id(wider)]
    )
    assert usable.tolist() == [True, False, True]
    assert positions.tolist() == [0, 0, -1]
    assert handles_window(tumbling)
    assert not handles_window(_rules({"kind": "session", "gap": 1000}))


@given(
    st.lists(st.lists(st.integers(-(2**61), 2**61), min_size=1, max_size=8), min_size=1, max_size=5)
)
def test_the_running_maximum_restarts_at_each_key_even_for_times_centuries_apart(
    keys: list[list[int]],
) -> None:
    values = np.array([value for key in keys for value in key], dtype=np.int64)
    firsts = np.cumsum([0, *(len(key) for key in keys[:-1])])
    expected = [running for key in keys for running in itertools.accumulate(key, max)]
    assert columnar_windows._running_max_per_key(values, firsts).tolist() == expected
