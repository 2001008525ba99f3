"""The lake on S3: a real S3 endpoint (moto server on 127.0.0.1), keys kept secret."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from infra.cli.main import main
from storage.lake.delta_lake import DeltaLake, LakeFile
from storage.lake.delta_log import DeltaLog
from storage.lake.file_names import SettledFiles
from storage.lake.file_writer import write_settled
from storage.lake.log_checkpoint import write_checkpoint
from storage.lake.log_commits import FencedCommit, commit_fenced
from storage.lake.s3_options import storage_options
from storage.lake.tables import EVENTS
from storage.lake.written_files import WrittenFile
from tenants.registry import ConfigError
from tenants.settings import load_settings
from tests.support.pipeline_harness import Pipeline, record
from tests.support.s3_endpoint import BUCKET, moto_s3, s3_environ
from tests.support.timestamps import T0_MS

pytestmark = pytest.mark.integration

ACCESS_KEY = "AKIATENANTWINDOWS"
SECRET_KEY = "s3cr3t-never-in-logs-6f1d"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_s3(ACCESS_KEY, SECRET_KEY) as endpoint:
        yield f"http://{endpoint}"


def test_the_stream_writes_and_sql_reads_a_lake_on_s3_without_leaking_keys(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    tmp_path: Path,
    s3_endpoint: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    environ = s3_environ(s3_endpoint, ACCESS_KEY, SECRET_KEY)
    pipeline = Pipeline.create(
        kafka, tmp_path, conf_dir, lake_root="s3://lake/tenant-windows", environ=environ
    )
    pipeline.produce([record("acme", "web", T0_MS + i * 20_000) for i in range(6)] + [b"{"])

    pipeline.run_available_now(spark)
    pipeline.run_available_now(spark)  # a restart on S3 writes nothing twice

    assert len(pipeline.table("events")) == 6
    assert pipeline.table("quarantine")["reason"].tolist() == ["malformed_json"]
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    code = main(
        ["sql", "--lake-root", "s3://lake/tenant-windows", "--format", "json",
         "SELECT tenant, count(*) AS n FROM events GROUP BY tenant"]
    )  # fmt: skip
    assert code == 0
    out, err = capsys.readouterr()
    assert '{"tenant":"acme","n":6}' in out
    everything_printed = out + err + caplog.text + repr(pipeline.settings) + repr(pipeline.lake)
    assert SECRET_KEY not in everything_printed


def test_keys_can_come_from_a_secrets_file(tmp_path: Path, s3_endpoint: str) -> None:
    secrets = tmp_path / "s3.yaml"
    secrets.write_text(f"access_key_id: {ACCESS_KEY}\nsecret_access_key: {SECRET_KEY}\n")
    settings = load_settings(
        None,
        environ={},
        overrides={
            "lake.root": "s3://lake/from-secrets-file",
            "lake.s3.endpoint_url": s3_endpoint,
            "lake.s3.allow_http": True,
            "lake.s3.secrets_file": str(secrets),
        },
    )
    options = storage_options(settings.lake)
    assert options is not None and options["AWS_SECRET_ACCESS_KEY"] == SECRET_KEY
    lake = DeltaLake.from_settings(settings.lake)
    lake.ensure_tables()
    assert lake.committed_batch(EVENTS, "any") is None
    assert SECRET_KEY not in repr(settings) + repr(lake)


def test_a_bad_secrets_file_names_the_file_not_its_content(tmp_path: Path) -> None:
    secrets = tmp_path / "s3.yaml"
    secrets.write_text(f"access_key_id: {ACCESS_KEY}\nsecret: {SECRET_KEY}\n")
    settings = load_settings(
        None,
        environ={},
        overrides={"lake.root": "s3://lake/x", "lake.s3.secrets_file": str(secrets)},
    )
    with pytest.raises(ConfigError, match="secret_access_key: missing") as refused:
        storage_options(settings.lake)
    assert str(secrets) in str(refused.value) and SECRET_KEY not in str(refused.value)


def test_a_settled_file_on_s3_is_one_put_and_no_folder_markers(s3_endpoint: str) -> None:
    """A settle writes a small file per key: on S3 each must cost one PutObject, not a
    multipart upload (three requests) and an empty marker object per folder level."""
    tenants = [f"t{index}" for index in range(5)]
    rows = pa.table(
        {
            name: pa.nulls(len(tenants), EVENTS.schema.field(name).type)
            for name in EVENTS.schema.names
        }
    )
    rows = rows.set_column(rows.schema.get_field_index("tenant"), "tenant", pa.array(tenants))
    rows = rows.set_column(rows.schema.get_field_index("source"), "source", pa.array(["web"] * 5))
    options = {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": "us-east-1",
    }
    target = SettledFiles("s3://lake/one-put", options, "s", 1, "digest", EVENTS.name)

    written = write_settled(target, rows.cast(EVENTS.schema), "a test")

    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
    )
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="one-put/")["Contents"]
    assert sorted(item["Key"] for item in listed) == sorted(
        f"one-put/events/{file.path}" for file in written
    )
    for item in listed:
        body = client.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
        # A multipart upload's ETag is "<digest>-<parts>"; one PutObject's is the body's MD5.
        assert item["ETag"].strip('"') == hashlib.md5(body).hexdigest()


def test_commits_and_a_checkpoint_written_on_the_log_read_back_through_delta_rs_on_s3(
    s3_endpoint: str,
) -> None:
    """A sliced settle commits on the log's tail and checkpoints a batch at a time: on S3 a
    version is still taken once (a conditional PUT), and delta-rs reads the result."""
    options = {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }
    uri = "s3://lake/on-the-log/events"
    rows = pa.table({"tenant": ["acme", "zeta"], "value": [1, 2]})
    write_deltalake(uri, rows, partition_by=["tenant"], storage_options=options)
    DeltaTable(uri, storage_options=options).create_checkpoint()
    acme, zeta = sorted(
        pa.table(DeltaTable(uri, storage_options=options).get_add_actions()).to_pylist(),
        key=lambda row: str(row["path"]),
    )
    delta_log = DeltaLog(uri, options)
    settled = WrittenFile(
        table_name="events",
        path="tenant=acme/settled.parquet",
        size=7,
        partition_values={"tenant": "acme"},
        modification_time=1,
        stats='{"numRecords":1}',
        num_records=1,
    )
    removed = [LakeFile(acme["path"], acme["size_bytes"], {"tenant": "acme"})]

    def another_writer_takes_version_1() -> None:
        if not delta_log.has_commit(1):
            assert delta_log.try_commit(1, [{"commitInfo": {"timestamp": 1}}])
            assert not delta_log.try_commit(1, [{"commitInfo": {"timestamp": 2}}])

    swap = FencedCommit(removed, [settled], "s", 0, ("s/compaction", 1))
    version = commit_fenced(delta_log, 0, swap, another_writer_takes_version_1)

    assert version == 2
    assert write_checkpoint(delta_log, 2)
    table = DeltaTable(uri, storage_options=options)
    assert sorted(table.file_uris()) == sorted(
        [f"{uri}/{zeta['path']}", f"{uri}/tenant=acme/settled.parquet"]
    )
    assert table.transaction_version("s/compaction") == 1
    assert delta_log.last_checkpoint() == {
        "version": 2,
        "size": 6,  # protocol, metadata, the transaction, two files and one tombstone
        "sizeInBytes": delta_log.filesystem.get_file_info(delta_log.checkpoint_file(2)).size,
        "numOfAddFiles": 2,
    }
