"""Retention: who is cut where (pure), the same rows by SQL and by Arrow filter (a real Delta
table), and `tenant-windows retain` on a lake the stream wrote."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable, write_deltalake

from infra.cli.main import main
from infra.dev.load_generator import LoadSpec, generate
from storage.upkeep.retention import Cut, TenantRetention, plan_cuts
from tenants.registry import load_registry
from tests.harness import Pipeline

DAY_MS = 86_400_000
NOW_MS = 1_780_000_000_000


def test_tenants_sharing_the_default_share_one_cut() -> None:
    tenants = {f"t{n}": TenantRetention(30 * DAY_MS, NOW_MS, 60_000) for n in range(1000)}
    cuts = plan_cuts(tenants, TenantRetention(30 * DAY_MS), NOW_MS)
    assert cuts == [Cut(NOW_MS - 30 * DAY_MS, except_tenants=())]


def test_own_retention_and_a_lagging_watermark_get_cuts_of_their_own() -> None:
    tenants = {
        "steady": TenantRetention(30 * DAY_MS, NOW_MS, 60_000),
        "keeps-long": TenantRetention(400 * DAY_MS, NOW_MS),
        # Backfilling: its watermark is 40 days behind; its windows up to W - lateness closed.
        "backfill": TenantRetention(30 * DAY_MS, NOW_MS - 40 * DAY_MS, 60_000),
        "forever": TenantRetention(None),
    }
    cuts = plan_cuts(tenants, TenantRetention(30 * DAY_MS), NOW_MS)
    assert cuts == [
        Cut(NOW_MS - 30 * DAY_MS, except_tenants=("backfill", "forever", "keeps-long")),
        Cut(_hour(NOW_MS - 400 * DAY_MS), tenants=("keeps-long",)),
        Cut(_hour(NOW_MS - 40 * DAY_MS - 60_000), tenants=("backfill",)),
    ]


def test_tenants_with_the_same_own_cutoff_share_a_delete() -> None:
    tenants = {
        **{f"long{n}": TenantRetention(400 * DAY_MS, NOW_MS) for n in range(3)},
        # Watermarks minutes apart: the same hour, one delete.
        **{f"lag{n}": TenantRetention(30 * DAY_MS, NOW_MS - 40 * DAY_MS + n) for n in range(3)},
    }
    cuts = plan_cuts(tenants, TenantRetention(30 * DAY_MS), NOW_MS)
    assert [len(cut.tenants) for cut in cuts[1:]] == [3, 3]
    assert all(cut.cutoff_ms % 3_600_000 == 0 for cut in cuts[1:])


def _hour(ms: int) -> int:
    return ms - ms % 3_600_000


def test_without_a_default_only_tenants_with_a_retention_are_cut() -> None:
    tenants = {"a": TenantRetention(None), "b": TenantRetention(7 * DAY_MS)}
    assert plan_cuts(tenants, TenantRetention(None), NOW_MS) == [
        Cut(_hour(NOW_MS - 7 * DAY_MS), tenants=("b",))
    ]


@pytest.mark.parametrize(
    "cut",
    [
        Cut(NOW_MS - 30 * DAY_MS, except_tenants=("b",)),
        Cut(NOW_MS - 30 * DAY_MS, except_tenants=()),
        Cut(NOW_MS - 10 * DAY_MS, tenants=("b", "c")),
    ],
)
def test_the_delete_and_the_dry_run_select_the_same_rows(cut: Cut, tmp_path: Path) -> None:
    ends = [NOW_MS - days * DAY_MS for days in (45, 31, 29, 12, 9, 1)]
    rows = pa.table(
        {
            "tenant": pa.array(["a", "b", "c", None, "a", "b"], pa.string()),
            "window_end": pa.array([end * 1000 for end in ends], pa.timestamp("us", tz="UTC")),
            "ingest_date": pa.array(
                [datetime.fromtimestamp(end / 1000, tz=UTC).date() for end in ends], pa.date32()
            ),
        }
    )
    for column, as_date in (("window_end", False), ("ingest_date", True)):
        path = str(tmp_path / column)
        write_deltalake(path, rows)
        expected = ds.dataset(rows).to_table(filter=~cut.expression(column, as_date))
        DeltaTable(path).delete(predicate=cut.sql(column, as_date))
        kept = DeltaTable(path).to_pyarrow_table().cast(rows.schema)
        key = [("window_end", "ascending")]
        assert kept.sort_by(key).equals(expected.sort_by(key)), (column, cut)
        assert 0 < kept.num_rows < rows.num_rows or not cut.tenants


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["retain"], 'tenant_status" does not exist'),
        (["tenants", "purge", "ghost"], 'tenant_status" does not exist'),
        (["tenants", "purge", "Bad Id"], "not a tenant id: 'Bad Id'"),
    ],
)
def test_lake_commands_refuse_in_one_line_without_a_lake_or_a_valid_id(
    command: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--conf", str(Path(__file__).parents[1] / "conf"), "--lake-root", str(tmp_path)]
    assert main([*command, *flags]) == 2
    error = capsys.readouterr().err
    assert said in error and "Traceback" not in error
    assert len(error.strip().splitlines()) == 1, error


@pytest.mark.integration
def test_retain_deletes_closed_windows_past_retention_and_keeps_open_ones(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir, conf)
    globex = conf / "tenants" / "globex.yaml"
    globex.write_text(globex.read_text() + "retention: 400d\n")
    pipeline = Pipeline.create(
        kafka, tmp_path, conf, partitions=2, environ={"TW_LAKE__DEFAULT_RETENTION": "30d"}
    )
    registry = load_registry(conf)
    # 150 records a key a minute apart: the stream closes windows over two and a half hours.
    spec = LoadSpec(count=900, step="60s", late_share=0.05, seed=9)
    pipeline.produce_samples(generate(spec, {n: s.event_time for n, s in registry.sources.items()}))
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
    flags += ["--checkpoint-dir", pipeline.settings.stream.checkpoint_dir]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TW_LAKE__DEFAULT_RETENTION", "30d")
        assert main(["retain", "--dry-run", *flags]) == 0
        dry = capsys.readouterr().out
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
