"""The state of one hash bucket of keys: every (tenant, source) key's `KeyState` in one value.

`applyInPandasWithState` pays a fixed cost per group, so the stream groups by a hash bucket of
the key rather than by the key: 10,000 keys cost 64 group calls a batch, not 10,000. A bucket's
state is one Arrow IPC blob with a row per key. Only the keys a batch touches are decoded and
encoded again; the others are carried over as the bytes they were. `idle_deadline_ms` lets a
batch find the keys whose idle timeout has passed without decoding any state, and
`checked_fingerprint` (kept in the blob's schema metadata) lets it skip looking for keys whose
config is gone while the tenant config has not changed.

The window rules a key's open windows were opened with (`KeyState.rules`) are the same for most
keys of a bucket: they are kept once per bucket, by rules id, and each key lists the ids it uses.
Stored in every key, they were 40% of a key's state, encoded and decoded with it each batch.

Pure: pyarrow only, no Spark.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from streaming.windowing import KeyState

STATE_LAYOUT = 2
"""Layout 1 kept one state row per key; layout 2 keeps one per bucket. See `checkpoint_identity`."""

Key = tuple[str, str]

# Schema metadata, not columns: one value per bucket. Blobs written before they existed read back
# as "never checked", and with each key's rules inside its state.
_CHECKED_FINGERPRINT = b"checked_config_fingerprint"
_RULES_BY_ID = b"rules_by_id_json"

# The keys' JSON shrinks about 15x for a tenth of a second per 100 MB (zstd): the state store
# keeps a bucket's blob in memory for each retained version and writes it to the checkpoint in
# every batch that touches it (at 100,000 tenants, 244 MB of state store memory became 16 MB).
# Readers decompress whatever the blob says it is, so uncompressed blobs still read.
_COMPRESSED = pa.ipc.IpcWriteOptions(compression="zstd")

_SCHEMA = pa.schema(
    [
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("key_state_json", pa.large_string(), nullable=False),
        pa.field("quarantined_records", pa.int64(), nullable=False),
        pa.field("idle_deadline_ms", pa.int64()),
        # Null: the key's rules are inside `key_state_json` (blobs from before rules per bucket).
        pa.field("rules_ids", pa.list_(pa.string())),
    ]
)


@dataclass
class StoredKey:
    """One key's state as the bucket stores it."""

    key_state: KeyState
    quarantined_records: int = 0
    idle_deadline_ms: int | None = None
    """When the key's idle timeout fires, if it has open windows and an idle timeout."""


class BucketState:
    """The keys of one bucket: read with `from_bytes`, decode with `decode`/`get`, `drop`.

    The keys a batch does not touch stay in the Arrow table they were read in, and go back out
    by a filter and a concatenation: a bucket of 3,000 keys that a batch touches 10 of costs
    Python work for 10 keys, not 3,000 (at 100,000 tenants most keys sit out most batches).
    """

    def __init__(
        self,
        stored: pa.Table | None = None,
        checked_fingerprint: str | None = None,
        rules_by_id: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self._stored = stored if stored is not None else _SCHEMA.empty_table()
        """The rows read; those of keys in `_decoded` or `_dropped` are stale."""
        self._stored_keys: pa.Array | None = None
        self._carried_rows: pa.BooleanArray | None = None
        """`_carried()`, until `decode` or `drop` changes which rows are stale."""
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
        table = pa.ipc.open_stream(blob).read_all()
        metadata = table.schema.metadata or {}
        # Blobs written before a column existed read it as nulls.
        stored = pa.table(
            [
                table.column(name)
                if name in table.schema.names
                else pa.nulls(len(table), _SCHEMA.field(name).type)
                for name in _SCHEMA.names
            ],
            schema=_SCHEMA,
        )
        checked = metadata.get(_CHECKED_FINGERPRINT)
        rules_by_id = metadata.get(_RULES_BY_ID)
        state = cls(
            stored,
            checked.decode() if checked is not None else None,
            orjson.loads(rules_by_id) if rules_by_id is not None else None,
        )
        state._unchanged_blob = blob
        return state

    def to_bytes(self) -> bytes:
        if self._unchanged_blob is not None:
            return self._unchanged_blob
        touched = sorted(self._decoded)
        bodies = []
        for key in touched:
            body = self._decoded[key].key_state.to_json_dict()
            self._rules_by_id.update(body.pop("rules"))
            bodies.append(body)
        changed = pa.table(
            [
                [tenant for tenant, _ in touched],
                [source for _, source in touched],
                [orjson.dumps(body).decode() for body in bodies],
                [self._decoded[key].quarantined_records for key in touched],
                [self._decoded[key].idle_deadline_ms for key in touched],
                [list(self._decoded[key].key_state.rules) for key in touched],
            ],
            schema=_SCHEMA,
        )
        rows = pa.concat_tables([self._stored.filter(self._carried()), changed])
        rows = rows.take(pc.sort_indices(rows, [("tenant", "ascending"), ("source", "ascending")]))
        used_rules_ids = set(pc.unique(pc.list_flatten(rows["rules_ids"])).to_pylist())
        # Rules no key uses any more are left behind.
        self._rules_by_id = {
            rules_id: rules
            for rules_id, rules in self._rules_by_id.items()
            if rules_id in used_rules_ids
        }
        metadata = {_RULES_BY_ID: orjson.dumps(self._rules_by_id, option=orjson.OPT_SORT_KEYS)}
        if self._checked_fingerprint is not None:
            metadata[_CHECKED_FINGERPRINT] = self._checked_fingerprint.encode()
        schema = _SCHEMA.with_metadata(metadata)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema, options=_COMPRESSED) as writer:
            writer.write_table(rows.replace_schema_metadata(metadata))
        return bytes(sink.getvalue())

    def __len__(self) -> int:
        return int(pc.sum(self._carried()).as_py() or 0) + len(self._decoded)

    def keys(self) -> set[Key]:
        carried = self._stored.filter(self._carried())
        stored = zip(carried["tenant"].to_pylist(), carried["source"].to_pylist(), strict=True)
        return set(stored) | self._decoded.keys()

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
        self._unchanged_blob = None  # the caller may change what it gets
        self._carried_rows = None
        positions = self._positions([key for key in keys if key not in self._dropped])
        found = [key for key, position in positions.items() if position is not None]
        rows = self._stored.take(
            pa.array([positions[key] for key in found], pa.int64())
        ).to_pydict()
        for number, key in enumerate(found):
            rules_ids = rows["rules_ids"][number]
            self._decoded[key] = StoredKey(
                KeyState.from_json_dict(
                    self._key_state_json(rows["key_state_json"][number], rules_ids)
                ),
                rows["quarantined_records"][number],
                rows["idle_deadline_ms"][number],
            )
        for key in keys:
            self._dropped.discard(key)
            self._decoded.setdefault(key, StoredKey(KeyState()))

    def _key_state_json(self, key_state_json: str, rules_ids: list[str] | None) -> Any:
        body = _decode(key_state_json)
        if rules_ids is not None:
            body["rules"] = {rules_id: self._rules_by_id[rules_id] for rules_id in rules_ids}
        return body

    def drop(self, key: Key) -> None:
        self._unchanged_blob = None
        self._carried_rows = None
        self._decoded.pop(key, None)
        self._dropped.add(key)

    def idle_keys(self, processing_time_ms: int) -> list[Key]:
        """Keys whose idle timeout has passed at `processing_time_ms`."""
        deadlines = self._stored["idle_deadline_ms"]
        due_rows = pc.and_(pc.less_equal(deadlines, processing_time_ms), self._carried())
        due_table = self._stored.filter(pc.fill_null(due_rows, False))
        due = list(
            zip(due_table["tenant"].to_pylist(), due_table["source"].to_pylist(), strict=True)
        )
        due += [
            key
            for key, stored in self._decoded.items()
            if stored.idle_deadline_ms is not None and stored.idle_deadline_ms <= processing_time_ms
        ]
        return sorted(due)

    def next_idle_deadline_ms(self) -> int | None:
        carried = self._stored["idle_deadline_ms"].filter(self._carried())
        deadlines = [pc.min(carried).as_py()] + [
            stored.idle_deadline_ms for stored in self._decoded.values()
        ]
        return min((d for d in deadlines if d is not None), default=None)

    def _positions(self, keys: Iterable[Key]) -> dict[Key, int | None]:
        """Each key's row in the stored table (None: not stored), looked up column-wise."""
        if self._stored_keys is None:
            self._stored_keys = _joined(self._stored["tenant"], self._stored["source"])
        wanted = list(keys)
        lookup = _joined(
            pa.array([tenant for tenant, _ in wanted], pa.string()),
            pa.array([source for _, source in wanted], pa.string()),
        )
        found = pc.index_in(lookup, value_set=self._stored_keys).to_pylist()
        return dict(zip(wanted, found, strict=True))

    def _carried(self) -> pa.BooleanArray:
        """Which stored rows still hold their key's state: not decoded since, nor dropped."""
        if self._carried_rows is None:
            carried = np.ones(len(self._stored), dtype=bool)
            stale = self._positions(itertools.chain(self._decoded, self._dropped)).values()
            carried[[position for position in stale if position is not None]] = False
            self._carried_rows = pa.array(carried)
        return self._carried_rows


def _joined(tenants: pa.Array | pa.ChunkedArray, sources: pa.Array | pa.ChunkedArray) -> pa.Array:
    # Identifiers never hold a NUL (`tenants.models.ID_PATTERN`), so the join is one-to-one.
    joined = pc.binary_join_element_wise(tenants, sources, "\x00")
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined


def _decode(key_state_json: str) -> Any:
    try:
        return orjson.loads(key_state_json)
    except orjson.JSONDecodeError:
        # State written by the standard library's json may spell an overflowed sum as
        # `Infinity`, which orjson does not read.
        return json.loads(key_state_json)
