"""The state of a bucket of keys: what goes in comes out, untouched keys keep their bytes."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from random import Random

import pyarrow as pa

from streaming.state.bucket_state import BucketState, read_blob
from streaming.windowing.key_state import KeyState, RecordInput
from streaming.windowing.key_windows import advance
from tenants.models import WindowRules, rules_id
from tests.support.bucket_inputs import json_layout_blob

RULES = WindowRules.model_validate(
    {"window": {"kind": "tumbling", "size": "1m"}, "out_of_orderness": "10s"}
)


def _state_with_records(*event_times_ms: int) -> KeyState:
    state = KeyState()
    advance(state, [RecordInput(t) for t in event_times_ms], RULES, processing_time_ms=1_000)
    return state


def test_keys_round_trip_through_bytes_with_their_counters_and_deadlines() -> None:
    bucket = BucketState()
    acme = bucket.get(("acme", "web"))
    acme.key_state = _state_with_records(5_000, 80_000)
    acme.quarantined_records = 3
    acme.idle_deadline_ms = 9_000
    bucket.get(("globex", "web")).key_state = _state_with_records(1_000)

    restored = BucketState.from_bytes(bucket.to_bytes())

    assert restored.keys() == {("acme", "web"), ("globex", "web")}
    acme_again = restored.get(("acme", "web"))
    assert acme_again.key_state == acme.key_state
    assert acme_again.key_state.watermark_ms == 70_000
    assert (acme_again.quarantined_records, acme_again.idle_deadline_ms) == (3, 9_000)
    assert restored.get(("globex", "web")).idle_deadline_ms is None


def test_only_due_keys_are_idle_and_the_next_deadline_is_the_earliest() -> None:
    bucket = BucketState()
    for tenant, deadline in [("a", 5_000), ("b", 9_000), ("c", None)]:
        bucket.get((tenant, "web")).idle_deadline_ms = deadline
    restored = BucketState.from_bytes(bucket.to_bytes())
    restored.get(("b", "web")).idle_deadline_ms = 4_000  # decoded and changed in this batch

    assert restored.idle_keys(4_500) == [("b", "web")]
    assert restored.idle_keys(5_000) == [("a", "web"), ("b", "web")]
    assert restored.next_idle_deadline_ms() == 4_000


def test_a_dropped_key_is_gone_and_an_empty_bucket_round_trips() -> None:
    bucket = BucketState()
    bucket.get(("acme", "web"))
    bucket.drop(("acme", "web"))
    assert len(BucketState.from_bytes(bucket.to_bytes())) == 0
    assert len(BucketState.from_bytes(None)) == 0


def test_the_written_out_json_of_a_key_state_is_its_whole_dataclass() -> None:
    """`to_json_dict` is written field by field for speed; it must not forget a field."""
    state = _state_with_records(5_000, 61_000, 20_000, 200_000)
    reference = asdict(replace(state, open_window_index=None))
    del reference["open_window_index"]
    assert state.to_json_dict() == reference
    assert KeyState.from_json_dict(state.to_json_dict()) == state


def test_an_overflowed_sum_survives_the_state_written_now_and_by_earlier_releases() -> None:
    summed = WindowRules.model_validate(
        {
            "window": {"kind": "tumbling", "size": "1m"},
            "out_of_orderness": "10s",
            "metrics": {"total": {"kind": "sum", "field": "amount"}},
        }
    )
    state = KeyState()
    huge = {"total": 1.5e308}
    advance(state, [RecordInput(1_000, huge), RecordInput(2_000, huge)], summed, 1_000)
    bucket = BucketState()
    bucket.get(("acme", "web")).key_state = state

    restored = BucketState.from_bytes(bucket.to_bytes()).get(("acme", "web")).key_state
    advance(restored, [RecordInput(3_000, {"total": -1.0})], summed, 2_000)

    (window,) = restored.windows.values()
    assert window.total.metrics["total"] == [float("inf"), 3]
    # Releases before orjson wrote the standard library's `Infinity`.
    legacy = json.dumps(state.to_json_dict()).replace('"inf"', "Infinity")
    assert "Infinity" in legacy
    old_bucket = BucketState.from_bytes(json_layout_blob(["acme"], [legacy]))
    (old_window,) = old_bucket.get(("acme", "web")).key_state.windows.values()
    assert old_window.total.metrics["total"] == [float("inf"), 2]


def _rules_stored(blob: bytes) -> dict[str, object]:
    metadata = read_blob(blob).schema.metadata
    return dict(json.loads(metadata[b"rules_by_id_json"]))


def test_rules_shared_by_keys_are_stored_once_per_bucket_and_dropped_when_unused() -> None:
    hourly = RULES.model_copy(update={"out_of_orderness_ms": 60_000})
    bucket = BucketState()
    for tenant in ("a", "b", "c"):
        bucket.get((tenant, "web")).key_state = _state_with_records(5_000)
    other = KeyState()
    advance(other, [RecordInput(5_000)], hourly, processing_time_ms=1_000)
    bucket.get(("d", "web")).key_state = other
    blob = bucket.to_bytes()

    assert set(_rules_stored(blob)) == {rules_id(RULES), rules_id(hourly)}
    # Once per rule set, in the bucket's metadata; a key's windows name their rules by id.
    assert all("out_of_orderness_ms" not in str(row) for row in read_blob(blob).to_pylist())
    restored = BucketState.from_bytes(blob)
    for tenant in ("a", "b", "c"):
        assert restored.get((tenant, "web")).key_state == _state_with_records(5_000)
    assert restored.get(("d", "web")).key_state == other

    restored.drop(("d", "web"))
    assert set(_rules_stored(restored.to_bytes())) == {rules_id(RULES)}


def test_a_bucket_of_the_json_layout_reads_back_and_is_rewritten_in_columns() -> None:
    state = _state_with_records(5_000, 80_000)
    blob = json_layout_blob(["acme", "globex"], [json.dumps(state.to_json_dict())] * 2)

    restored = BucketState.from_bytes(blob)
    assert restored.get(("acme", "web")).key_state == state
    assert restored.get(("acme", "web")).quarantined_records == 2
    rewritten_blob = restored.to_bytes()
    assert "key_state_json" not in read_blob(rewritten_blob).schema.names
    assert set(_rules_stored(rewritten_blob)) == {rules_id(RULES)}
    rewritten = BucketState.from_bytes(rewritten_blob)
    assert rewritten.get(("acme", "web")).key_state == state
    assert rewritten.get(("globex", "web")).key_state == state
    assert rewritten.get(("globex", "web")).quarantined_records == 2


def test_keys_a_batch_does_not_touch_keep_their_stored_rows_byte_for_byte() -> None:
    bucket = BucketState()
    for tenant in ("a", "b", "c"):
        bucket.get((tenant, "web")).key_state = _state_with_records(5_000)
    before = read_blob(bucket.to_bytes())

    restored = BucketState.from_bytes(bucket.to_bytes())
    restored.get(("b", "web")).key_state = _state_with_records(5_000, 70_000)
    restored.drop(("c", "web"))
    restored.get(("d", "web")).quarantined_records = 1
    after = read_blob(restored.to_bytes())

    assert after["tenant"].to_pylist() == ["a", "b", "d"]
    assert after.slice(0, 1).to_pylist() == before.slice(0, 1).to_pylist()
    again = BucketState.from_bytes(restored.to_bytes())
    assert again.get(("b", "web")).key_state == _state_with_records(5_000, 70_000)
    assert again.get(("d", "web")).quarantined_records == 1
    # A dropped key that comes back starts afresh.
    restored.get(("c", "web"))
    assert restored.get(("c", "web")).key_state == KeyState()


def test_a_blob_of_arrows_per_buffer_compression_reads_back_and_is_rewritten_as_one_frame() -> None:
    """Releases before the framed blob wrote an IPC stream with Arrow's own zstd compression: a
    checkpoint they left resumes, and each bucket is rewritten the next time it changes."""
    bucket = BucketState()
    for tenant in ("a", "b"):
        bucket.get((tenant, "web")).key_state = _state_with_records(5_000)
    table = read_blob(bucket.to_bytes())
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    earlier_blob = bytes(sink.getvalue())

    restored = BucketState.from_bytes(earlier_blob)
    assert restored.get(("a", "web")).key_state == _state_with_records(5_000)
    restored.get(("b", "web")).key_state = _state_with_records(5_000, 70_000)
    rewritten = restored.to_bytes()
    assert rewritten[:4] != earlier_blob[:4]
    assert read_blob(rewritten).schema.metadata == table.schema.metadata
    again = BucketState.from_bytes(rewritten)
    assert again.get(("a", "web")).key_state == _state_with_records(5_000)
    assert again.get(("b", "web")).key_state == _state_with_records(5_000, 70_000)


def test_a_key_asked_for_twice_finds_its_stored_row_each_time() -> None:
    bucket = BucketState()
    for tenant in ("a", "b", "c"):
        bucket.get((tenant, "web")).key_state = _state_with_records(5_000)
    restored = BucketState.from_bytes(bucket.to_bytes())
    rules = rules_id(RULES)

    usable, positions = restored.column_keys(
        [("b", "web"), ("new", "web"), ("b", "web")], [rules, rules, rules]
    )

    stored_b = read_blob(bucket.to_bytes())["tenant"].to_pylist().index("b")
    assert positions.tolist() == [stored_b, -1, stored_b]
    assert usable.tolist() == [True, True, True]


def test_a_bucket_changed_in_every_batch_keeps_a_bounded_number_of_record_batches() -> None:
    """The rows carried over and those put back are joined as they are, without sorting every
    key: the blob must not gain a record batch per micro-batch for ever."""
    blob = BucketState().to_bytes()
    for batch in range(40):
        bucket = BucketState.from_bytes(blob)
        bucket.get((f"t{batch % 7}", "web")).key_state = _state_with_records(1_000 * batch)
        bucket.get((f"n{batch}", "web")).quarantined_records = 1
        blob = bucket.to_bytes()

    stored = read_blob(blob)
    assert stored["tenant"].num_chunks <= 10
    assert sorted(stored["tenant"].to_pylist()) == sorted(
        [f"t{n}" for n in range(7)] + [f"n{n}" for n in range(40)]
    )
    again = BucketState.from_bytes(blob)
    assert again.get(("t4", "web")).key_state == _state_with_records(39_000)  # batch 39 its last


def _counters(blob: bytes) -> dict[str, tuple[int, int]]:
    """Each stored key's (on-time records, quarantined records), by tenant; a key stored twice
    fails."""
    rows = read_blob(blob).select(["tenant", "on_time_records", "quarantined_records"])
    tenants = rows["tenant"].to_pylist()
    assert len(set(tenants)) == len(tenants), "a key is stored twice"
    on_time, quarantined = rows["on_time_records"], rows["quarantined_records"]
    counts = zip(on_time.to_pylist(), quarantined.to_pylist(), strict=True)
    return dict(zip(tenants, counts, strict=True))


def test_a_large_bucket_changed_a_little_per_batch_keeps_its_base_and_every_keys_latest_state() -> (
    None
):
    """A bucket of thousands of keys, a few changed in each batch (as columns and as objects),
    some dropped, some new: its blob keeps the last whole blob's bytes and adds a frame of what
    changed, until these are many and the bucket is written whole again; every key reads back
    its latest state throughout."""
    rules = rules_id(RULES)
    bucket = BucketState()
    expected: dict[str, tuple[int, int]] = {}
    for number in range(2_000):
        bucket.get((f"t{number}", "web")).key_state = _state_with_records(5_000)
        expected[f"t{number}"] = (1, 0)
    blob = bucket.to_bytes()
    random = Random(7)
    layered_on: list[bytes] = []
    whole_again = False
    for batch in range(1, 41):
        bucket = BucketState.from_bytes(blob)
        present = sorted(expected)
        as_columns = [(tenant, "web") for tenant in random.sample(present, 60)]
        usable, positions = bucket.column_keys(as_columns, [rules] * len(as_columns))
        assert usable.all()
        columns = bucket.take_columns(as_columns, positions, metrics=0)
        columns.on_time_records += 1
        bucket.put_columns(columns, rules, RULES.model_dump(mode="json"))
        for tenant, _ in as_columns:
            expected[tenant] = (expected[tenant][0] + 1, expected[tenant][1])
        rest = sorted(set(present) - {tenant for tenant, _ in as_columns})
        for tenant in random.sample(rest, 20):
            bucket.get((tenant, "web")).quarantined_records = batch
            expected[tenant] = (expected[tenant][0], batch)
        for tenant in random.sample(rest, 3):
            bucket.drop((tenant, "web"))
            expected.pop(tenant, None)
        bucket.get((f"new{batch}", "web")).quarantined_records = 1
        expected[f"new{batch}"] = (0, 1)

        written = bucket.to_bytes()
        if written[:4] == b"TWL2":
            layered_on.append(blob if blob[:4] != b"TWL2" else layered_on[-1])
            assert layered_on[-1] in written  # the base's bytes, as they were
        elif layered_on:
            whole_again = True
        assert _counters(written) == expected, f"batch {batch}"
        assert len(BucketState.from_bytes(written)) == len(expected)
        blob = written

    assert layered_on and whole_again
    restored = BucketState.from_bytes(blob)
    assert restored.keys() == {(tenant, "web") for tenant in expected}
    assert restored.get(("t5", "web")).key_state.watermark_ms is not None


def test_a_layered_bucket_replayed_writes_the_same_bytes() -> None:
    bucket = BucketState()
    for number in range(1_500):
        bucket.get((f"t{number}", "web")).key_state = _state_with_records(5_000)
    base = bucket.to_bytes()

    def batch() -> bytes:
        state = BucketState.from_bytes(base)
        state.get(("t3", "web")).quarantined_records = 4
        state.drop(("t9", "web"))
        state.get(("new", "web")).key_state = _state_with_records(7_000)
        return state.to_bytes()

    first = batch()
    assert first[:4] == b"TWL2"
    assert batch() == first
    again = BucketState.from_bytes(first)
    assert again.get(("t3", "web")).quarantined_records == 4
    assert again.get(("new", "web")).key_state == _state_with_records(7_000)
    kept = again.keys()
    assert ("t9", "web") not in kept
