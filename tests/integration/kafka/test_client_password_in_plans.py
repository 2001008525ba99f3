"""The Kafka password the settings give never shows in a Spark plan: Spark redacts the mapped
options of a source. (The client settings themselves: tests/unit/streaming/kafka/test_client.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr

from streaming.kafka.client import KafkaSecurity
from streaming.kafka.options import SOURCE_NAME
from streaming.kafka.source import register

PASSWORD = "pa55-w0rd-never-printed"


@pytest.mark.integration
def test_spark_redacts_the_password_of_the_mapped_options_in_plans(spark: Any) -> None:
    """Spark's own Kafka source is not installed here; any source's options show in plans the
    same way, so the mapped options are given to this project's source."""
    register(spark)
    security = KafkaSecurity("SASL_SSL", "SCRAM-SHA-256", "u", SecretStr(PASSWORD), "/ca.pem")
    frame = (
        spark.readStream.format(SOURCE_NAME)
        .options(**security.spark_options())
        .option("kafka.bootstrap.servers", "127.0.0.1:9")
        .option("subscribe", "events")
        .load()
    )
    plan = frame._jdf.queryExecution().toString()
    assert "kafka.sasl.jaas.config=*********(redacted)" in plan
    assert "kafka.sasl.mechanism=SCRAM-SHA-256" in plan and PASSWORD not in plan
