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

import json
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

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


@dataclass
class _Row:
    key_state_json: str
    """`KeyState.to_json_dict()` without its `rules`, unless `rules_ids` is None."""
    quarantined_records: int
    idle_deadline_ms: int | None
    rules_ids: list[str] | None


class BucketState:
    """The keys of one bucket; decode with `from_bytes`, change with `get`/`put`/`drop`."""

    def __init__(
        self,
        rows: dict[Key, _Row] | None = None,
        checked_fingerprint: str | None = None,
        rules_by_id: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self._rows: dict[Key, _Row] = rows or {}
        # Shared by the decoded keys' `KeyState.rules`, which only read them.
        self._rules_by_id: dict[str, dict[str, Any]] = rules_by_id or {}
        self._decoded: dict[Key, StoredKey] = {}
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
        columns = [
            table.column(name).to_pylist() if name in table.schema.names else [None] * len(table)
            for name in _SCHEMA.names
        ]
        checked = metadata.get(_CHECKED_FINGERPRINT)
        rules_by_id = metadata.get(_RULES_BY_ID)
        state = cls(
            {(tenant, source): _Row(*row) for tenant, source, *row in zip(*columns, strict=True)},
            checked.decode() if checked is not None else None,
            orjson.loads(rules_by_id) if rules_by_id is not None else None,
        )
        state._unchanged_blob = blob
        return state

    def to_bytes(self) -> bytes:
        if self._unchanged_blob is not None:
            return self._unchanged_blob
        for key, stored in self._decoded.items():
            body = stored.key_state.to_json_dict()
            rules = body.pop("rules")
            self._rules_by_id.update(rules)
            self._rows[key] = _Row(
                orjson.dumps(body).decode(),
                stored.quarantined_records,
                stored.idle_deadline_ms,
                list(rules),
            )
        self._decoded.clear()
        keys = sorted(self._rows)
        rows = [self._rows[key] for key in keys]
        used_rules_ids = {rules_id for row in rows for rules_id in row.rules_ids or ()}
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
        table = pa.table(
            [
                [tenant for tenant, _ in keys],
                [source for _, source in keys],
                [row.key_state_json for row in rows],
                [row.quarantined_records for row in rows],
                [row.idle_deadline_ms for row in rows],
                [row.rules_ids for row in rows],
            ],
            schema=schema,
        )
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema, options=_COMPRESSED) as writer:
            writer.write_table(table)
        return bytes(sink.getvalue())

    def __len__(self) -> int:
        return len(self._rows.keys() | self._decoded.keys())

    def keys(self) -> set[Key]:
        return self._rows.keys() | self._decoded.keys()

    def get(self, key: Key) -> StoredKey:
        """The key's state, decoded once; a new, empty state for a key not seen before."""
        stored = self._decoded.get(key)
        if stored is None:
            self._unchanged_blob = None  # the caller may change what it gets
            row = self._rows.pop(key, None)
            stored = (
                StoredKey(KeyState())
                if row is None
                else StoredKey(
                    KeyState.from_json_dict(self._key_state_json(row)),
                    row.quarantined_records,
                    row.idle_deadline_ms,
                )
            )
            self._decoded[key] = stored
        return stored

    def _key_state_json(self, row: _Row) -> Any:
        body = _decode(row.key_state_json)
        if row.rules_ids is not None:
            body["rules"] = {rules_id: self._rules_by_id[rules_id] for rules_id in row.rules_ids}
        return body

    def drop(self, key: Key) -> None:
        self._unchanged_blob = None
        self._rows.pop(key, None)
        self._decoded.pop(key, None)

    def idle_keys(self, processing_time_ms: int) -> list[Key]:
        """Keys whose idle timeout has passed at `processing_time_ms`."""
        due = [
            key
            for key, row in self._rows.items()
            if row.idle_deadline_ms is not None and row.idle_deadline_ms <= processing_time_ms
        ]
        due += [
            key
            for key, stored in self._decoded.items()
            if stored.idle_deadline_ms is not None and stored.idle_deadline_ms <= processing_time_ms
        ]
        return sorted(due)

    def next_idle_deadline_ms(self) -> int | None:
        deadlines = [row.idle_deadline_ms for row in self._rows.values()] + [
            stored.idle_deadline_ms for stored in self._decoded.values()
        ]
        return min((d for d in deadlines if d is not None), default=None)


def _decode(key_state_json: str) -> Any:
    try:
        return orjson.loads(key_state_json)
    except orjson.JSONDecodeError:
        # State written by the standard library's json may spell an overflowed sum as
        # `Infinity`, which orjson does not read.
        return json.loads(key_state_json)
