"""What Spark's fresh Python processes for the Data Source import: on a start's critical path,
the ones that only declare the source and plan its reads must not import a Kafka client,
pydantic or pandas (`streaming.kafka.source` says why)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT

PICKLE_CONFIGURED_SOURCE = """
import sys
from pyspark import cloudpickle
from streaming.kafka.client import PLAINTEXT
from streaming.kafka.deferral import Deferral
from streaming.kafka.source import register
from streaming.fault_points import NO_FAULTS
from tenants.config_store import ConfigSnapshots
from tenants.settings import StreamSettings

class Session:
    class dataSource:
        @staticmethod
        def register(source):
            Session.source = source

deferral = Deferral.for_stream(StreamSettings(), sys.argv[2], {}, ConfigSnapshots(sys.argv[3]))
register(Session, NO_FAULTS, deferral, PLAINTEXT)
with open(sys.argv[1], "wb") as out:
    out.write(cloudpickle.dumps(Session.source))
"""

# As Spark's `create_data_source` and `plan_data_source_read` workers do: the class, an
# instance with the query's options, its schema, a stream reader, pickled for the executors.
DECLARE_AND_PLAN = """
import pickle, sys
import pyspark.sql.worker.create_data_source, pyspark.sql.worker.plan_data_source_read
from pyspark import cloudpickle
with open(sys.argv[1], "rb") as pickled:
    source_class = pickle.loads(pickled.read())
source = source_class({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"})
cloudpickle.dumps(source.streamReader(source.schema()))
print(" ".join(sorted(sys.modules)))
"""

HEAVY = ("kafka", "confluent_kafka", "pydantic", "pandas", "tenants.models")


def test_declaring_and_planning_the_source_imports_no_client_pydantic_or_pandas(
    tmp_path: Path,
) -> None:
    pickled = tmp_path / "source.pickle"
    subprocess.run(
        [sys.executable, "-c", PICKLE_CONFIGURED_SOURCE, str(pickled), str(tmp_path / "lake"),
         str(tmp_path / "tenant_config")],
        cwd=ROOT, check=True, timeout=120,
    )  # fmt: skip
    planned = subprocess.run(
        [sys.executable, "-c", DECLARE_AND_PLAN, str(pickled)],
        cwd=ROOT, check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    modules = set(planned.stdout.split())
    assert "streaming.kafka.source" in modules
    assert not {module for module in HEAVY if module in modules}
