"""Log files past the table's log retention go once a checkpoint older than the retention stands
in for them, as Delta writers clean up; every version from that checkpoint on stays readable."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from storage.lake.delta_log import DeltaLog
from storage.lake.log_cleanup import clean_up_expired_logs

DAY_NS = 86_400 * 10**9


def _table(tmp_path: Path, configuration: dict[str, str | None] | None = None) -> str:
    """Twelve commits (0-11), checkpoints at 4 and 8; everything up to version 9 forty days
    old, 10 and 11 new."""
    uri = str(tmp_path / "events")
    for version in range(12):
        write_deltalake(  # type: ignore[call-overload]
            uri,
            pa.table({"tenant": [f"t{version}"], "value": [version]}),
            mode="append",
            partition_by=["tenant"],
            configuration=configuration if version == 0 else None,
        )
        if version in (4, 8):
            DeltaTable(uri).create_checkpoint()
    old_ns = time.time_ns() - 40 * DAY_NS
    for path in (Path(uri) / "_delta_log").iterdir():
        if path.name[:20].isdigit() and int(path.name[:20]) <= 9:
            os.utime(path, ns=(old_ns, old_ns))
    return uri


def _log_versions(uri: str) -> list[str]:
    return sorted(path.name for path in (Path(uri) / "_delta_log").iterdir() if path.name[0] != "_")


def test_commits_and_checkpoints_before_the_newest_expired_checkpoint_go(tmp_path: Path) -> None:
    uri = _table(tmp_path)
    newest = DeltaTable(uri).file_uris()
    assert clean_up_expired_logs(DeltaLog(uri, None)) == 9  # commits 0-7 and checkpoint 4
    assert _log_versions(uri) == [
        f"{8:020d}.checkpoint.parquet",
        *(f"{version:020d}.json" for version in range(8, 12)),
    ]
    assert sorted(DeltaTable(uri).file_uris()) == sorted(newest)
    assert len(DeltaTable(uri, version=8).file_uris()) == 9  # from the checkpoint on: readable
    with pytest.raises(Exception, match=r"No files in log segment|[Vv]ersion"):
        DeltaTable(uri, version=3)
    assert clean_up_expired_logs(DeltaLog(uri, None)) == 0  # nothing more expired


def test_nothing_goes_within_the_retention_or_when_cleanup_is_off(tmp_path: Path) -> None:
    kept = _table(tmp_path / "kept", {"delta.logRetentionDuration": "interval 60 days"})
    off = _table(tmp_path / "off", {"delta.enableExpiredLogCleanup": "false"})
    for uri in (kept, off):
        before = _log_versions(uri)
        assert clean_up_expired_logs(DeltaLog(uri, None)) == 0
        assert _log_versions(uri) == before
