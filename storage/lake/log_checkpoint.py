"""A checkpoint of a table's log, written a batch of actions at a time.

delta-rs writes a checkpoint from a loaded snapshot: every file's `add` in memory at once, and at
a million files a table it held gigabytes while doing it. A checkpoint is the newest checkpoint
with the commits after it applied, and both can be read in pieces: the commits after it are read
newest first, so the first action met on a path is its last (a live file or a tombstone), and
the older checkpoint's rows are then copied batch by batch, minus what those commits replaced.
The memory this takes is a batch of rows and the set of paths those commits touched.

It writes the classic single-file checkpoint, in the schema of the checkpoint it starts from
(delta-rs's, which Spark reads too). It declines (returns False; the caller has delta-rs write
the checkpoint) where that is not enough: no earlier checkpoint, a multi-part or V2 one, or
actions it would have to understand (deletion vectors, file tags, domain metadata, a change of
the partition columns).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import unquote

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from storage.lake.checkpoint_tenants import SORTED_RUN_ROWS, ranges_metadata, sorted_row_groups
from storage.lake.delta_log import (
    Action,
    DeltaLog,
    checkpoint_metadata,
    interval_ms,
    table_configuration,
)
from storage.lake.tables import tenant_partition_column

BATCH_ROWS = 50_000
"""Rows read from the older checkpoint, or gathered from the commits, before each write."""
_JSON_BLOCK_BYTES = 16 << 20
"""A commit's lines are parsed this many bytes at a time: a settle's commit at a million keys
was 1.5 GB."""
DEFAULT_TOMBSTONE_RETENTION_MS = 7 * 24 * 3_600_000
"""Delta's default `delta.deletedFileRetentionDuration`: tombstones older are dropped."""


class _DeclinedError(Exception):
    """The log holds something this writer does not apply."""


def write_checkpoint(delta_log: DeltaLog, version: int | None = None) -> bool:
    """Write the checkpoint of `version` (None: the newest) and point `_last_checkpoint` at
    it; False, writing nothing, where this writer declines (see the module's doc)."""
    base_version = delta_log.checkpointed_version()
    if base_version is None or base_version < 0:
        return False
    if version is None:
        version = delta_log.newest_version_after(base_version)
    if base_version >= version:
        return base_version == version
    base = delta_log.open_checkpoint(base_version)
    schema = base.schema_arrow
    if "checkpointMetadata" in schema.names or _any_valid(base, "sidecar"):
        return False
    # The retention the older checkpoint's metadata sets: a change of it since applies from
    # the next checkpoint on.
    metadata = checkpoint_metadata(base)
    cutoff_ms = int(time.time() * 1000) - _tombstone_retention_ms(metadata)
    # The older checkpoint's partitioning: should the commits since change it, the ranges
    # name a column the new metadata does not partition by, and readers do not use them.
    partition_columns = tuple((metadata or {}).get("partitionColumns") or ())
    tenant_column = tenant_partition_column(partition_columns)
    tail = _Tail(delta_log, base_version + 1, version, schema, partition_columns)
    path = delta_log.checkpoint_file(version)
    try:
        with _Writer(delta_log, path, schema, cutoff_ms, tenant_column) as writer:
            for table in tail.tables():
                writer.write(table)
            for batch in base.iter_batches(batch_size=BATCH_ROWS):
                writer.write(pa.Table.from_batches([tail.unreplaced(batch)], schema))
    except _DeclinedError:
        return False
    delta_log.write_file(
        "_last_checkpoint",
        orjson.dumps(
            {
                "version": version,
                "size": writer.actions,
                "sizeInBytes": delta_log.filesystem.get_file_info(path).size,
                "numOfAddFiles": writer.adds,
            }
        ),
    )
    return True


@dataclass
class _Tail:
    """The commits after the older checkpoint, read newest first: the first action met on a
    path is its last word (a live file, or a tombstone), and so on for transaction ids,
    metadata and protocol.

    A commit's file actions (a settle's are tens of thousands) are parsed column-wise by
    pyarrow's JSON reader, in the checkpoint's types; its few others a line at a time."""

    delta_log: DeltaLog
    first: int
    last: int
    schema: pa.Schema
    """The checkpoint's."""
    partition_columns: tuple[str, ...]
    """The table's, which name the keys of each file action's `partitionValues`."""
    touched: set[str] = field(default_factory=set)
    """Every path an action of these commits names (decoded): the older checkpoint's row of
    such a path is replaced."""
    app_ids: set[str] = field(default_factory=set)
    replaced: set[str] = field(default_factory=set)
    """`metaData` and `protocol`, where these commits hold a newer one."""

    def tables(self) -> Iterator[pa.Table]:
        """The commits' surviving actions as checkpoint rows, at least `BATCH_ROWS` a table
        but for the last (the writer sorts what it is given together: a table per commit would
        scatter a tenant's rows over more row groups). Fills `touched`, `app_ids` and
        `replaced` as it goes: `unreplaced` is for after."""
        pending: list[pa.Table] = []
        pending_rows = 0
        for table in self._commit_tables():
            pending.append(table)
            pending_rows += table.num_rows
            if pending_rows >= BATCH_ROWS:
                yield pa.concat_tables(pending)
                pending, pending_rows = [], 0
        if pending:
            yield pa.concat_tables(pending)

    def _commit_tables(self) -> Iterator[pa.Table]:
        for version in range(self.last, self.first - 1, -1):
            others = self.delta_log.actions(version, with_files=False)
            if others is None:
                raise RuntimeError(f"{self.delta_log.table_uri}: commit {version} is missing")
            rows = [row for action in others if (row := self._surviving(action)) is not None]
            yield from _tables_of(rows, self.schema)
            yield from self._file_actions(version)

    def _surviving(self, action: Action) -> Action | None:
        if "domainMetadata" in action or "checkpointMetadata" in action:
            raise _DeclinedError
        if (txn := action.get("txn")) is not None:
            if txn["appId"] in self.app_ids:
                return None
            self.app_ids.add(txn["appId"])
            return {"txn": txn}
        # The file actions' partition values are read as these columns' values.
        partition_columns = action.get("metaData", {}).get("partitionColumns")
        if partition_columns is not None and tuple(partition_columns) != self.partition_columns:
            raise _DeclinedError
        for kind in ("metaData", "protocol"):
            if kind in action and kind not in self.replaced:
                self.replaced.add(kind)
                return {kind: action[kind]}
        return None

    def _file_actions(self, version: int) -> Iterator[pa.Table]:
        """Commit `version`'s `add` and `remove` actions that survive, as checkpoint rows."""
        stream = self.delta_log.filesystem.open_input_stream(self.delta_log.commit_file(version))
        try:
            with stream:
                reader = pa_json.open_json(
                    stream,
                    read_options=pa_json.ReadOptions(block_size=_JSON_BLOCK_BYTES),
                    parse_options=pa_json.ParseOptions(
                        explicit_schema=self._json_schema, unexpected_field_behavior="ignore"
                    ),
                )
                for batch in reader:
                    yield from self._surviving_files(batch)
        except pa.ArrowInvalid as error:
            # A line the JSON reader cannot type as the checkpoint's fields.
            raise _DeclinedError from error

    def _surviving_files(self, batch: pa.RecordBatch) -> Iterator[pa.Table]:
        keep = []
        # A set lookup a row, in the commit's order: the first action met on a path wins.
        for path in _file_paths(batch).to_pylist():
            surviving = path is not None and path not in self.touched
            if surviving:
                self.touched.add(path)
            keep.append(surviving)
        batch = batch.filter(pa.array(keep, pa.bool_()))
        for kind in ("add", "remove"):
            actions = batch.column(kind).drop_null()
            if not len(actions):
                continue
            column = _checkpoint_struct(
                actions, self.schema.field(kind).type, self.partition_columns
            )
            yield _table_of_kind(kind, column, self.schema)

    @cached_property
    def _json_schema(self) -> pa.Schema:
        return pa.schema(
            [
                (kind, _json_type(self.schema.field(kind).type, self.partition_columns))
                for kind in ("add", "remove")
            ]
        )

    def unreplaced(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The older checkpoint's rows these commits did not replace."""
        keep = pc.invert(pc.fill_null(self._path_touched(batch), False))
        if self.app_ids:
            app_id = pc.struct_field(batch.column("txn"), "appId")
            touched_app = pc.fill_null(pc.is_in(app_id, self._app_id_array), False)
            keep = pc.and_(keep, pc.invert(touched_app))
        for kind in self.replaced:
            keep = pc.and_(keep, pc.is_null(batch.column(kind)))
        return batch.filter(keep)

    def _path_touched(self, batch: pa.RecordBatch) -> pa.Array:
        return pc.is_in(_file_paths(batch), self._touched_array)

    # Built once, for every batch of the older checkpoint, after `rows` has filled the sets.
    @cached_property
    def _touched_array(self) -> pa.Array:
        return pa.array(self.touched, pa.string())

    @cached_property
    def _app_id_array(self) -> pa.Array:
        return pa.array(self.app_ids, pa.string())


class _Writer:
    """The checkpoint file, written beside under a name no reader takes for a checkpoint and
    moved into place once whole (on S3, a copy: the object appears whole or not at all).
    Tombstones deleted before `cutoff_ms` are left out. With a `tenant_column`, rows are
    written sorted by tenant a run at a time, with each row group's tenants recorded
    (`checkpoint_tenants`)."""

    def __init__(
        self,
        delta_log: DeltaLog,
        path: str,
        schema: pa.Schema,
        cutoff_ms: int,
        tenant_column: str | None,
    ) -> None:
        self._delta_log = delta_log
        self._path = path
        self._written = delta_log.beside(path.rpartition("/")[2])
        self._sink = delta_log.filesystem.open_output_stream(self._written)
        self._parquet = pq.ParquetWriter(self._sink, schema)
        self._cutoff_ms = cutoff_ms
        self._tenant_column = tenant_column
        self._run: list[pa.Table] = []
        self._run_rows = 0
        self._ranges: list[list[str] | None] = []
        self.actions = 0
        self.adds = 0

    def write(self, table: pa.Table) -> None:
        deleted_ms = pc.struct_field(table.column("remove"), "deletionTimestamp")
        expired = pc.fill_null(pc.less(deleted_ms, self._cutoff_ms), False)
        table = table.filter(pc.invert(expired))
        if table.num_rows == 0:
            return
        self.actions += table.num_rows
        self.adds += table.num_rows - table.column("add").null_count
        if self._tenant_column is None:
            self._parquet.write_table(table)
            return
        self._run.append(table)
        self._run_rows += table.num_rows
        if self._run_rows >= SORTED_RUN_ROWS:
            self._write_run(self._tenant_column)

    def _write_run(self, tenant_column: str) -> None:
        if not self._run:
            return
        run = pa.concat_tables(self._run)
        self._run, self._run_rows = [], 0
        for row_group, tenants in sorted_row_groups(run, tenant_column):
            self._parquet.write_table(row_group)
            self._ranges.append(tenants)

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, error_type: object, error: object, traceback: object) -> None:
        if error_type is None and self._tenant_column is not None:
            self._write_run(self._tenant_column)
            self._parquet.add_key_value_metadata(ranges_metadata(self._tenant_column, self._ranges))
        self._parquet.close()
        self._sink.close()
        if error_type is not None:
            self._delta_log.filesystem.delete_file(self._written)
            return
        self._delta_log.filesystem.move(self._written, self._path)


def _json_type(struct_type: pa.StructType, partition_columns: tuple[str, ...]) -> pa.StructType:
    """The type pyarrow's JSON reader reads a file action as: the checkpoint's fields, with
    `partitionValues` a struct of the partition columns (the reader has no maps) and every
    other map or struct an empty struct, which says only whether the action has one."""
    fields = []
    for child in struct_type:
        if child.name == "partitionValues":
            fields.append(
                (child.name, pa.struct([(name, pa.string()) for name in partition_columns]))
            )
        elif pa.types.is_map(child.type) or pa.types.is_struct(child.type):
            fields.append((child.name, pa.struct([])))
        else:
            fields.append((child.name, child.type))
    return pa.struct(fields)


def _checkpoint_struct(
    actions: pa.StructArray, struct_type: pa.StructType, partition_columns: tuple[str, ...]
) -> pa.StructArray:
    """File actions read by `_json_type` in the checkpoint's `struct_type`. Declines actions
    with a value this writer would drop (tags, deletion vectors): delta-rs then writes the
    checkpoint."""
    children = []
    for child in struct_type:
        values = actions.field(child.name)
        if child.name == "partitionValues":
            children.append(_map_of(values, partition_columns, child.type))
        elif pa.types.is_map(child.type) or pa.types.is_struct(child.type):
            if values.null_count < len(values):
                raise _DeclinedError
            children.append(_nulls(len(values), child.type))
        else:
            children.append(values)
    return pa.StructArray.from_arrays(children, fields=list(struct_type))


def _map_of(values: pa.StructArray, keys: tuple[str, ...], map_type: pa.MapType) -> pa.MapArray:
    """A struct of string fields `keys` as a map from each key to its value, every key in each
    row (a null value included); a null struct as a null map."""
    rows, width = len(values), len(keys)
    # Row-major: row r's value for key k is at r * width + k.
    columns = (
        pa.concat_arrays([values.field(index) for index in range(width)])
        if width
        else pa.array([], pa.string())
    )
    order = (np.arange(width)[None, :] * rows + np.arange(rows)[:, None]).ravel()
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * width)
    return pa.MapArray.from_arrays(
        offsets,
        pa.array(np.tile(np.array(keys, dtype=object), rows), pa.string()),
        columns.take(pa.array(order, pa.int64())),
        type=map_type,
        mask=values.is_null() if values.null_count else None,
    )


def _file_paths(batch: pa.RecordBatch) -> pa.Array:
    """Each row's `add` or `remove` path (null for other actions), decoded as `unquote` would:
    the log URI-escapes them."""
    paths = pc.coalesce(
        pc.struct_field(batch.column("add"), "path"),
        pc.struct_field(batch.column("remove"), "path"),
    )
    if not pc.any(pc.fill_null(pc.match_substring(paths, "%"), False)).as_py():
        return paths
    return pa.array(
        [None if path is None else unquote(path) for path in paths.to_pylist()], pa.string()
    )


def _tables_of(rows: list[Action], schema: pa.Schema) -> Iterator[pa.Table]:
    """Log actions as checkpoint rows of `schema`, a table per kind of action (a checkpoint's
    rows are a set: their order means nothing). Built a field at a time: for the few actions
    besides files (`_Tail._file_actions` reads those)."""
    by_kind: dict[str, list[Action]] = {}
    for row in rows:
        ((kind, action),) = row.items()
        by_kind.setdefault(kind, []).append(action)
    for kind, actions in by_kind.items():
        yield _table_of_kind(kind, _struct_column(actions, schema.field(kind).type), schema)


def _table_of_kind(kind: str, column: pa.StructArray, schema: pa.Schema) -> pa.Table:
    """Checkpoint rows of one kind of action: `column` in its kind's column, the others null."""
    return pa.table(
        [
            column if name == kind else _nulls(len(column), schema.field(name).type)
            for name in schema.names
        ],
        schema=schema,
    )


def _struct_column(actions: list[Action], struct_type: pa.StructType) -> pa.StructArray:
    fields = [struct_type.field(index) for index in range(struct_type.num_fields)]
    return pa.StructArray.from_arrays(
        [
            _field_array([action.get(field.name) for action in actions], field.type)
            for field in fields
        ],
        fields=fields,
    )


def _nulls(count: int, value_type: pa.DataType) -> pa.Array:
    # Not `pa.nulls`: a null struct's non-nullable fields must still hold values.
    return pa.array([None] * count, type=value_type)


def _field_array(values: list[Any], value_type: pa.DataType) -> pa.Array:
    if isinstance(value_type, pa.MapType):
        # A commit's maps are JSON objects; Arrow takes key-value pairs.
        values = [None if value is None else list(value.items()) for value in values]
    elif isinstance(value_type, pa.StructType | pa.ListType):
        values = [_value(value, value_type) for value in values]
    return pa.array(values, type=value_type)


def _value(value: Any, value_type: pa.DataType) -> Any:
    """A log action's nested value in Arrow's Python form: maps as key-value pairs, fields
    the checkpoint has no column for left out."""
    if value is None:
        return None
    if isinstance(value_type, pa.StructType):
        names = {value_type.field(index).name: index for index in range(value_type.num_fields)}
        return {
            key: _value(item, value_type.field(names[key]).type)
            for key, item in value.items()
            if key in names
        }
    if isinstance(value_type, pa.MapType):
        return [(key, _value(item, value_type.item_type)) for key, item in value.items()]
    if isinstance(value_type, pa.ListType):
        return [_value(item, value_type.value_type) for item in value]
    return value


def _any_valid(checkpoint: pq.ParquetFile, column: str) -> bool:
    if column not in checkpoint.schema_arrow.names:
        return False
    values = checkpoint.read(columns=[column]).column(column)
    return bool(values.null_count < len(values))


def _tombstone_retention_ms(metadata: Action | None) -> int:
    """`delta.deletedFileRetentionDuration` in ms, or Delta's default."""
    retention = table_configuration(metadata).get("delta.deletedFileRetentionDuration")
    return interval_ms(retention, DEFAULT_TOMBSTONE_RETENTION_MS)
