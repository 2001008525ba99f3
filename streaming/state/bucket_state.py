"""The state of one hash bucket of keys: every (tenant, source) key's state in one value.

`applyInPandasWithState` pays a fixed cost per group, so the stream groups by a hash bucket of
the key rather than by the key: 10,000 keys cost 64 group calls a batch, not 10,000. A bucket's
state is one Arrow IPC blob with a row per key, and in it a list of the key's open windows, each
a struct of columns (aggregates as lists of numbers, a metric's values in `metric_names` order).

Keys are read out in two ways:
- as columns (`take_columns`/`put_columns`), for `columnar_windows` to advance many keys at once
  without a Python object per key or window: the hot path;
- as `KeyState` objects (`get`/`decode`), for what `key_windows.advance` does record by record
  (sessions, keys whose windows were opened with other rules) and for offboarding.

The keys a batch touches neither way stay the rows they were read as. `idle_deadline_ms` lets a
batch find the keys whose idle timeout has passed without reading any state, and
`checked_fingerprint` (in the blob's schema metadata) lets it skip looking for keys whose config
is gone while the tenant config has not changed. The window rules are kept once per bucket, by
rules id, not in every key.

A bucket of many keys is not encoded whole in every batch that changes a few of them: its blob
is then a list of frames, each written once and copied as it was since, with the rows of theirs
that are stale; a batch adds a frame of the rows it wrote, until the stale rows or the frames are
many and the bucket is written whole again (`to_bytes`).

Blobs of the earlier layout (each key's state as JSON) are read, and written in this layout the
next time the bucket changes: a running stream upgrades its state as it goes.

Pure: pyarrow and NumPy only, no Spark.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from streaming.windowing.columnar_windows import (
    NO_TIME,
    AggregateColumns,
    KeyColumns,
    WindowColumns,
    optional_times,
    window_ids,
)
from streaming.windowing.key_state import Aggregates, KeyState, OpenWindow

Key = tuple[str, str]

# Schema metadata, not columns: one value per bucket.
_CHECKED_FINGERPRINT = b"checked_config_fingerprint"
_RULES_BY_ID = b"rules_by_id_json"

# The state store keeps a bucket's blob in memory for each retained version and writes it to
# the checkpoint in every batch that touches it, so the blob is compressed: the whole IPC stream
# at once, as one zstd frame. Arrow's own IPC compression (earlier blobs) compresses each buffer
# on its own; with a bucket's forty-odd small buffers that cost 0.8 ms to write and 0.6 ms to
# read a 314-key bucket (10,000 tenants), against 0.2 and 0.1 ms as one frame, which is also
# a third smaller (18.8 KB against 28.1 KB; 148 KB uncompressed).
_FRAMED = b"TWZ1"
"""What a framed blob starts with: an IPC stream starts with 0xFFFFFFFF."""
_FRAME_HEADER = struct.Struct("<4sQ")
"""The marker, then the IPC stream's length (zstd needs it to decompress in one call)."""
_CODEC = pa.Codec("zstd")

# At a million tenants each of 16 buckets holds 62,500 keys, and a batch of 50,000 records
# changes about 3,000 of them: encoding every key (IPC, then zstd) in each batch was a third of
# the stateful stage's CPU. A batch encodes only the rows it wrote instead; every frame is read
# back in each batch, and the blob holds at most half as many rows again as a whole one.
_LAYERED = b"TWL2"
"""What a layered blob starts with (a whole one: `_FRAMED`, or 0xFFFFFFFF)."""
_LAYERS_HEADER = struct.Struct("<4sIQ")
"""The marker, the number of frames, the number of stale rows; then each frame's length
(`_LENGTH`), the frames (whole blobs), and the stale rows (`_STALE_ROW`), counted over the rows of
all the frames in their order."""
_LENGTH = np.dtype("<u8")
_STALE_ROW = np.dtype("<u4")
_MIN_LAYERED_ROWS = 1_024
"""A bucket of fewer keys is written whole each time: it costs little, and one frame is read
faster than many."""
_MAX_FRAMES = 8
_MAX_STALE_SHARE = 1 / 3
"""Stale rows, as a share of all the frames' rows, past which the bucket is written whole."""
_MAX_CHUNKS = 8
"""Record batches a blob may hold before `rows` joins them into one."""

_AGGREGATE_FIELDS = [
    ("count", pa.int64()),
    ("values", pa.list_(pa.float64())),
    ("seen", pa.list_(pa.int64())),
]
_WINDOW = pa.struct(
    [
        pa.field("window_id", pa.string()),
        pa.field("start_ms", pa.int64()),
        pa.field("end_ms", pa.int64()),
        pa.field("rules_id", pa.string()),
        pa.field("next_pane_index", pa.int64()),
        pa.field("on_time_sealed", pa.bool_()),
        pa.field("had_late_records", pa.bool_()),
        *(pa.field(f"total_{name}", kind) for name, kind in _AGGREGATE_FIELDS),
        *(pa.field(f"pending_{name}", kind) for name, kind in _AGGREGATE_FIELDS),
        pa.field("merged_window_ids", pa.list_(pa.string())),
    ]
)
_TIMES = [
    "watermark_ms",
    "max_event_time_ms",
    "last_record_processing_ms",
    "watermark_at_last_record_ms",
]
_COUNTERS = ["on_time_records", "late_records", "too_late_records", "quarantined_records"]
_SCHEMA = pa.schema(
    [
        pa.field("tenant", pa.string()),
        pa.field("source", pa.string()),
        *(pa.field(name, pa.int64()) for name in [*_TIMES, *_COUNTERS]),
        # When the key's idle timeout fires, if it has open windows and an idle timeout.
        pa.field("idle_deadline_ms", pa.int64()),
        pa.field("windows", pa.list_(_WINDOW)),
    ]
)


@dataclass
class StoredKey:
    """One key's state as an object, for the record-by-record path."""

    key_state: KeyState
    quarantined_records: int = 0
    idle_deadline_ms: int | None = None
    """When the key's idle timeout fires, if it has open windows and an idle timeout."""


def read_blob(blob: bytes) -> pa.Table:
    """A bucket's blob as the table of its keys' rows, with its schema metadata."""
    layers = _Layers.read(blob)
    live = np.ones(layers.rows.num_rows, bool)
    live[layers.stale_rows] = False
    return layers.rows.filter(pa.array(live)) if len(layers.stale_rows) else layers.rows


@dataclass(frozen=True)
class _Layers:
    """A bucket's blob in its frames: a whole blob is one frame."""

    frames: tuple[bytes, ...]
    rows: pa.Table
    """Every frame's rows, in order, with the last frame's schema metadata: the bucket's."""
    stale_rows: np.ndarray

    @classmethod
    def read(cls, blob: bytes) -> _Layers:
        if blob[: len(_LAYERED)] != _LAYERED:
            return cls((blob,), _read_frame(blob), np.empty(0, np.int64))
        _, frame_count, stale_count = _LAYERS_HEADER.unpack_from(blob)
        lengths = np.frombuffer(blob, _LENGTH, frame_count, _LAYERS_HEADER.size).tolist()
        ends = np.cumsum([_LAYERS_HEADER.size + frame_count * _LENGTH.itemsize, *lengths])
        frames = tuple(bytes(blob[ends[n] : ends[n + 1]]) for n in range(frame_count))
        stale = np.frombuffer(blob, _STALE_ROW, stale_count, int(ends[-1]))
        tables = [_read_frame(frame) for frame in frames]
        metadata = tables[-1].schema.metadata
        rows = pa.concat_tables([table.replace_schema_metadata(metadata) for table in tables])
        return cls(frames, rows, stale.astype(np.int64))


def _read_frame(blob: bytes | memoryview) -> pa.Table:
    """A whole blob's table: a zstd frame of an IPC stream (`_frame`), or an IPC stream as
    earlier releases wrote it."""
    if blob[: len(_FRAMED)] != _FRAMED:
        return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()
    _, stream_bytes = _FRAME_HEADER.unpack_from(blob)
    frame = memoryview(blob)[_FRAME_HEADER.size :]
    return pa.ipc.open_stream(_CODEC.decompress(frame, decompressed_size=stream_bytes)).read_all()


def _frame(rows: pa.Table, metadata: dict[bytes, bytes]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, _SCHEMA.with_metadata(metadata)) as writer:
        writer.write_table(rows.replace_schema_metadata(metadata))
    stream = sink.getvalue()
    frame: bytes = _CODEC.compress(stream, asbytes=True)
    return _FRAME_HEADER.pack(_FRAMED, stream.size) + frame


@dataclass(frozen=True)
class _Frames:
    """The frames of the blob a bucket was read from, and how many of the stored rows are
    theirs: a layered blob keeps them as they are."""

    blobs: tuple[bytes, ...]
    rows: int


class BucketState:
    """The keys of one bucket: `from_bytes`, then `take_columns` or `get` each key a batch
    touches (never both), `drop`, `to_bytes`."""

    def __init__(
        self,
        stored: pa.Table | None = None,
        checked_fingerprint: str | None = None,
        rules_by_id: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self._stored = stored if stored is not None else _SCHEMA.empty_table()
        """The rows read; those of keys taken, decoded or dropped since are stale."""
        self._readable = np.ones(len(self._stored), bool)
        """Which stored rows hold their key's state as of the blob or the last `_settle`."""
        self._frames: _Frames | None = None
        """The frames the stored rows begin with, if a layered blob may keep them."""
        self._stored_keys: pa.Array | None = None
        self._taken_rows: list[np.ndarray] = []
        """Rows of `_stored` whose keys went out as columns."""
        self._put: list[pa.Table] = []
        """The new rows of the keys taken as columns."""
        self._carried_rows: np.ndarray | None = None
        """`_carried()`, until a key is taken, decoded or dropped."""
        # Shared by the decoded keys' `KeyState.rules`, which only read them.
        self._rules_by_id: dict[str, dict[str, Any]] = rules_by_id or {}
        self._decoded: dict[Key, StoredKey] = {}
        self._dropped: set[Key] = set()
        self._checked_fingerprint = checked_fingerprint
        # The blob this state was read from, while nothing changed: a bucket woken only to
        # look at the config saves it as it was instead of encoding every key again.
        self._unchanged_blob: bytes | None = None

    @property
    def checked_fingerprint(self) -> str | None:
        """The tenant config whose keys this bucket last checked for offboarded ones."""
        return self._checked_fingerprint

    @checked_fingerprint.setter
    def checked_fingerprint(self, fingerprint: str) -> None:
        if fingerprint != self._checked_fingerprint:
            self._checked_fingerprint = fingerprint
            self._unchanged_blob = None

    @classmethod
    def from_bytes(cls, blob: bytes | None) -> BucketState:
        if not blob:
            return cls()
        layers = _Layers.read(blob)
        metadata = layers.rows.schema.metadata or {}
        checked = metadata.get(_CHECKED_FINGERPRINT)
        rules_by_id = metadata.get(_RULES_BY_ID)
        fingerprint = checked.decode() if checked is not None else None
        rules = orjson.loads(rules_by_id) if rules_by_id is not None else None
        if "key_state_json" in layers.rows.schema.names:
            return cls._from_json_layout(layers.rows, fingerprint, rules)
        state = cls(layers.rows.replace_schema_metadata(None), fingerprint, rules)
        state._readable[layers.stale_rows] = False
        state._frames = _Frames(layers.frames, layers.rows.num_rows)
        state._unchanged_blob = blob
        return state

    @classmethod
    def _from_json_layout(
        cls, table: pa.Table, fingerprint: str | None, rules_by_id: dict[str, Any] | None
    ) -> BucketState:
        """A blob of the earlier layout: a key's state as JSON, its rules inside it or listed by
        id. Every key is decoded, so the next `to_bytes` writes the bucket in this layout."""
        state = cls(None, fingerprint, rules_by_id)
        rows = table.to_pydict()
        rules_ids = rows.get("rules_ids", [None] * len(table))
        deadlines = rows.get("idle_deadline_ms", [None] * len(table))
        for tenant, source, body, quarantined, deadline, ids in zip(
            rows["tenant"],
            rows["source"],
            rows["key_state_json"],
            rows["quarantined_records"],
            deadlines,
            rules_ids,
            strict=True,
        ):
            data = _json(body)
            if ids is not None:
                data["rules"] = {rules_id: state._rules_by_id[rules_id] for rules_id in ids}
            state._decoded[(tenant, source)] = StoredKey(
                KeyState.from_json_dict(data), quarantined, deadline
            )
        return state

    def rows(self) -> pa.Table:
        """Every key's row as a whole blob stores it: the rows carried over in their stored
        order, then those decoded as objects (by key), then those put back as columns.

        Not sorted by key: the order follows from the stored blob and the batch alone, so a
        replayed batch writes the same blob, and sorting every key of a bucket in each batch
        (a million tenants: sixty thousand a bucket) cost nearly as much as encoding them."""
        return _joined_chunks(
            pa.concat_tables(
                [self._stored.filter(pa.array(self._carried())), self._object_rows(), *self._put]
            )
        )

    def to_bytes(self) -> bytes:
        """The bucket's blob: the frames it was read from, as they were, and a frame of the rows
        this batch wrote, while their stale rows and their number stay few
        (`_MAX_STALE_SHARE`, `_MAX_FRAMES`); else the bucket whole."""
        if self._unchanged_blob is not None:
            return self._unchanged_blob
        kept = self._frames
        if kept is not None and kept.rows >= _MIN_LAYERED_ROWS and len(kept.blobs) < _MAX_FRAMES:
            carried = self._carried()
            stale = np.flatnonzero(~carried[: kept.rows])
            if len(stale) <= kept.rows * _MAX_STALE_SHARE:
                # Rows put back as columns in this batch and taken again (`_settle`) are stored
                # past the frames: carried ones go in the new frame with the rest.
                written = pa.concat_tables(
                    [
                        self._stored.slice(kept.rows).filter(pa.array(carried[kept.rows :])),
                        self._object_rows(),
                        *self._put,
                    ]
                )
                # Rules are left behind only when the bucket is written whole: the frames'
                # rows may still use any of them.
                frames = [*kept.blobs, _frame(_joined_chunks(written), self._metadata())]
                header = _LAYERS_HEADER.pack(_LAYERED, len(frames), len(stale))
                lengths = np.array([len(frame) for frame in frames], _LENGTH)
                return b"".join(
                    [header, lengths.tobytes(), *frames, stale.astype(_STALE_ROW).tobytes()]
                )
        rows = self.rows()
        windows = pc.list_flatten(rows["windows"])
        used_rules_ids = set(pc.unique(pc.struct_field(windows, "rules_id")).to_pylist())
        # Rules no window uses any more are left behind.
        self._rules_by_id = {
            rules_id: rules
            for rules_id, rules in self._rules_by_id.items()
            if rules_id in used_rules_ids
        }
        return _frame(rows, self._metadata())

    def _metadata(self) -> dict[bytes, bytes]:
        metadata = {_RULES_BY_ID: orjson.dumps(self._rules_by_id, option=orjson.OPT_SORT_KEYS)}
        if self._checked_fingerprint is not None:
            metadata[_CHECKED_FINGERPRINT] = self._checked_fingerprint.encode()
        return metadata

    def summary_rows(self) -> pa.Table:
        """Every key's `tenant`, `watermark_ms`, `max_event_time_ms` and `open_windows`: what
        the metrics sum up (`key_summary`), without copying any key's windows."""
        carried = pa.array(self._carried())
        tables = [_summary_columns(self._stored).filter(carried)]
        tables += [_summary_columns(put) for put in self._put]
        decoded = [
            (tenant, stored.key_state) for (tenant, _), stored in sorted(self._decoded.items())
        ]
        tables.append(
            pa.table(
                {
                    "tenant": pa.array([tenant for tenant, _ in decoded], pa.string()),
                    "watermark_ms": pa.array([s.watermark_ms for _, s in decoded], pa.int64()),
                    "max_event_time_ms": pa.array(
                        [s.max_event_time_ms for _, s in decoded], pa.int64()
                    ),
                    "open_windows": pa.array([len(s.windows) for _, s in decoded], pa.int32()),
                }
            )
        )
        return pa.concat_tables(tables)

    def __len__(self) -> int:
        return int(self._carried().sum()) + len(self._decoded) + sum(len(p) for p in self._put)

    def keys(self) -> set[Key]:
        """Every key of the bucket (offboarding looks at them all when the config changed)."""
        self._settle()
        carried = pa.array(self._carried())
        tenants, sources = (
            self._stored["tenant"].filter(carried),
            self._stored["source"].filter(carried),
        )
        stored = zip(tenants.to_pylist(), sources.to_pylist(), strict=True)
        return set(stored) | self._decoded.keys()

    # Keys as columns: the hot path.

    def column_keys(self, keys: list[Key], rules_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Which of `keys` can go out as columns: not decoded as objects in this batch, and
        every open window opened with the rules id given for the key (new keys have none).
        Also each key's stored row, for `take_columns` (-1: none)."""
        self._settle()
        positions = self._positions(keys)
        found = np.flatnonzero(positions >= 0)
        windows = self._stored["windows"].take(pa.array(positions[found]))
        counts = pc.list_value_length(windows).to_numpy(zero_copy_only=False)
        window_rules = pc.struct_field(pc.list_flatten(windows), "rules_id")
        wanted = np.repeat(np.array(rules_ids, dtype=object)[found], counts)
        other = ~np.asarray(pc.equal(window_rules, pa.array(wanted, pa.string())), dtype=bool)
        owner = np.repeat(np.arange(len(found)), counts)
        usable = np.ones(len(keys), bool)
        usable[found[np.bincount(owner[other], minlength=len(found)) > 0]] = False
        if self._decoded:
            usable &= np.array([key not in self._decoded for key in keys], bool)
        return usable, positions

    def take_columns(self, keys: list[Key], positions: np.ndarray, metrics: int) -> KeyColumns:
        """These keys' state as columns, in this order; keys not stored start empty.
        `positions` are their rows as `column_keys` found them, which also said that every open
        window of theirs has `metrics` metrics."""
        self._unchanged_blob = None
        self._carried_rows = None
        found = np.flatnonzero(positions >= 0)
        self._taken_rows.append(positions[found])
        rows = self._stored.take(pa.array(positions[found]))
        count = len(keys)

        def column(name: str, default: int) -> np.ndarray:
            values = np.full(count, default, np.int64)
            values[found] = rows[name].to_numpy(zero_copy_only=False) if len(found) else []
            return values

        def times(name: str) -> np.ndarray:
            values = np.full(count, NO_TIME, np.int64)
            values[found] = pc.fill_null(rows[name], NO_TIME).to_numpy() if len(found) else []
            return values

        windows = rows["windows"].combine_chunks() if len(found) else None
        return KeyColumns(
            tenant=np.array([tenant for tenant, _ in keys], dtype=object),
            source=np.array([source for _, source in keys], dtype=object),
            **{name: times(name) for name in [*_TIMES, "idle_deadline_ms"]},
            **{name: column(name, 0) for name in _COUNTERS},
            windows=_window_columns(windows, found, metrics),
        )

    def put_columns(self, keys: KeyColumns, rules_id: str, rules_json: dict[str, Any]) -> None:
        """The new state of keys from `take_columns`, all of whose windows have these rules."""
        self._rules_by_id.setdefault(rules_id, rules_json)
        self._put.append(_key_table(keys, rules_id))

    # Keys as objects: the record-by-record path.

    def get(self, key: Key) -> StoredKey:
        """The key's state, decoded once; a new, empty state for a key not seen before."""
        stored = self._decoded.get(key)
        if stored is None:
            self.decode([key])
            stored = self._decoded[key]
        return stored

    def decode(self, keys: list[Key]) -> None:
        """Decode these keys' states in one pass over their rows (`get` then finds them)."""
        keys = [key for key in keys if key not in self._decoded]
        if not keys:
            return  # a bucket woken only to look at its config keeps its blob as it was
        self._settle()
        self._unchanged_blob = None  # the caller may change what it gets
        self._carried_rows = None
        # Settled: a dropped key's row is gone, so a key dropped and back starts afresh.
        positions = self._positions(keys)
        found = [key for key, at in zip(keys, positions.tolist(), strict=True) if at >= 0]
        rows = self._stored.take(pa.array(positions[positions >= 0])).to_pylist()
        for key, row in zip(found, rows, strict=True):
            self._decoded[key] = StoredKey(
                self._key_state(row), row["quarantined_records"], row["idle_deadline_ms"]
            )
        for key in keys:
            self._decoded.setdefault(key, StoredKey(KeyState()))

    def _settle(self) -> None:
        """Make the readable stored rows exactly the keys' rows not decoded: the rows put back
        as columns join them, and dropped keys' rows leave. A key is then looked up in one place.
        The stored rows are only added to, never copied: the frames' rows stay where they are."""
        if not self._put and not self._dropped:
            return
        put_rows = sum(len(put) for put in self._put)
        self._readable = np.concatenate([self._carried(), np.ones(put_rows, bool)])
        if self._stored_keys is not None:
            self._stored_keys = pa.concat_arrays(
                [self._stored_keys, *(_joined(put["tenant"], put["source"]) for put in self._put)]
            )
        self._stored = pa.concat_tables([self._stored, *self._put])
        self._put, self._taken_rows, self._dropped = [], [], set()
        self._carried_rows = None

    def drop(self, key: Key) -> None:
        self._unchanged_blob = None
        self._carried_rows = None
        self._decoded.pop(key, None)
        self._dropped.add(key)

    def idle_keys(self, processing_time_ms: int) -> list[Key]:
        """Keys whose idle timeout has passed at `processing_time_ms`."""
        self._settle()
        deadlines = self._stored["idle_deadline_ms"]
        passed = pc.fill_null(pc.less_equal(deadlines, processing_time_ms), False)
        due_rows = pa.array(np.flatnonzero(np.asarray(passed, dtype=bool) & self._carried()))
        tenants, sources = (
            self._stored["tenant"].take(due_rows),
            self._stored["source"].take(due_rows),
        )
        due = list(zip(tenants.to_pylist(), sources.to_pylist(), strict=True))
        due += [
            key
            for key, stored in self._decoded.items()
            if stored.idle_deadline_ms is not None and stored.idle_deadline_ms <= processing_time_ms
        ]
        return sorted(due)

    def next_idle_deadline_ms(self) -> int | None:
        columns = [
            self._stored["idle_deadline_ms"].filter(pa.array(self._carried())),
            *(put["idle_deadline_ms"] for put in self._put),
        ]
        deadlines = [pc.min(column).as_py() for column in columns] + [
            stored.idle_deadline_ms for stored in self._decoded.values()
        ]
        return min((d for d in deadlines if d is not None), default=None)

    def _positions(self, keys: Iterable[Key]) -> np.ndarray:
        """Each key's row in the stored table (-1: not stored), looked up column-wise.

        The keys looked up are hashed and every stored row probes them, not the other way: a
        batch looks up a few thousand keys in a bucket of tens of thousands (a million tenants
        in 16 buckets), and hashing every stored key again in each batch cost ten times what
        this does."""
        wanted = list(keys)
        if not wanted or not len(self._stored):
            return np.full(len(wanted), -1, np.int64)
        if self._stored_keys is None:
            self._stored_keys = _joined(self._stored["tenant"], self._stored["source"])
        lookup = _joined(
            pa.array([tenant for tenant, _ in wanted], pa.string()),
            pa.array([source for _, source in wanted], pa.string()),
        )
        # A key asked for twice: each asking finds its one distinct key's row.
        distinct = pc.unique(lookup)
        of_distinct = np.asarray(pc.index_in(lookup, value_set=distinct), dtype=np.int64)
        probed = pc.index_in(self._stored_keys, value_set=distinct)
        rows = np.flatnonzero(np.asarray(pc.is_valid(probed), dtype=bool) & self._readable)
        distinct_rows = np.full(len(distinct), -1, np.int64)
        distinct_rows[np.asarray(probed.take(pa.array(rows)), dtype=np.int64)] = rows
        return distinct_rows[of_distinct]

    def _carried(self) -> np.ndarray:
        """Which stored rows still hold their key's state: readable, and not taken, decoded or
        dropped since."""
        if self._carried_rows is None:
            carried = self._readable.copy()
            stale = self._positions(itertools.chain(self._decoded, self._dropped))
            carried[stale[stale >= 0]] = False
            for taken in self._taken_rows:
                carried[taken] = False
            self._carried_rows = carried
        return self._carried_rows

    def _key_state(self, row: dict[str, Any]) -> KeyState:
        windows = {}
        for window in row["windows"]:
            names = sorted(self._rules_by_id[window["rules_id"]]["metrics"])
            windows[window["window_id"]] = OpenWindow(
                window_id=window["window_id"],
                start_ms=window["start_ms"],
                end_ms=window["end_ms"],
                rules_id=window["rules_id"],
                total=_aggregates(window, "total", names),
                pending=_aggregates(window, "pending", names),
                next_pane_index=window["next_pane_index"],
                on_time_sealed=window["on_time_sealed"],
                had_late_records=window["had_late_records"],
                merged_window_ids=window["merged_window_ids"],
            )
        used = {window.rules_id for window in windows.values()}
        return KeyState(
            **{name: row[name] for name in _TIMES},
            windows=windows,
            rules={rules_id: self._rules_by_id[rules_id] for rules_id in sorted(used)},
            on_time_records=row["on_time_records"],
            late_records=row["late_records"],
            too_late_records=row["too_late_records"],
        )

    def _object_rows(self) -> pa.Table:
        rows = []
        for (tenant, source), stored in sorted(self._decoded.items()):
            state = stored.key_state
            self._rules_by_id.update(state.rules)
            windows = sorted(state.windows.values(), key=lambda w: (w.start_ms, w.end_ms))
            rows.append(
                {
                    "tenant": tenant,
                    "source": source,
                    **{name: getattr(state, name) for name in _TIMES},
                    "on_time_records": state.on_time_records,
                    "late_records": state.late_records,
                    "too_late_records": state.too_late_records,
                    "quarantined_records": stored.quarantined_records,
                    "idle_deadline_ms": stored.idle_deadline_ms,
                    "windows": [self._window_row(window) for window in windows],
                }
            )
        return pa.Table.from_pylist(rows, schema=_SCHEMA)

    def _window_row(self, window: OpenWindow) -> dict[str, Any]:
        names = sorted(self._rules_by_id[window.rules_id]["metrics"])
        return {
            "window_id": window.window_id,
            "start_ms": window.start_ms,
            "end_ms": window.end_ms,
            "rules_id": window.rules_id,
            "next_pane_index": window.next_pane_index,
            "on_time_sealed": window.on_time_sealed,
            "had_late_records": window.had_late_records,
            **_aggregate_row(window.total, "total", names),
            **_aggregate_row(window.pending, "pending", names),
            "merged_window_ids": list(window.merged_window_ids),
        }


def _aggregates(window: dict[str, Any], prefix: str, names: list[str]) -> Aggregates:
    values, seen = window[f"{prefix}_values"], window[f"{prefix}_seen"]
    return Aggregates(
        window[f"{prefix}_count"],
        {name: [values[n], seen[n]] for n, name in enumerate(names) if seen[n] > 0},
    )


def _aggregate_row(aggregates: Aggregates, prefix: str, names: list[str]) -> dict[str, Any]:
    folded = [aggregates.metrics.get(name, [0.0, 0]) for name in names]
    return {
        f"{prefix}_count": aggregates.count,
        f"{prefix}_values": [float(value) for value, _ in folded],
        f"{prefix}_seen": [int(seen) for _, seen in folded],
    }


def _window_columns(windows: pa.ListArray | None, found: np.ndarray, metrics: int) -> WindowColumns:
    """The open windows of the keys found, as columns; `found[i]` is the key of row i."""
    if windows is None:
        return WindowColumns.empty(metrics)
    counts = pc.list_value_length(windows).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(windows)

    def field(name: str) -> np.ndarray:
        return np.asarray(pc.struct_field(flat, name).to_numpy(zero_copy_only=False))

    def aggregates(prefix: str) -> AggregateColumns:
        shape = (len(flat), metrics)
        return AggregateColumns(
            field(f"{prefix}_count").astype(np.int64),
            pc.list_flatten(pc.struct_field(flat, f"{prefix}_values")).to_numpy().reshape(shape),
            pc.list_flatten(pc.struct_field(flat, f"{prefix}_seen")).to_numpy().reshape(shape),
        )

    return WindowColumns(
        np.repeat(found, counts).astype(np.int64),
        field("start_ms").astype(np.int64),
        field("end_ms").astype(np.int64),
        field("next_pane_index").astype(np.int64),
        field("on_time_sealed").astype(bool),
        field("had_late_records").astype(bool),
        aggregates("total"),
        aggregates("pending"),
    )


def _key_table(keys: KeyColumns, rules_id: str) -> pa.Table:
    windows = keys.windows
    count, metrics = windows.total.values.shape
    start, end = pa.array(windows.start_ms, pa.int64()), pa.array(windows.end_ms, pa.int64())
    per_window = pa.array(np.arange(count + 1, dtype=np.int32) * metrics)

    def aggregates(prefix: str, aggregates: AggregateColumns) -> list[pa.Array]:
        return [
            pa.array(aggregates.count, pa.int64()),
            pa.ListArray.from_arrays(per_window, pa.array(aggregates.values.ravel(), pa.float64())),
            pa.ListArray.from_arrays(per_window, pa.array(aggregates.seen.ravel(), pa.int64())),
        ]

    struct = pa.StructArray.from_arrays(
        [
            window_ids(windows.start_ms, windows.end_ms),
            start,
            end,
            pa.array(np.full(count, rules_id, dtype=object), pa.string()),
            pa.array(windows.next_pane_index, pa.int64()),
            pa.array(windows.on_time_sealed, pa.bool_()),
            pa.array(windows.had_late_records, pa.bool_()),
            *aggregates("total", windows.total),
            *aggregates("pending", windows.pending),
            pa.ListArray.from_arrays(
                pa.array(np.zeros(count + 1, np.int32)), pa.array([], pa.string())
            ),
        ],
        fields=list(_WINDOW),
    )
    offsets = np.r_[0, np.cumsum(np.bincount(windows.key, minlength=len(keys.tenant)))]
    columns: dict[str, pa.Array] = {
        "tenant": pa.array(keys.tenant, pa.string()),
        "source": pa.array(keys.source, pa.string()),
    }
    for name in [*_TIMES, "idle_deadline_ms"]:
        columns[name] = optional_times(getattr(keys, name))
    for name in _COUNTERS:
        columns[name] = pa.array(getattr(keys, name), pa.int64())
    columns["windows"] = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), struct)
    return pa.Table.from_arrays([columns[name] for name in _SCHEMA.names], schema=_SCHEMA)


def _joined_chunks(rows: pa.Table) -> pa.Table:
    # Each batch adds a chunk or two, each an IPC record batch in the blob: joined once there
    # are a few, so that a bucket's blob does not grow a batch per micro-batch.
    return rows.combine_chunks() if rows["tenant"].num_chunks > _MAX_CHUNKS else rows


def _summary_columns(rows: pa.Table) -> pa.Table:
    return pa.table(
        {
            "tenant": rows["tenant"],
            "watermark_ms": rows["watermark_ms"],
            "max_event_time_ms": rows["max_event_time_ms"],
            "open_windows": pc.list_value_length(rows["windows"]),
        }
    )


def _joined(tenants: pa.Array | pa.ChunkedArray, sources: pa.Array | pa.ChunkedArray) -> pa.Array:
    # Identifiers never hold a NUL (`tenants.models.ID_PATTERN`), so the join is one-to-one.
    joined = pc.binary_join_element_wise(tenants, sources, "\x00")
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined


def _json(key_state_json: str) -> Any:
    try:
        return orjson.loads(key_state_json)
    except orjson.JSONDecodeError:
        # State written by the standard library's json may spell an overflowed sum as
        # `Infinity`, which orjson does not read.
        return json.loads(key_state_json)
