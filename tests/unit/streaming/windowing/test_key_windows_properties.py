"""Property tests: streaming windowing, cut into random micro-batches, against a reference.

Random multi-tenant streams (several keys interleaved, out-of-order, late and too-late records)
go through `streaming.windowing.key_windows.advance` with random micro-batch boundaries, one `KeyState` per
key, round-tripped through JSON between batches because Spark stores it as JSON. What contract
§4 says cannot depend on batch boundaries is compared with `tests/support/windowing_reference.py`,
a one-pass model written from docs/contract.md alone: classifications, records per window, final
panes and their totals. Two batchings of one stream must agree too. For fixed windows the pane
schedule of contract §4 is checked pane by pane, since it follows from the batching alone.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from streaming.windowing.key_state import KeyState, RecordInput, Timing
from streaming.windowing.key_windows import Pane, advance
from tenants.models import Accumulation, Emit, MetricKind, SessionWindow, WindowRules
from tests.support.windowing_reference import (
    METRIC_CATALOG,
    MetricValues,
    RefRecord,
    RefResult,
    RefTiming,
    aggregate,
    fixed_window_id,
    metric_input,
    run_reference,
)

DAY_MS = 86_400_000
KEYS = ("acme/web", "globex/web", "initech/app")
# How a record's event time is drawn relative to the newest one of its key (see `scenarios`).
MOVES = ("forward", "jitter", "late", "too_late")


# ---------------------------------------------------------------------------------------------
# Scenarios


@dataclass(frozen=True)
class Scenario:
    rules: WindowRules
    # Arrival order across keys; each key's records keep their relative order.
    stream: tuple[tuple[str, RefRecord], ...]
    # Two batchings of the same stream: a cut at p starts a new micro-batch at stream[p].
    cuts_a: frozenset[int]
    cuts_b: frozenset[int]

    def records_of(self, key: str) -> list[RefRecord]:
        return [record for k, record in self.stream if k == key]

    @property
    def keys(self) -> list[str]:
        return sorted({key for key, _ in self.stream})


window_specs = st.one_of(
    st.builds(lambda size: {"kind": "tumbling", "size": size}, st.sampled_from([1000, 2000, 5000])),
    st.builds(
        lambda slide, factor: {"kind": "sliding", "size": slide * factor, "slide": slide},
        st.sampled_from([1000, 2000]),
        st.integers(1, 4),
    ),
    st.builds(lambda gap: {"kind": "session", "gap": gap}, st.sampled_from([1000, 2500, 5000])),
)


@st.composite
def window_rules(draw: st.DrawFn) -> WindowRules:
    metric_names = draw(st.sets(st.sampled_from(sorted(METRIC_CATALOG))))
    return WindowRules.model_validate(
        {
            "window": draw(window_specs),
            "out_of_orderness": draw(st.sampled_from([0, 500, 1000, 3000])),
            "allowed_lateness": draw(st.sampled_from([0, 1000, 2000, 5000])),
            "accumulation": draw(st.sampled_from(list(Accumulation))),
            "emit": draw(st.sampled_from(list(Emit))),
            "metrics": {name: METRIC_CATALOG[name] for name in sorted(metric_names)},
        }
    )


def window_span_ms(rules: WindowRules) -> int:
    if isinstance(rules.window, SessionWindow):
        return rules.window.gap_ms
    return rules.window.size_ms


@st.composite
def record_fields(draw: st.DrawFn) -> dict[str, object]:
    fields: dict[str, object] = {}
    level = draw(st.sampled_from(["INFO", "ERROR", None]))
    if level is not None:
        fields["level"] = level
    # Missing, null and non-numeric amounts must all be skipped like SQL nulls.
    amount = draw(st.one_of(st.integers(-20, 100), st.sampled_from(["missing", None, "n/a"])))
    if amount != "missing":
        fields["amount"] = amount
    return fields


@st.composite
def batch_cuts(draw: st.DrawFn, length: int) -> frozenset[int]:
    positions = list(range(1, length))
    return draw(
        st.one_of(
            st.just(frozenset()),  # the whole stream in one micro-batch
            st.just(frozenset(positions)),  # one record per micro-batch
            st.frozensets(st.sampled_from(positions)) if positions else st.just(frozenset()),
        )
    )


@st.composite
def scenarios(draw: st.DrawFn, max_records: int = 30) -> Scenario:
    rules = draw(window_rules())
    span = window_span_ms(rules)
    ooo = rules.out_of_orderness_ms
    lateness = rules.allowed_lateness_ms
    # A coarse grain makes event times land exactly on window and watermark boundaries often.
    grain = draw(st.sampled_from([1, 250, 500]))
    epoch = draw(st.sampled_from([0, 1_700_000_000_000]))
    n_keys = draw(st.integers(1, len(KEYS)))
    length = draw(st.integers(0, max_records))
    newest: dict[str, int] = {}
    stream: list[tuple[str, RefRecord]] = []
    for _ in range(length):
        key = KEYS[draw(st.integers(0, n_keys - 1))]
        if key not in newest:
            newest[key] = epoch + grain * draw(st.integers(0, 4 * span // grain))
        top = newest[key]
        move = draw(st.sampled_from(MOVES))
        if move == "forward":
            t = top + grain * draw(st.integers(0, 2 * span // grain))
        elif move == "jitter":  # behind the newest, within out_of_orderness: usually on time
            t = top - grain * draw(st.integers(0, ooo // grain))
        elif move == "late":  # behind W, within lateness (+ a window) of it
            t = top - ooo - grain * draw(st.integers(0, (lateness + span) // grain))
        else:  # behind W by more than lateness + a window: too late for some window
            t = top - ooo - lateness - span - grain * draw(st.integers(0, 2 * span // grain))
        t = max(t, 0)
        newest[key] = max(top, t)
        stream.append((key, RefRecord(t, draw(record_fields()))))
    # One record per key far in the future closes every earlier window of that key, so each
    # of them must have had its final pane by the end of the stream.
    for key in sorted(newest):
        stream.append((key, RefRecord(newest[key] + ooo + lateness + 2 * span + DAY_MS, {})))
    return Scenario(
        rules, tuple(stream), draw(batch_cuts(len(stream))), draw(batch_cuts(len(stream)))
    )


# ---------------------------------------------------------------------------------------------
# Running the streaming implementation


@dataclass(frozen=True)
class Emitted:
    batch: int  # global micro-batch number
    pane: Pane


@dataclass
class KeyOutput:
    """What `advance` produced for one key, with record indexes made key-global."""

    accepted: list[tuple[int, str, int, int, str]] = field(default_factory=list)
    pane_of_record: dict[tuple[int, str], int] = field(default_factory=dict)
    too_late: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    panes: list[Emitted] = field(default_factory=list)
    merges: list[tuple[str, str]] = field(default_factory=list)
    batch_of_record: list[int] = field(default_factory=list)

    def resolve(self, window_id: str) -> str:
        """The id a window ends up under once every session merge is applied."""
        into = dict(self.merges)
        seen = {window_id}
        while window_id in into:
            window_id = into[window_id]
            assert window_id not in seen, f"merge cycle through {window_id}: {self.merges}"
            seen.add(window_id)
        return window_id


def to_input(record: RefRecord, rules: WindowRules) -> RecordInput:
    inputs = {name: metric_input(record.fields, spec) for name, spec in rules.metrics.items()}
    return RecordInput(event_time_ms=record.event_time_ms, metric_inputs=inputs)


def micro_batches(length: int, cuts: frozenset[int]) -> list[range]:
    bounds = [0, *sorted(cuts), length]
    return [range(lo, hi) for lo, hi in itertools.pairwise(bounds) if lo < hi]


def run_streaming(scenario: Scenario, cuts: frozenset[int]) -> dict[str, KeyOutput]:
    rules = scenario.rules
    stored: dict[str, str] = {}  # key -> KeyState as JSON text, the way Spark keeps it
    outputs: dict[str, KeyOutput] = defaultdict(KeyOutput)
    for batch, positions in enumerate(micro_batches(len(scenario.stream), cuts)):
        # Spark calls each key once per micro-batch with that key's records, in order.
        by_key: dict[str, list[RefRecord]] = defaultdict(list)
        for position in positions:
            key, record = scenario.stream[position]
            by_key[key].append(record)
        for key, records in by_key.items():
            state = (
                KeyState.from_json_dict(json.loads(stored[key])) if key in stored else KeyState()
            )
            result = advance(state, [to_input(r, rules) for r in records], rules)
            stored[key] = json.dumps(state.to_json_dict())
            out = outputs[key]
            offset = len(out.batch_of_record)
            out.batch_of_record.extend([batch] * len(records))
            for a in result.assignments:
                index = offset + a.record_index
                out.accepted.append(
                    (index, a.window_id, a.window_start_ms, a.window_end_ms, Timing(a.timing).value)
                )
                out.pane_of_record[(index, a.window_id)] = a.pane_index
            for r in result.too_late:
                out.too_late.append(
                    (
                        offset + r.record_index,
                        r.window_start_ms,
                        r.window_end_ms,
                        r.lateness_ms,
                        r.watermark_ms,
                    )
                )
            out.panes.extend(Emitted(batch, pane) for pane in result.panes)
            out.merges.extend((m.absorbed_window_id, m.into_window_id) for m in result.merges)
    return outputs


# ---------------------------------------------------------------------------------------------
# Comparisons


def same_number(got: float | None, want: float | None) -> bool:
    if got is None or want is None:
        return got is None and want is None
    # A mean may be summed in another order: allow float rounding, nothing more.
    return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)


def assert_metrics(got: Mapping[str, float | None], want: MetricValues, context: str) -> None:
    assert set(got) == set(want), f"{context}: metric names {sorted(got)} != {sorted(want)}"
    for name, value in want.items():
        assert same_number(got[name], value), f"{context}: {name} = {got[name]}, want {value}"


def ref_accepted(ref: RefResult) -> list[tuple[int, str, int, int, str]]:
    rows = []
    for c in ref.classifications:
        if c.timing is not RefTiming.TOO_LATE:
            assert c.window_id is not None
            rows.append(
                (c.record_index, c.window_id, c.window_start_ms, c.window_end_ms, c.timing.value)
            )
    return sorted(rows)


def ref_too_late(ref: RefResult) -> list[tuple[int, int, int, int, int]]:
    rows = []
    for c in ref.classifications:
        if c.timing is RefTiming.TOO_LATE:
            assert c.lateness_ms is not None and c.watermark_before_ms is not None
            rows.append(
                (
                    c.record_index,
                    c.window_start_ms,
                    c.window_end_ms,
                    c.lateness_ms,
                    c.watermark_before_ms,
                )
            )
    return sorted(rows)


def check_key(scenario: Scenario, key: str, out: KeyOutput) -> RefResult:
    rules = scenario.rules
    records = scenario.records_of(key)
    ref = run_reference(records, rules)
    discarding_panes = (
        rules.accumulation is Accumulation.DISCARDING and rules.emit is Emit.EVERY_PANE
    )

    # (a) Every record's classification per window, and each too-late record x window.
    assert sorted(out.accepted) == ref_accepted(ref), f"{key}: accepted records x windows differ"
    assert sorted(out.too_late) == ref_too_late(ref), f"{key}: too-late records differ"

    # (b) The records of each window; a session's are gathered under the id it ends up with.
    got_members: dict[str, list[int]] = defaultdict(list)
    for index, window_id, *_ in out.accepted:
        got_members[out.resolve(window_id)].append(index)
    want_members = {w.window_id: sorted(w.record_indexes) for w in ref.windows.values()}
    assert {k: sorted(v) for k, v in got_members.items()} == want_members, (
        f"{key}: records per window"
    )

    # (c) Exactly one final pane per closed window, in the micro-batch in which W reaches
    # end + allowed_lateness, carrying the reference totals; none for a still-open window.
    finals: dict[str, list[Emitted]] = defaultdict(list)
    for emitted in out.panes:
        if emitted.pane.is_final:
            finals[emitted.pane.window_id].append(emitted)
    closed = {w.window_id: w for w in ref.windows.values() if w.closed_by is not None}
    assert sorted(finals) == sorted(closed), f"{key}: windows with a final pane"
    for window_id, window in closed.items():
        assert len(finals[window_id]) == 1, (
            f"{key}: {window_id} has {len(finals[window_id])} final panes"
        )
        final = finals[window_id][0]
        context = f"{key}: final pane of {window_id}"
        assert (final.pane.window_start_ms, final.pane.window_end_ms) == (
            window.start_ms,
            window.end_ms,
        ), context
        assert window.closed_by is not None
        assert final.batch == out.batch_of_record[window.closed_by], (
            f"{context}: emitted in the wrong batch"
        )
        family = [e for e in out.panes if out.resolve(e.pane.window_id) == window_id]
        assert all(e.batch <= final.batch for e in family), f"{context}: a pane after the final one"
        if discarding_panes:
            # Each pane holds only its new records, so the panes add up to the window.
            assert sum(e.pane.count for e in family) == window.count, f"{context}: pane counts"
            for name, spec in rules.metrics.items():
                if spec.kind is MetricKind.COUNT:
                    total = sum(e.pane.metrics[name] or 0.0 for e in family)
                    assert same_number(total, window.metrics[name]), (
                        f"{context}: pane sums of {name}"
                    )
        else:
            assert final.pane.count == window.count, f"{context}: count"
            assert_metrics(final.pane.metrics, window.metrics, context)
    # Contract §5 records W at emit: panes fire at the end of their micro-batch.
    last_of_batch = {batch: index for index, batch in enumerate(out.batch_of_record)}
    for e in out.panes:
        want_w = ref.watermarks_after[last_of_batch[e.batch]]
        assert e.pane.watermark_ms == want_w, (
            f"{key}: {e.pane.window_id} pane {e.pane.pane_index} watermark"
        )
    if rules.emit is Emit.FINAL_ONLY:
        assert all(e.pane.is_final and e.pane.pane_index == 0 for e in out.panes), (
            f"{key}: final_only emitted a non-final pane or pane_index != 0"
        )

    if not isinstance(rules.window, SessionWindow):
        check_fixed_pane_schedule(scenario, key, out, ref)
    return ref


@dataclass(frozen=True)
class ExpectedPane:
    batch: int
    pane_index: int
    timing: str | None  # None: an empty final pane, whose timing contract §4 leaves open
    is_final: bool
    records: tuple[int, ...]  # what the pane carries: new records, or all so far if accumulating


def expected_fixed_panes(
    scenario: Scenario, key: str, out: KeyOutput, ref: RefResult
) -> dict[str, list[ExpectedPane]]:
    """Contract §4's panes of each fixed window, given which micro-batch each record arrived in."""
    rules = scenario.rules
    lateness = rules.allowed_lateness_ms
    accumulating = rules.accumulation is Accumulation.ACCUMULATING
    # The key's micro-batches: W only moves in those, so panes only fire in those.
    batches: dict[int, list[int]] = defaultdict(list)
    for index, batch in enumerate(out.batch_of_record):
        batches[batch].append(index)
    timing_of = {
        (c.record_index, c.window_id): c.timing
        for c in ref.classifications
        if c.timing is not RefTiming.TOO_LATE
    }
    expected: dict[str, list[ExpectedPane]] = {}
    for window in ref.windows.values():
        members = window.record_indexes
        on_time = tuple(i for i in members if timing_of[(i, window.window_id)] is RefTiming.ON_TIME)
        panes: list[ExpectedPane] = []
        before: int | None = None  # W when the batch starts
        for batch, indexes in sorted(batches.items()):
            after = ref.watermarks_after[indexes[-1]]
            assert after is not None
            so_far = tuple(i for i in members if i <= indexes[-1])
            late = tuple(
                i for i in indexes if timing_of.get((i, window.window_id)) is RefTiming.LATE
            )

            def crosses(boundary: int, before: int | None = before, after: int = after) -> bool:
                return (before is None or before < boundary) and after >= boundary

            closes = crosses(window.end_ms + lateness)
            batch_panes: list[tuple[str | None, tuple[int, ...]]] = []
            if rules.emit is Emit.FINAL_ONLY:
                if closes:
                    batch_panes.append((None, tuple(members)))
            else:
                if crosses(window.end_ms) and on_time:
                    batch_panes.append(("ON_TIME", on_time))
                if late:
                    batch_panes.append(("LATE", so_far if accumulating else late))
                elif closes and not batch_panes and so_far:
                    batch_panes.append((None, so_far if accumulating else ()))
            for n, (timing, carried) in enumerate(batch_panes):
                is_final = closes and n == len(batch_panes) - 1
                panes.append(ExpectedPane(batch, len(panes), timing, is_final, carried))
            before = after
        expected[window.window_id] = panes
    return expected


def check_fixed_pane_schedule(scenario: Scenario, key: str, out: KeyOutput, ref: RefResult) -> None:
    rules = scenario.rules
    records = scenario.records_of(key)
    expected = expected_fixed_panes(scenario, key, out, ref)
    got: dict[str, list[Emitted]] = defaultdict(list)
    for emitted in out.panes:
        got[emitted.pane.window_id].append(emitted)
    assert sorted(got) == sorted(w for w, panes in expected.items() if panes), (
        f"{key}: windows with panes"
    )
    for window_id, want in expected.items():
        have = sorted(got.get(window_id, []), key=lambda e: (e.batch, e.pane.pane_index))
        summary = [
            (e.batch, e.pane.pane_index, e.pane.timing, e.pane.is_final, e.pane.count) for e in have
        ]
        wanted = [(p.batch, p.pane_index, p.timing, p.is_final, len(p.records)) for p in want]
        context = f"{key}: panes of {window_id} (batch, index, timing, final, count) {summary} != {wanted}"
        assert len(have) == len(want), context
        for emitted, pane in zip(have, want, strict=True):
            assert (emitted.batch, emitted.pane.pane_index, emitted.pane.is_final) == (
                pane.batch,
                pane.pane_index,
                pane.is_final,
            ), context
            if pane.timing is not None:
                assert Timing(emitted.pane.timing).value == pane.timing, context
            count, metrics = aggregate([records[i] for i in pane.records], rules.metrics)
            assert emitted.pane.count == count, context
            assert_metrics(emitted.pane.metrics, metrics, f"{context}, pane {pane.pane_index}")
    if rules.emit is Emit.EVERY_PANE:
        # A record goes to the ON_TIME pane, or to the LATE pane of its micro-batch.
        late_pane = {
            (p.batch, window_id): p.pane_index
            for window_id, panes in expected.items()
            for p in panes
            if p.timing == "LATE"
        }
        for index, window_id, _, _, timing in out.accepted:
            want_index = (
                0 if timing == "ON_TIME" else late_pane[(out.batch_of_record[index], window_id)]
            )
            got_index = out.pane_of_record[(index, window_id)]
            assert got_index == want_index, (
                f"{key}: record {index} in {window_id}: pane_index {got_index}"
            )


def batch_independent_view(
    scenario: Scenario, outputs: Mapping[str, KeyOutput]
) -> dict[str, tuple[object, ...]]:
    """What contract §4 says no batching may change, per key."""
    rules = scenario.rules
    with_totals = not (
        rules.accumulation is Accumulation.DISCARDING and rules.emit is Emit.EVERY_PANE
    )
    view: dict[str, tuple[object, ...]] = {}
    for key, out in outputs.items():
        finals = sorted(
            (
                e.pane.window_id,
                e.pane.window_start_ms,
                e.pane.window_end_ms,
                e.pane.count if with_totals else None,
                # Rounded so that a mean summed in another order still compares equal.
                tuple(
                    sorted(
                        (name, None if v is None else round(v, 6))
                        for name, v in (e.pane.metrics.items() if with_totals else ())
                    )
                ),
            )
            for e in out.panes
            if e.pane.is_final
        )
        view[key] = (sorted(out.accepted), sorted(out.too_late), tuple(finals))
    return view


# ---------------------------------------------------------------------------------------------
# Properties


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_streaming_matches_reference_under_random_batching(scenario: Scenario) -> None:
    out_a = run_streaming(scenario, scenario.cuts_a)
    for key in scenario.keys:
        ref = check_key(scenario, key, out_a[key])
        # Shown by --hypothesis-show-statistics: evidence that the cases the spec cares about
        # (late, too late, merged sessions) do come up.
        timings = {c.timing for c in ref.classifications}
        event(f"{scenario.rules.window.kind} {scenario.rules.accumulation} {scenario.rules.emit}")
        for timing in sorted(timings - {RefTiming.ON_TIME}):
            event(f"{scenario.rules.window.kind} has {timing}")
        if ref.merges:
            event("session merge")
    # (d) Another batching of the same stream: same classifications and final panes.
    out_b = run_streaming(scenario, scenario.cuts_b)
    assert batch_independent_view(scenario, out_b) == batch_independent_view(scenario, out_a)


# ---------------------------------------------------------------------------------------------
# Contract §7 worked example, and hand-checked cases of the reference itself


def mmss(text: str) -> int:
    minutes, seconds = text.split(":")
    return (int(minutes) * 60 + int(seconds)) * 1000


SECTION_7_RULES = WindowRules.model_validate(
    {
        "window": {"kind": "tumbling", "size": "1m"},
        "out_of_orderness": "10s",
        "allowed_lateness": "1m",
        "accumulation": "accumulating",
    }
)
SECTION_7_ACME = [RefRecord(mmss(t)) for t in ("00:05", "01:20", "00:30", "02:15", "00:50")]


def test_reference_reproduces_spec_section_7() -> None:
    ref = run_reference(SECTION_7_ACME, SECTION_7_RULES)
    first = fixed_window_id(0, mmss("01:00"))
    second = fixed_window_id(mmss("01:00"), mmss("02:00"))
    third = fixed_window_id(mmss("02:00"), mmss("03:00"))
    w_before = [None, *ref.watermarks_after[:-1]]
    # One row of the contract's table per record: (W before, window, outcome, lateness_ms).
    table = [
        (None, first, RefTiming.ON_TIME, None),
        # The table prints "-inf" here; contract §2's formula gives 00:05 - 10 s = -5 s, which
        # is the same thing for every window (none ends before the epoch).
        (-5_000, second, RefTiming.ON_TIME, None),
        (mmss("01:10"), first, RefTiming.LATE, None),
        (mmss("01:10"), third, RefTiming.ON_TIME, None),
        (mmss("02:05"), first, RefTiming.TOO_LATE, 65_000),
    ]
    for index, (watermark, window_id, timing, lateness) in enumerate(table):
        [row] = ref.for_record(index)
        assert w_before[index] == watermark == row.watermark_before_ms, f"row {index + 1}"
        assert (row.window_id, row.timing, row.lateness_ms) == (window_id, timing, lateness), (
            f"row {index + 1}"
        )
    assert ref.watermarks_after[1] == mmss("01:10")
    assert ref.watermarks_after[3] == mmss("02:05")
    # Row 4 closes [00:00, 01:00) with its final totals: records 1 and 3.
    assert ref.windows[first].closed_by == 3
    assert (ref.windows[first].record_indexes, ref.windows[first].count) == ([0, 2], 2)
    assert ref.windows[second].closed_by is None and ref.windows[second].count == 1
    # globex's record at 00:10 has its own W: acme's 02:05 does not make it late.
    [globex] = run_reference([RefRecord(mmss("00:10"))], SECTION_7_RULES).for_record(0)
    assert globex.timing is RefTiming.ON_TIME


def test_streaming_reproduces_spec_section_7_panes() -> None:
    """The pane rows of contract §7, one record per batch and with records 3 and 4 in one batch."""

    def panes_of(batches: list[list[int]]) -> list[list[tuple[int, int, bool, int]]]:
        state, per_batch = KeyState(), []
        for batch in batches:
            state = KeyState.from_json_dict(json.loads(json.dumps(state.to_json_dict())))
            records = [to_input(SECTION_7_ACME[i], SECTION_7_RULES) for i in batch]
            result = advance(state, records, SECTION_7_RULES)
            # Contract §4 fixes which panes a batch emits, not their order within the batch.
            per_batch.append(
                sorted((p.window_start_ms, p.pane_index, p.is_final, p.count) for p in result.panes)
            )
        return per_batch

    minute = mmss("01:00")
    assert panes_of([[0], [1], [2], [3], [4]]) == [
        [],
        [(0, 0, False, 1)],  # row 2: W 01:10 fires [00:00, 01:00)'s ON_TIME pane
        [(0, 1, False, 2)],  # row 3: LATE pane 1, accumulating
        [(0, 2, True, 2), (minute, 0, False, 1)],  # row 4: FINAL pane 2; [01:00, 02:00) ON_TIME
        [],  # row 5: too late, no pane
    ]
    # Records 3 and 4 in one batch: pane 1 is the final one, with the same totals.
    assert panes_of([[0], [1], [2, 3], [4]]) == [
        [],
        [(0, 0, False, 1)],
        [(0, 1, True, 2), (minute, 0, False, 1)],
        [],
    ]


def test_reference_session_merge_keeps_earliest_session() -> None:
    rules = WindowRules.model_validate(
        {
            "window": {"kind": "session", "gap": "10s"},
            "out_of_orderness": "1m",
            "allowed_lateness": 0,
        }
    )
    # 00:08 bridges [00:00, 00:10) and [00:15, 00:25): one session, named after its first.
    ref = run_reference([RefRecord(mmss(t)) for t in ("00:00", "00:15", "00:08")], rules)
    assert ref.merges == [("session-15000", "session-0")]
    [merged] = ref.windows.values()
    assert (merged.window_id, merged.start_ms, merged.end_ms) == ("session-0", 0, mmss("00:25"))
    assert merged.record_indexes == [0, 1, 2]
    assert [c.window_end_ms for c in ref.classifications] == [
        mmss(t) for t in ("00:10", "00:25", "00:25")
    ]


def test_reference_session_too_late_only_when_touching_no_open_session() -> None:
    rules = WindowRules.model_validate(
        {
            "window": {"kind": "session", "gap": "10s"},
            "out_of_orderness": 0,
            "allowed_lateness": "5s",
        }
    )
    # After 00:30, W = 00:30 and [00:20, 00:30) is still open (until W reaches 00:35). 00:00's
    # proto [00:00, 00:10) touches nothing and is too late by 20 s; 00:12's proto [00:12, 00:22)
    # touches [00:20, 00:30) and joins it, as LATE since W has passed the session's end.
    ref = run_reference([RefRecord(mmss(t)) for t in ("00:20", "00:30", "00:00", "00:12")], rules)
    assert [(c.timing, c.lateness_ms) for c in ref.classifications] == [
        (RefTiming.ON_TIME, None),
        (RefTiming.ON_TIME, None),
        (RefTiming.TOO_LATE, mmss("00:20")),
        (RefTiming.LATE, None),
    ]
    last = ref.classifications[3]
    assert (last.window_id, last.window_start_ms, last.window_end_ms) == (
        "session-20000",
        mmss("00:12"),
        mmss("00:30"),
    )
