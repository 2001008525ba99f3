import os
from pathlib import Path

import pytest

from streaming.pipeline.spark_home import LINKED_PARTS, home_without_python_zips, spark_home


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    """A PySpark wheel's own Spark home: its parts, and the zip of its Python code."""
    pyspark_dir = tmp_path / "site-packages" / "pyspark"
    for part in LINKED_PARTS:
        (pyspark_dir / part).mkdir(parents=True)
    (pyspark_dir / "jars" / "spark-core.jar").write_bytes(b"jar")
    (pyspark_dir / "python" / "lib").mkdir(parents=True)
    (pyspark_dir / "python" / "lib" / "pyspark.zip").write_bytes(b"zip")
    return pyspark_dir


def test_the_home_has_the_wheels_spark_parts_and_not_its_python_zips(
    wheel: Path, tmp_path: Path
) -> None:
    home = home_without_python_zips(wheel, tmp_path / "cache")
    assert home is not None
    assert (home / "jars" / "spark-core.jar").read_bytes() == b"jar"
    assert sorted(path.name for path in home.iterdir()) == sorted(LINKED_PARTS)
    assert not (home / "python").exists()
    # Made once: the next start finds it, and nothing was left half-built beside it.
    assert home_without_python_zips(wheel, tmp_path / "cache") == home
    assert [path.name for path in (tmp_path / "cache").iterdir()] == [home.name]


def test_no_home_where_there_is_no_zip_or_no_cache_can_be_made(wheel: Path, tmp_path: Path) -> None:
    (wheel / "python" / "lib" / "pyspark.zip").unlink()
    assert home_without_python_zips(wheel, tmp_path / "cache") is None
    (wheel / "python" / "lib" / "pyspark.zip").write_bytes(b"zip")
    not_a_folder = tmp_path / "not-a-folder"
    not_a_folder.write_text("")
    assert home_without_python_zips(wheel, not_a_folder / "cache") is None


def test_a_home_that_links_elsewhere_is_not_used(wheel: Path, tmp_path: Path) -> None:
    home = home_without_python_zips(wheel, tmp_path / "cache")
    assert home is not None
    (home / "jars").unlink()
    (home / "jars").symlink_to(tmp_path, target_is_directory=True)
    assert home_without_python_zips(wheel, tmp_path / "cache") is None


def test_spark_home_is_set_only_while_the_jvm_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    with spark_home(tmp_path):
        assert os.environ["SPARK_HOME"] == str(tmp_path)
    assert "SPARK_HOME" not in os.environ
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")
    with spark_home(None):
        assert os.environ["SPARK_HOME"] == "/opt/spark"
    with spark_home(tmp_path):
        pass
    assert os.environ["SPARK_HOME"] == "/opt/spark"
