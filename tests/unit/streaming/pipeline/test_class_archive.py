"""Which archive a session maps, and when none: the rules that keep a stale one away."""

from __future__ import annotations

from pathlib import Path

import pytest

from streaming.pipeline import class_archive


def test_no_archive_means_no_options(tmp_path: Path) -> None:
    assert class_archive.java_options(tmp_path) == ""


def test_a_built_archive_is_mapped_quietly(tmp_path: Path) -> None:
    path = class_archive.archive_path(tmp_path)
    path.write_bytes(b"archive")
    options = class_archive.java_options(tmp_path).split()
    assert f"-XX:SharedArchiveFile={path}" in options
    # A JVM that cannot use it must start without a warning on every run.
    assert "-Xlog:cds=off" in options and "-Xlog:cds+dynamic=off" in options


def test_another_class_path_is_another_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    plain = class_archive.archive_path(tmp_path)
    # The launcher puts this folder first on the class path: the JVM would refuse the archive.
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "spark-conf"))
    assert class_archive.archive_path(tmp_path) != plain
    assert class_archive.archive_path(tmp_path).parent == tmp_path


def test_another_java_is_another_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = class_archive.archive_path(tmp_path)
    fake_home = tmp_path / "jdk"
    (fake_home / "bin").mkdir(parents=True)
    java = fake_home / "bin" / "java"
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(fake_home))
    assert class_archive.archive_path(tmp_path) != plain
