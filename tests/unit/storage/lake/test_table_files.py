"""A table's files by tenant, followed commit by commit, are the files delta-rs loads for the same
version, whatever the commits did."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from storage.lake import checkpoint_tenants, log_checkpoint
from storage.lake.checkpoint_tenants import NO_TENANT, row_groups_holding
from storage.lake.delta_log import DeltaLog
from storage.lake.log_checkpoint import write_checkpoint
from storage.lake.table_files import TableFiles
from storage.lake.tables import STAGED

_TENANTS = ("acme", "a b/c%", "b", "zeta", "mid")


def _rows(tenants: list[str], layout: list[str]) -> pa.Table:
    return pa.table(
        {
            "tenant": tenants,
            "value": list(range(len(tenants))),
            "layout_tenant": layout,
        }
    )


def _staged(tenants: list[str]) -> pa.Table:
    return _rows(tenants, [STAGED] * len(tenants))


def _settled(tenant: str, count: int = 2) -> pa.Table:
    return _rows([tenant] * count, [tenant] * count)


def _write(uri: str, rows: pa.Table, mode: str = "append") -> None:
    write_deltalake(uri, rows, mode=mode, partition_by=["layout_tenant"])  # type: ignore[call-overload]


def _same_as_loaded(files: TableFiles | None, uri: str) -> TableFiles:
    """`files` lists, for every tenant and for all, what a fresh load of the version lists."""
    assert files is not None
    loaded = TableFiles.of_table(DeltaTable(uri))
    assert files.version == loaded.version
    for tenant in (*_TENANTS, "nobody", None):
        assert files.files_of(tenant) == loaded.files_of(tenant), tenant
    return files


def test_followed_commits_list_the_files_a_fresh_load_lists(tmp_path: Path) -> None:
    uri = str(tmp_path / "events")
    _write(uri, _staged(["acme", "b"]))
    files = TableFiles.of_table(DeltaTable(uri))
    assert files.advanced(None) is files  # nothing new

    _write(uri, _staged(["mid"]))  # a batch's staged file
    _write(uri, _settled("acme"))
    _write(uri, _settled("a b/c%"))  # a name the log and the file system both escape
    files = _same_as_loaded(files.advanced(None), uri)
    assert len(files.files_of("a b/c%")) == 1
    assert len(files.files_of("acme")) == 2  # its partition's file and a staged one
    assert len(files.files_of("mid")) == 1  # the staged file whose statistics hold it only

    DeltaTable(uri).delete("tenant = 'acme'")  # removes, and adds rewritten files
    DeltaTable(uri).optimize.compact()  # a swap of files, as compaction's
    _write(uri, _settled("zeta", 3), mode="overwrite")  # removes every file
    files = _same_as_loaded(files.advanced(None), uri)
    assert set(files.by_tenant) == {"zeta"}


def test_a_version_left_behind_keeps_its_files(tmp_path: Path) -> None:
    uri = str(tmp_path / "events")
    _write(uri, _settled("acme"))
    before = TableFiles.of_table(DeltaTable(uri))
    _write(uri, _settled("acme"), mode="overwrite")
    after = before.advanced(None)
    assert after is not None and after.version == before.version + 1
    assert before.files_of("acme") != after.files_of("acme")
    assert before.files_of("acme") == TableFiles.of_table(DeltaTable(uri, version=0)).files_of(
        "acme"
    )


def test_new_metadata_is_not_followed(tmp_path: Path) -> None:
    uri = str(tmp_path / "events")
    _write(uri, _settled("acme"))
    files = TableFiles.of_table(DeltaTable(uri))
    wider = _settled("acme").append_column("extra", pa.array(["x", "y"]))
    write_deltalake(uri, wider, mode="append", schema_mode="merge", partition_by=["layout_tenant"])
    assert files.advanced(None) is None


@pytest.mark.parametrize("partitioned", [True, False])
def test_files_of_every_tenant_are_all_files(tmp_path: Path, partitioned: bool) -> None:
    uri = str(tmp_path / "t")
    rows = _settled("acme")
    if partitioned:
        _write(uri, rows)
        _write(uri, _staged(["zeta"]))
    else:
        write_deltalake(uri, rows)
        write_deltalake(uri, _settled("zeta"), mode="append")
    files = TableFiles.of_table(DeltaTable(uri))
    assert set(files.files_of(None)) == set(DeltaTable(uri).file_uris())
    assert len(files.files_of("acme")) == 1  # the other file's statistics rule acme out


def test_one_tenants_index_lists_its_files_as_the_whole_one_and_answers_for_no_other(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "events")
    _write(uri, _staged(["acme", "b"]))
    _write(uri, _settled("acme"))
    _write(uri, _settled("zeta"))
    scoped = TableFiles.of_table(DeltaTable(uri), only_tenant="acme")
    assert set(scoped.by_tenant) == {"acme"}
    _write(uri, _settled("acme"))
    _write(uri, _settled("mid"))
    followed = scoped.advanced(None)
    assert followed is not None and set(followed.by_tenant) == {"acme"}
    assert followed.files_of("acme") == TableFiles.of_table(DeltaTable(uri)).files_of("acme")
    assert len(followed.files_of("acme")) == 3
    with pytest.raises(ValueError, match="'acme'"):
        followed.files_of("zeta")


def test_a_remove_that_does_not_name_its_partition_is_left_to_a_fresh_load(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "events")
    _write(uri, _settled("acme"))
    files = TableFiles.of_table(DeltaTable(uri))
    (path,) = pa.table(DeltaTable(uri).get_add_actions()).column("path").to_pylist()
    remove = {"remove": {"path": path, "deletionTimestamp": 1, "dataChange": True}}
    (tmp_path / "events" / "_delta_log" / f"{1:020d}.json").write_text(json.dumps(remove) + "\n")
    assert files.advanced(None) is None


_SCHEMA = pa.schema(
    [pa.field("tenant", pa.string()), pa.field("value", pa.int64()), ("layout_tenant", pa.string())]
)


def test_one_tenants_files_read_from_the_checkpoint_are_those_delta_rs_lists(
    tmp_path: Path,
) -> None:
    """Checkpointed files, staged ones ruled in or out by their statistics, and the commits
    after the checkpoint (a removal among them) all count, as in delta-rs' own load."""
    uri = str(tmp_path / "events")
    _write(uri, _staged(["acme", "b"]))
    _write(uri, _staged(["zeta"]))
    for tenant in _TENANTS:
        _write(uri, _settled(tenant))
    assert TableFiles.of_log(uri, _SCHEMA, None, "acme") is None  # no checkpoint yet
    DeltaTable(uri).create_checkpoint()
    _write(uri, _settled("acme"))
    DeltaTable(uri).delete("tenant = 'b'")
    for tenant in (*_TENANTS, "nobody"):
        files = TableFiles.of_log(uri, _SCHEMA, None, tenant)
        assert files is not None and files.version == DeltaTable(uri).version()
        loaded = TableFiles.of_table(DeltaTable(uri), only_tenant=tenant)
        assert files.files_of(tenant) == loaded.files_of(tenant), tenant
        assert set(files.by_tenant) <= {tenant}
    assert len(TableFiles.of_log(uri, _SCHEMA, None, "acme").files_of("acme")) == 3  # type: ignore[union-attr]
    _same_as_loaded(TableFiles.of_log(uri, _SCHEMA, None), uri)  # every tenant's


def test_one_tenants_files_are_read_from_its_row_groups_of_a_sorted_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint this project writes keeps rows sorted by tenant a run at a time: one
    tenant's reader reads the row groups whose recorded range holds it (and the staged files'),
    and finds what delta-rs finds reading everything."""
    monkeypatch.setattr(checkpoint_tenants, "ROW_GROUP_ROWS", 4)
    monkeypatch.setattr(log_checkpoint, "SORTED_RUN_ROWS", 16)
    uri = str(tmp_path / "events")
    _write(uri, _staged(["acme", "b"]))
    DeltaTable(uri).create_checkpoint()  # this project's writer starts from an earlier one
    tenants = [f"t{n:02d}" for n in range(30)]
    for tenant in [*tenants, *_TENANTS]:
        _write(uri, _settled(tenant))
    _write(uri, _staged(["t07", "zeta"]))
    assert write_checkpoint(DeltaLog(uri, None))
    checkpoint = pq.ParquetFile(DeltaLog(uri, None).checkpoint_file(DeltaTable(uri).version()))
    read = row_groups_holding(checkpoint, "layout_tenant", ("t07", STAGED, NO_TENANT))
    assert read is not None and 0 < len(read) < checkpoint.num_row_groups / 3
    for tenant in (*tenants, *_TENANTS, "nobody"):
        files = TableFiles.of_log(uri, _SCHEMA, None, tenant)
        loaded = TableFiles.of_table(DeltaTable(uri), only_tenant=tenant)
        assert files is not None and files.files_of(tenant) == loaded.files_of(tenant), tenant
    assert len(TableFiles.of_table(DeltaTable(uri)).files_of(None)) == len(tenants) + 7
    _same_as_loaded(TableFiles.of_log(uri, _SCHEMA, None), uri)
