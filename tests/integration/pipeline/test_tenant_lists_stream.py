"""Tenants from a tenant list are windowed exactly as the same tenants from their own files.

Two streams on the real broker and Spark read the same records: one configured with a file
per tenant, one with one tenant file (acme) and the other three tenants in a list naming
shared rule sets. Their tables must hold the same rows.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.support.pipeline_harness import Pipeline, record
from tests.support.timestamps import T0_MS

pytestmark = pytest.mark.integration

LISTED = {"u1": "standard", "u2": "standard", "u3": "slow_web"}
RULE_SETS = """\
rule_sets:
  standard:
    sources: [web, billing]
  slow_web:
    sources:
      web: {window: {kind: tumbling, size: 5m}, allowed_lateness: 0s}
"""
OWN_FILES = {
    "u1": "id: u1\nsources: [web, billing]\n",
    "u2": "id: u2\nsources: [web, billing]\n",
    "u3": "id: u3\nsources:\n  web: {window: {kind: tumbling, size: 5m}, allowed_lateness: 0s}\n",
}
# Columns a run stamps with its own clock or batch numbering, not what the rows say.
RUN_COLUMNS = {"batch_id", "kafka_timestamp", "processing_time", "ingest_date", "topic"}


def _conf(root: Path, sample: Path, listed: bool) -> Path:
    conf = root / ("listed" if listed else "files")
    (conf / "tenants").mkdir(parents=True)
    shutil.copy(sample / "sources.yaml", conf / "sources.yaml")
    shutil.copy(sample / "tenants" / "acme.yaml", conf / "tenants" / "acme.yaml")
    if listed:
        (conf / "rule_sets.yaml").write_text(RULE_SETS)
        (conf / "tenant_lists").mkdir()
        rows = "".join(f"{tenant},{rule_set}\n" for tenant, rule_set in LISTED.items())
        (conf / "tenant_lists" / "customers.csv").write_text("tenant_id,rule_set\n" + rows)
    else:
        for tenant, body in OWN_FILES.items():
            (conf / "tenants" / f"{tenant}.yaml").write_text(body)
    return conf


def _records() -> list[dict[str, Any]]:
    records = []
    for step in range(40):  # 20 s apart: 13 minutes, so the early windows close
        for tenant in ("acme", "u1", "u2", "u3"):
            records.append(
                record(tenant, "web", T0_MS + step * 20_000, event_id=f"{tenant}w{step}")
            )
            # u3's rule set sends web only: its billing records are quarantined.
            records.append(
                record(
                    tenant,
                    "billing",
                    T0_MS + step * 20_000,
                    amount=step,
                    event_id=f"{tenant}b{step}",
                )
            )
    records.append(record("nobody", "web", T0_MS, event_id="unknown"))
    return records


def _content(pipeline: Pipeline, table: str) -> pd.DataFrame:
    frame = pipeline.table(table)
    frame = frame.drop(columns=[c for c in frame.columns if c in RUN_COLUMNS])
    frame = frame.astype(str)  # metrics maps and lists compare as their text
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


def test_list_tenants_produce_the_same_tables_as_tenant_files(
    kafka: Any, spark: Any, conf_dir: Path, tmp_path: Path
) -> None:
    records = _records()
    outputs = {}
    for listed in (False, True):
        conf = _conf(tmp_path / "conf", conf_dir, listed)
        workdir = tmp_path / ("listed" if listed else "files")
        workdir.mkdir()
        pipeline = Pipeline.create(kafka, workdir, conf, max_offsets_per_trigger=100)
        pipeline.produce(records)
        pipeline.run_available_now(spark)
        outputs[listed] = {
            table: _content(pipeline, table) for table in ("events", "windows", "quarantine")
        }
    from_files, from_list = outputs[False], outputs[True]
    for table in ("events", "windows", "quarantine"):
        pd.testing.assert_frame_equal(from_list[table], from_files[table], obj=table)
    events = from_list["events"]
    assert len(events) == 4 * 40 + 3 * 40  # every web record, and billing of all but u3
    quarantine = from_list["quarantine"]
    assert sorted(quarantine["reason"].value_counts().to_dict().items()) == [
        ("unknown_source", 40),
        ("unknown_tenant", 1),
    ]
    windows = from_list["windows"]
    u3_web = windows[(windows["tenant"] == "u3") & (windows["is_final"] == "True")]
    assert not u3_web.empty and set(u3_web["count"]) == {"15"}  # 5-minute windows of the list
