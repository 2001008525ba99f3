"""`tenant-windows retain` on a lake the stream wrote: closed windows past each tenant's retention
go, open ones and a longer-kept tenant's stay. (Who is cut where, and the delete itself:
tests/unit/storage/upkeep/test_retention.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from infra.cli.main import main
from infra.dev.load_generator import LoadSpec
from tenants.conf_reader import load_registry
from tests.support.datasets import sample_records
from tests.support.pipeline_harness import Pipeline
from tests.support.sample_conf import copy_conf


@pytest.mark.integration
def test_retain_deletes_closed_windows_past_retention_and_keeps_open_ones(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = copy_conf(conf_dir, tmp_path)
    globex = conf / "tenants" / "globex.yaml"
    globex.write_text(globex.read_text() + "retention: 400d\n")
    pipeline = Pipeline.create(
        kafka, tmp_path, conf, partitions=2, environ={"TW_LAKE__DEFAULT_RETENTION": "30d"}
    )
    registry = load_registry(conf)
    # 150 records a key a minute apart: the stream closes windows over two and a half hours.
    spec = LoadSpec(count=900, step="60s", late_share=0.05, seed=9)
    pipeline.produce_samples(sample_records(registry, spec))
    pipeline.run_available_now(spark)
    before = {name: pipeline.table(name) for name in ("events", "windows", "late_events")}
    status = pipeline.table("tenant_status")
    latest = status.loc[status.groupby(["tenant", "source"])["batch_id"].idxmax()]
    # The sample's event times are from January, long before now minus 30 days: what bounds
    # the cut is each tenant's slowest watermark minus its largest allowed lateness.
    routes = {
        tenant: [registry.resolve(tenant, source) for source in ("web", "billing")]
        for tenant in ("acme", "initech")
    }
    lateness = {
        tenant: max(route.rules.allowed_lateness_ms for route in found if route is not None)
        for tenant, found in routes.items()
    }
    # A tenant's own cut-off is rounded down to a whole hour (plan_cuts).
    cutoff = {
        tenant: (
            latest[latest["tenant"] == tenant]["watermark"].min()
            - pd.Timedelta(milliseconds=lateness[tenant])
        ).floor("h")
        for tenant in lateness
    }
    flags = ["--conf", str(conf), "--lake-root", pipeline.settings.lake.root]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TW_LAKE__DEFAULT_RETENTION", "30d")
        assert main(["retain", "--dry-run", *flags]) == 0
        dry, dry_err = capsys.readouterr()
        # Why the cut-offs are where they are, once: each tenant's is held back to its slowest
        # key's watermark, and the line names the slowest key of the tenants that share it;
        # each count once, not again as a log line.
        held = latest[latest["tenant"].isin(list(cutoff))]
        for tenant, at in cutoff.items():
            lines = [line for line in dry.splitlines() if tenant in line.split(":", 3)[-2]]
            assert len(lines) == 1, dry
            assert lines[0].strip().startswith(at.strftime("%Y-%m-%dT%H:%M:%SZ for ")), dry
            sharing = held[held["tenant"].map(cutoff) == at]
            slowest = sharing.sort_values(["watermark", "tenant"]).iloc[0]
            assert "held back to the watermark" in lines[0]
            assert f"of {slowest['tenant']}/{slowest['source']} minus" in lines[0], lines[0]
        for name in before:
            assert [line.startswith(f"{name}: would delete") for line in dry.splitlines()].count(
                True
            ) == 1
        assert "rows of events" not in dry_err
        assert {name: len(pipeline.table(name)) for name in before} == {
            name: len(table) for name, table in before.items()
        }
        assert main(["retain", *flags]) == 0
    said = capsys.readouterr().out
    for name, table in before.items():
        after = pipeline.table(name)
        expected = table[
            ~table["tenant"].isin(list(cutoff))
            | (table["window_end"] >= table["tenant"].map(cutoff))
        ]
        key = ["tenant", "source", "window_start", "batch_id"]
        assert len(after) == len(expected), name
        kept = after.sort_values(key)[key].reset_index(drop=True)
        assert kept.equals(expected.sort_values(key)[key].reset_index(drop=True)), name
        deleted = len(table) - len(after)
        assert f"{name}: deleted {deleted} rows" in said
        assert f"{name}: would delete {deleted} rows" in dry
    # globex keeps everything (400 days); acme and initech lost their closed windows only.
    assert (pipeline.table("events")["tenant"] == "globex").sum() == (
        before["events"]["tenant"] == "globex"
    ).sum()
    assert len(pipeline.table("windows")) < len(before["windows"])
