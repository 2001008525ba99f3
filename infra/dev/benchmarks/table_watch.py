"""A benchmark's view of a table as the stream commits to it: each file its commits add, once."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from deltalake import DeltaTable


def added_files(table_uri: str, stop: threading.Event, interval_s: float) -> Iterator[str]:
    """URIs of the table's files, each once, as commits add them; polls every `interval_s`
    until `stop` is set. A table not created yet is waited for (the stream's first commit)."""
    seen: set[str] = set()
    table: DeltaTable | None = None
    while not stop.wait(interval_s):  # ends with the run
        try:
            if table is None:
                table = DeltaTable(table_uri)
            else:
                table.update_incremental()
        except Exception:  # the table appears with the stream's first commit
            continue
        for file_uri in table.file_uris():
            if file_uri not in seen:
                seen.add(file_uri)
                yield file_uri
