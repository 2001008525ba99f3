"""The query service's FAIR pools, without Spark: a bounded set, each declared to Spark."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path

from storage.query.query_service import (
    OPERATOR,
    QUERY_POOLS,
    fair_scheduler_conf,
    scheduler_pool,
)


def test_any_number_of_tenants_share_a_bounded_set_of_pools() -> None:
    pools = {scheduler_pool(f"tenant-{number:06d}") for number in range(100_000)}
    assert len(pools) == QUERY_POOLS
    assert scheduler_pool("acme") == scheduler_pool("acme")  # the same in every process
    assert scheduler_pool(OPERATOR) not in pools


def test_every_pool_a_statement_can_run_in_is_declared_fair(tmp_path: Path) -> None:
    conf = fair_scheduler_conf(tmp_path)
    assert conf["spark.scheduler.mode"] == "FAIR"
    declared = ElementTree.parse(conf["spark.scheduler.allocation.file"]).getroot()
    modes = {pool.get("name"): pool.findtext("schedulingMode") for pool in declared}
    tenants = {scheduler_pool(f"tenant-{number}") for number in range(10_000)}
    assert set(modes) == tenants | {scheduler_pool(OPERATOR)}
    assert set(modes.values()) == {"FAIR"}
