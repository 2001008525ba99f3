"""What a writer needs of a table at its newest version, read from the log: the transaction ids
(which batch each stream committed last, whose fence holds), the protocol and the columns, but
never the files.

A stream asks each output table every batch whether it holds the batch already, and commits
to it fenced with its epoch. Through delta-rs, each of those kept a loaded snapshot, and a
snapshot holds every file's `add` action: once settled, a table of a file per tenant cost the
driver over a gigabyte a table at a million tenants. A head is a few dozen numbers and names,
read from the newest checkpoint's `txn`, `protocol` and `metaData` columns and the commits
after it; `LogHeads` keeps one per table and moves it forward by the new commits only, reading
their files' lines without parsing them.

`None` where this reader cannot follow the log (a multi-part or V2 checkpoint, or no table):
the caller asks delta-rs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from storage.lake.delta_log import (
    Action,
    DeltaLog,
    checkpoint_batches,
    plain_writer,
    table_configuration,
)
from storage.lake.tables import TableSpec

_CHECKPOINT_COLUMNS = ["txn", "protocol", "metaData"]


@dataclass(frozen=True)
class LogHead:
    version: int
    transactions: Mapping[str, int]
    """Every transaction id's version at `version`."""
    writer_version: int
    writer_features: frozenset[str]
    columns: frozenset[str]
    """The table schema's top-level column names."""
    partition_columns: tuple[str, ...]
    configuration: Mapping[str, str] = field(default_factory=dict)
    """The table's properties (`delta.checkpointInterval`, ...)."""

    @property
    def checkpoint_interval(self) -> int:
        """Every how many commits a writer checkpoints the log (`delta.checkpointInterval`;
        delta-rs's default, which created these tables, where unset)."""
        text = self.configuration.get("delta.checkpointInterval")
        return int(text) if text is not None and text.isdigit() and int(text) > 0 else 100

    @property
    def plain_writer(self) -> bool:
        """Whether the table's protocol lets a writer that knows only files commit to it."""
        return plain_writer(self.writer_version, self.writer_features)

    def unfit_for(self, spec: TableSpec) -> str | None:
        """Why files written as `spec` says cannot be committed to the table as it is, or None
        if they can: a column they hold that the table lacks would be dropped unseen by its
        readers, and files partitioned otherwise would be read under the wrong values."""
        missing = [name for name in spec.storage_schema.names if name not in self.columns]
        if missing:
            return f"it lacks the columns {', '.join(missing)} that this release writes"
        if self.partition_columns != spec.partition_by:
            return (
                f"it is partitioned by {', '.join(self.partition_columns)}, and this release "
                f"writes it partitioned by {', '.join(spec.partition_by)}"
            )
        return None


def read_head(delta_log: DeltaLog) -> LogHead | None:
    """The table's head at its newest version (see the module's doc for None)."""
    version = delta_log.checkpointed_version()
    if version is None:
        return None
    reading = _Reading()
    if version >= 0:
        opened = delta_log.open_checkpoint(version)
        for batch in checkpoint_batches(opened, _CHECKPOINT_COLUMNS):
            reading.apply(
                {name: value}
                for name in batch.schema.names
                for value in batch.column(name).drop_null().to_pylist()
            )
    return reading.head_after(delta_log, version)


def moved_on(head: LogHead, delta_log: DeltaLog) -> LogHead:
    """`head` moved forward by the commits after its version."""
    reading = _Reading(
        transactions=dict(head.transactions),
        protocol={
            "minWriterVersion": head.writer_version,
            "writerFeatures": sorted(head.writer_features),
        },
        columns=head.columns,
        partition_columns=head.partition_columns,
        configuration=dict(head.configuration),
    )
    moved = reading.head_after(delta_log, head.version)
    assert moved is not None  # it had a protocol and metadata already
    return moved


@dataclass
class LogHeads:
    """A writer's heads of the tables it commits to, each moved forward on every look. For one
    caller at a time (a stream's batches run one after another)."""

    _heads: dict[str, LogHead] = field(default_factory=dict)

    def head(self, delta_log: DeltaLog) -> LogHead | None:
        known = self._heads.get(delta_log.table_uri)
        head = read_head(delta_log) if known is None else moved_on(known, delta_log)
        if head is None:
            self._heads.pop(delta_log.table_uri, None)
        else:
            self._heads[delta_log.table_uri] = head
        return head


@dataclass
class _Reading:
    transactions: dict[str, int] = field(default_factory=dict)
    protocol: dict[str, Any] | None = None
    columns: frozenset[str] | None = None
    partition_columns: tuple[str, ...] = ()
    configuration: dict[str, str] = field(default_factory=dict)

    def apply(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if (txn := action.get("txn")) is not None:
                self.transactions[txn["appId"]] = int(txn["version"])
            elif (protocol := action.get("protocol")) is not None:
                self.protocol = protocol
            elif (metadata := action.get("metaData")) is not None:
                schema = orjson.loads(metadata["schemaString"])
                self.columns = frozenset(column["name"] for column in schema["fields"])
                self.partition_columns = tuple(metadata.get("partitionColumns") or ())
                self.configuration = table_configuration(metadata)

    def head_after(self, delta_log: DeltaLog, version: int) -> LogHead | None:
        """The head once the commits after `version` are applied; None if the log has no
        table (no commit, or none that set its protocol and metadata)."""
        while (actions := delta_log.actions(version + 1, with_files=False)) is not None:
            self.apply(actions)
            version += 1
        if version < 0 or self.protocol is None or self.columns is None:
            return None
        return LogHead(
            version=version,
            transactions=self.transactions,
            writer_version=int(self.protocol.get("minWriterVersion", 0)),
            writer_features=frozenset(self.protocol.get("writerFeatures") or ()),
            columns=self.columns,
            partition_columns=self.partition_columns,
            configuration=self.configuration,
        )
