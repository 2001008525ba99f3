"""The default local master: two task slots a core this process may use, on any system; and the
cores under a session's slots."""

from __future__ import annotations

import os

import pytest

from streaming.pipeline import spark_session
from streaming.pipeline.spark_session import LOCAL_SLOTS_PER_CORE, session_master, task_cores


def test_a_master_given_is_kept() -> None:
    assert session_master("spark://127.0.0.1:7077") == "spark://127.0.0.1:7077"


def test_the_default_runs_two_slots_a_core_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spark_session, "_under_spark_submit", lambda: False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2}, raising=False)
    assert session_master(None) == f"local[{3 * LOCAL_SLOTS_PER_CORE}]"


def test_a_system_without_affinity_counts_the_machines_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spark_session, "_under_spark_submit", lambda: False)
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    assert session_master(None) == f"local[{5 * LOCAL_SLOTS_PER_CORE}]"


def test_a_local_sessions_slots_share_the_cores_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    assert task_cores(f"local[{2 * LOCAL_SLOTS_PER_CORE}]", 2 * LOCAL_SLOTS_PER_CORE) == 2
    assert task_cores("local[16]", 16) == 2
    assert task_cores("local[1]", 1) == 1
    assert task_cores("local", 1) == 1


def test_a_clusters_executors_run_a_task_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    assert task_cores("spark://127.0.0.1:7077", 16) == 16
    assert task_cores("spark://127.0.0.1:7077", 1) == 1
