"""The product against a broker that speaks only TLS plus SASL (SCRAM-SHA-256): a real broker in
its own network namespace, reachable only through a TLS and SASL terminator
(`tests/support/secured_kafka.py`). The stream writes what it writes over plaintext, the password
shows nowhere, and wrong security is one line at once."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.cli.main import main
from infra.dev.load_generator import LoadSpec
from streaming.app import StreamApp
from streaming.fault_points import FaultPoint
from tenants.conf_reader import load_registry
from tests.support.datasets import sample_records
from tests.support.pipeline_harness import Pipeline, record
from tests.support.secured_kafka import (
    SecuredKafka,
    make_certificates,
    namespace_unavailable_reason,
    secured_kafka,
    security_environ,
)
from tests.support.stream_process import crash_and_recover
from tests.support.table_snapshots import assert_same_tables, snapshot
from tests.support.timestamps import T0_MS

pytestmark = pytest.mark.integration

RECORDS: list[dict[str, Any] | bytes] = [
    *(record("acme", "web", T0_MS + seconds * 1000) for seconds in (0, 15, 30, 75, 200)),
    record("acme", "web", T0_MS + 20_000),  # too late once W has passed 3 min
    record("globex", "billing", T0_MS + 2_000, amount=7),
    record("globex", "web", T0_MS + 80_000),
    b"{broken",
]
# Columns that differ between two runs by design: the topic's name, the clock.
RUN_SPECIFIC = {"topic", "kafka_timestamp", "processing_time", "last_record_processing_time"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    reason = namespace_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("sasl_ssl_broker")
    with secured_kafka(work, "sasl_ssl", "SCRAM-SHA-256") as broker:
        yield broker


def rows(pipeline: Pipeline, table: str) -> list[str]:
    frame = pipeline.table(table)
    kept = frame[[column for column in frame.columns if column not in RUN_SPECIFIC]]
    return sorted(json.dumps(row, default=str, sort_keys=True) for row in kept.to_dict("records"))


def test_the_stream_over_tls_and_sasl_writes_what_it_writes_in_plaintext(
    secured: SecuredKafka,
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    environ = security_environ(secured)
    over_tls = Pipeline.create(
        secured, tmp_path / "tls", conf_dir, max_offsets_per_trigger=4, environ=environ
    )
    plain = Pipeline.create(kafka, tmp_path / "plain", conf_dir, max_offsets_per_trigger=4)
    plain.produce(RECORDS)
    plain.run_available_now(spark)
    over_tls.produce(RECORDS)
    with caplog.at_level(logging.DEBUG):
        stream = StreamApp(over_tls.settings, over_tls.lake).start(spark, True)
        try:
            assert stream.query.awaitTermination(timeout=240)
            assert stream.query.exception() is None, stream.query.exception()
            plans = stream.query._jsq.explainInternal(True)
            progress = json.dumps(stream.query.recentProgress, default=str)
            stream.compact_now(spark)
        finally:
            stream.stop()
    for table in ("events", "windows", "late_events", "quarantine", "tenant_status"):
        assert rows(over_tls, table) == rows(plain, table), table
    assert len(rows(over_tls, "windows")) >= 3 and len(rows(over_tls, "quarantine")) == 1

    # `status` reads the lag over the same security, and shows no secret either.
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    code = main(
        [
            "status",
            "--format",
            "json",
            "--bootstrap-servers",
            secured.bootstrap_servers,
            "--topic",
            over_tls.topic,
            "--lake-root",
            over_tls.settings.lake.root,
            "--checkpoint-dir",
            over_tls.settings.stream.checkpoint_dir,
            "--conf",
            str(conf_dir),
            "--stream-name",
            over_tls.stream_name,
        ]
    )
    status = capsys.readouterr()
    assert code == 0, status.err
    assert '"kafka_lag"' in status.out or "lag" in status.out

    password = secured.password
    assert password is not None
    assert password not in caplog.text and password not in status.out + status.err
    assert password not in plans and password not in progress
    assert password not in json.dumps(spark.sparkContext.getConf().getAll())
    written = [path for path in (tmp_path / "tls").rglob("*") if path.is_file()]
    assert any("checkpoint" in str(path) for path in written)
    assert not [path for path in written if password.encode() in path.read_bytes()]


@pytest.mark.parametrize(
    ("change", "cause"),
    [
        ({"TW_KAFKA__SASL__PASSWORD": "not-the-password"}, "Authentication"),
        ({"TW_KAFKA__SECURITY_PROTOCOL": "PLAINTEXT"}, "the port answers TLS"),
        ({"TW_KAFKA__SSL__CA_FILE": "OTHER_CA"}, "certificate"),
    ],
    ids=["wrong password", "plaintext to a TLS port", "untrusted certificate"],
)
def test_wrong_security_stops_the_run_at_once_in_one_line(
    secured: SecuredKafka,
    conf_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    change: dict[str, str],
    cause: str,
) -> None:
    if change.get("TW_KAFKA__SSL__CA_FILE") == "OTHER_CA":
        change = {"TW_KAFKA__SSL__CA_FILE": str(make_certificates(tmp_path / "other").ca_file)}
    for name, value in security_environ(secured, **change).items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    code = main(
        [
            "run",
            "--available-now",
            "--bootstrap-servers",
            secured.bootstrap_servers,
            "--topic",
            "never-read",
            "--lake-root",
            str(tmp_path / "lake"),
            "--checkpoint-dir",
            str(tmp_path / "checkpoint"),
            "--conf",
            str(conf_dir),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert time.monotonic() - started < 30
    [line] = [line for line in err.splitlines() if line.startswith("not starting:")]
    assert secured.bootstrap_servers in line and cause in line, line
    assert not (tmp_path / "checkpoint").exists()  # nothing started


def test_a_crash_mid_read_over_tls_recovers_to_the_plaintext_output(
    secured: SecuredKafka, kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    """SIGKILL while an executor reads over TLS, then a restart over TLS: the tables equal a
    plaintext run's of the same records (the same topic name on each broker)."""
    topic = "crash-over-tls"
    spec = LoadSpec(count=160, late_share=0.1, malformed_share=0.05, jitter=30_000, seed=3)
    samples = list(sample_records(load_registry(conf_dir), spec))
    runs = {}
    for name, broker, environ in (
        ("plain", kafka, {}),
        ("tls", secured, security_environ(secured)),
    ):
        broker.create_topic(topic, 2)
        (tmp_path / name).mkdir()
        pipeline = Pipeline(
            broker,
            tmp_path / name,
            conf_dir,
            topic,
            partitions=2,
            max_offsets_per_trigger=40,
            environ={**environ, "TW_STREAM__COMPACT_INTERVAL": "0s"},
        )
        pipeline.produce_samples(samples)
        runs[name] = pipeline
    runs["plain"].run_available_now(spark)
    recovered = crash_and_recover(runs["tls"], spark, [f"{FaultPoint.KAFKA_READ}@30"])
    assert_same_tables(
        without_produce_times(recovered), without_produce_times(snapshot(runs["plain"]))
    )


def without_produce_times(tables: dict[str, Any]) -> dict[str, Any]:
    """The tables without `kafka_timestamp`: each broker stamped its own copy when produced."""
    return {
        name: frame.drop(columns=["kafka_timestamp"], errors="ignore")
        for name, frame in tables.items()
    }


@pytest.mark.parametrize("mode", ["mtls", "sasl_plaintext"])
def test_the_stream_runs_over_mutual_tls_and_over_sasl_without_tls(
    spark: Any, conf_dir: Path, tmp_path: Path, mode: str
) -> None:
    if (reason := namespace_unavailable_reason()) is not None:
        pytest.skip(reason)
    with secured_kafka(tmp_path / "broker", mode, "SCRAM-SHA-512") as broker:  # type: ignore[arg-type]
        if mode == "mtls":
            environ = {
                "TW_KAFKA__SECURITY_PROTOCOL": "SSL",
                "TW_KAFKA__SSL__CA_FILE": str(broker.ca_file),
                "TW_KAFKA__SSL__CERT_FILE": str(broker.client_cert_file),
                "TW_KAFKA__SSL__KEY_FILE": str(broker.client_key_file),
            }
        else:
            environ = {
                "TW_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "TW_KAFKA__SASL__MECHANISM": "SCRAM-SHA-512",
                "TW_KAFKA__SASL__USERNAME": str(broker.username),
                "TW_KAFKA__SASL__PASSWORD": str(broker.password),
            }
        pipeline = Pipeline.create(broker, tmp_path / "stream", conf_dir, environ=environ)
        pipeline.produce([record("acme", "web", T0_MS + n * 1000) for n in range(3)])
        pipeline.run_available_now(spark)
        events = pipeline.table("events")
        assert sorted(events["offset"]) == [0, 1, 2]
