"""`tenants purge T`: after it, no table version and no data file holds a row of T, and every
other tenant's rows are exactly what they were."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from infra.cli.main import main
from infra.dev.load_generator import LoadSpec
from storage.lake.tables import LAKE_TABLES
from streaming.app import StreamApp
from tenants.conf_reader import load_registry
from tests.support.datasets import sample_records
from tests.support.pipeline_harness import Pipeline, assert_no_query_error, record
from tests.support.sample_conf import copy_conf
from tests.support.timestamps import T0_MS
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

GONE = "globex"


def _rows_of_others(pipeline: Pipeline) -> dict[str, list[str]]:
    """Every row of every tenant but GONE, per table, as canonical JSON, sorted."""
    lake = pipeline.lake
    rows = {}
    for spec in LAKE_TABLES:
        table = DeltaTable(lake.table_uri(spec)).to_pyarrow_table()
        others = table.filter(pc.fill_null(pc.not_equal(table["tenant"], GONE), True))
        rows[spec.name] = sorted(
            json.dumps(row, default=str, sort_keys=True) for row in others.to_pylist()
        )
    return rows


def test_purge_leaves_no_trace_of_the_tenant_and_nobody_elses_rows_change(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conf = copy_conf(conf_dir, tmp_path)
    pipeline = Pipeline.create(
        kafka,
        tmp_path,
        conf,
        partitions=2,
        trigger_interval="500ms",
        environ={
            "TW_STREAM__CONFIG_RECHECK_INTERVAL": "1s",
            # Compaction after every batch: old versions keep staged files with GONE's rows.
            "TW_STREAM__COMPACT_INTERVAL": "0s",
        },
    )
    registry = load_registry(conf)
    spec = LoadSpec(count=600, malformed_share=0.05, late_share=0.05, seed=3)
    pipeline.produce_samples(sample_records(registry, spec))
    lake_flags = ["--conf", str(conf), "--lake-root", pipeline.settings.lake.root]
    stream = StreamApp(pipeline.settings, pipeline.lake).start(spark, False)
    try:

        def running() -> None:
            assert_no_query_error(stream)

        wait_until(lambda: len(pipeline.table("events")) > 0, 120, "every record", alive=running)
        assert main(["tenants", "purge", GONE, *lake_flags]) == 2
        assert "still configured" in capsys.readouterr().err
        offboarded = main(["tenants", "offboard", GONE, *lake_flags, "--wait", "--timeout", "90s"])
        assert offboarded == 0, capsys.readouterr()
        # A record GONE's producers still send after offboarding lands in quarantine.
        pipeline.produce([record(GONE, "web", T0_MS + 9_000)])

        def quarantined() -> bool:
            quarantine = pipeline.table("quarantine")
            return bool((quarantine["tenant"] == GONE).any())

        wait_until(quarantined, 60, "the late record in quarantine", alive=running)
    finally:
        stream.stop()
    before = _rows_of_others(pipeline)
    counts_before = {name: len(pipeline.table(name)) for name in before if name != "deliveries"}
    assert (pipeline.table("events")["tenant"] == GONE).any()
    capsys.readouterr()

    # Reprocess plans name a tenant's files: GONE's go, another tenant's stay.
    plans = Path(pipeline.settings.lake.root) / "_reprocess" / pipeline.settings.stream.name
    for tenant in (GONE, "acme"):
        (plans / tenant).mkdir(parents=True)
        (plans / tenant / "run-000001.json").write_text("{}")

    # A standby killed mid-rehearsal left its scratch lake, with rows of any tenant: it goes whole.
    scratch = Path(pipeline.settings.lake.root) / "_rehearsal" / pipeline.settings.stream.name
    (scratch / "events" / f"tenant={GONE}").mkdir(parents=True)
    (scratch / "events" / f"tenant={GONE}" / "part-0.parquet").write_bytes(b"PAR1")

    assert main(["tenants", "purge", GONE, *lake_flags, "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "events: would remove" in dry and "quarantine: would remove" in dry
    assert "_rehearsal: would remove 0 rows" in dry and scratch.exists()
    assert {name: len(pipeline.table(name)) for name in counts_before} == counts_before

    assert main(["tenants", "purge", GONE, *lake_flags]) == 0
    said = capsys.readouterr().out
    assert "No table version and no data file holds a row" in said
    assert "_reprocess: removed 0 rows" in said and ", 1 files" in said
    assert not (plans / GONE).exists() and (plans / "acme" / "run-000001.json").exists()
    assert not scratch.parent.exists()

    # Nobody else's rows changed, byte for byte.
    assert _rows_of_others(pipeline) == before
    lake = pipeline.lake
    for spec in LAKE_TABLES:
        root = Path(lake.table_uri(spec))
        # Every data file still on disk: none holds a row of GONE.
        for path in root.rglob("*.parquet"):
            if "_delta_log" in path.parts:
                continue
            tenants = pq.read_table(path, columns=["tenant"])["tenant"].cast(pa.string())
            assert not pc.any(pc.equal(tenants, GONE)).as_py(), path
        # Every version still readable shows no row of GONE; the others fail on a missing file.
        table = DeltaTable(str(root))
        for version in range(table.version() + 1):
            try:
                old = DeltaTable(str(root), version=version).to_pyarrow_table(columns=["tenant"])
                old_tenants = old["tenant"].cast(pa.string())
            except Exception as error:  # a file the purge deleted
                assert "not found" in str(error).lower() or "No such file" in str(error), error
                continue
            assert not pc.any(pc.equal(old_tenants, GONE)).as_py(), (spec.name, version)

    # A second purge finds nothing left.
    assert main(["tenants", "purge", GONE, *lake_flags]) == 0
    again = capsys.readouterr().out
    assert all(" 0 rows" in line and ", 0 files" in line for line in again.splitlines()[:-1])
