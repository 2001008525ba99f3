"""The columnar hot path agrees with the record-by-record reference, bit for bit.

`columnar_windowing.advance_columns` and `windowing.advance` get the same key's records, cut into
the same random micro-batches, each from its own copy of the state (round-tripped through JSON
between batches, as the bucket state stores it). Every batch must give the same placements,
too-late records, panes (metrics to the last bit) and state.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streaming.columnar_windowing import ColumnarResult, advance_columns, handles
from streaming.windowing import BatchResult, KeyState, RecordInput, advance
from tenants.models import WindowRules, rules_id
from tests.test_windowing_properties import METRIC_CATALOG

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


def _reference_rows(result: BatchResult) -> tuple[list[tuple[object, ...]], ...]:
    return (
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
    )


def _columnar_rows(result: ColumnarResult) -> tuple[list[tuple[object, ...]], ...]:
    placed, rejected = result.placements, result.rejections
    return (
        list(
            zip(
                placed.record_index.tolist(),
                placed.window_id.tolist(),
                placed.window_start_ms.tolist(),
                placed.window_end_ms.tolist(),
                placed.pane_index.tolist(),
                placed.late.tolist(),
                strict=True,
            )
        ),
        list(
            zip(
                rejected.record_index.tolist(),
                rejected.window_start_ms.tolist(),
                rejected.window_end_ms.tolist(),
                rejected.watermark_ms.tolist(),
                strict=True,
            )
        ),
    )


def _state_json(state: KeyState) -> str:
    """The state as stored, keys sorted: which window a dict holds first does not matter."""
    return json.dumps(state.to_json_dict(), sort_keys=True)


def _same(left: object, right: object) -> bool:
    """Equality where NaN equals NaN and -0.0 differs from 0.0: bit for bit."""
    return repr(left) == repr(right)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules=rule_sets, stream=records, cut_seed=st.integers(0, 2**32 - 1))
def test_columnar_advance_matches_the_reference(
    rules: WindowRules, stream: list[tuple[int, str, float | None]], cut_seed: int
) -> None:
    current_rules_id = rules_id(rules)
    rng = np.random.default_rng(cut_seed)
    base_ms = 1_000_000
    moves = np.cumsum([offset for offset, _, _ in stream])
    event_times = [base_ms + int(move) + 5000 for move in moves]
    cuts = sorted({0, len(stream), *rng.integers(0, len(stream), size=3).tolist()})
    reference_state, columnar_state = KeyState(), KeyState()
    now_ms = 2_000_000
    for first, last in itertools.pairwise(cuts):
        now_ms += int(rng.choice([1000, 6000]))
        batch = list(range(first, last))
        inputs = [_metric_inputs(rules, stream[i][1], stream[i][2]) for i in batch]
        reference = advance(
            reference_state,
            [
                RecordInput(event_times[i], dict(zip(rules.metrics, values, strict=True)))
                for i, values in zip(batch, inputs, strict=True)
            ],
            rules,
            now_ms,
            current_rules_id,
        )
        assert handles(columnar_state, rules, current_rules_id)
        columnar = advance_columns(
            columnar_state,
            np.array([event_times[i] for i in batch], dtype=np.int64),
            np.array(inputs, dtype=np.float64).reshape(len(batch), len(rules.metrics)),
            rules,
            now_ms,
            current_rules_id,
        )
        assert _columnar_rows(columnar) == _reference_rows(reference)
        assert _same(columnar.panes, reference.panes)
        assert _state_json(columnar_state) == _state_json(reference_state)
        reference_state = KeyState.from_json_dict(reference_state.to_json_dict())
        columnar_state = KeyState.from_json_dict(columnar_state.to_json_dict())


def _rules(window: dict[str, object]) -> WindowRules:
    return WindowRules.model_validate(
        {"window": window, "out_of_orderness": 0, "allowed_lateness": 0}
    )


def test_sessions_and_keys_with_windows_of_other_rules_are_left_to_the_reference() -> None:
    tumbling = _rules({"kind": "tumbling", "size": 1000})
    state = KeyState()
    advance(state, [RecordInput(5_000)], tumbling, 10_000, rules_id(tumbling))
    wider = _rules({"kind": "tumbling", "size": 2000})
    session = _rules({"kind": "session", "gap": 1000})
    assert handles(state, tumbling, rules_id(tumbling))
    assert not handles(state, wider, rules_id(wider))
    assert not handles(KeyState(), session, rules_id(session))
