"""A Spark Structured Streaming source for one Kafka topic, as a Python Data Source (`tw_kafka`).

No Maven repository is reachable here, so Spark's own Kafka connector jar is unavailable; this
source reads Kafka through kafka-python (driver) and librdkafka (executors) instead. It keeps
the built-in source's option names and output columns (those of `format("kafka")` with
`includeHeaders=true`), so a cluster that has the connector can switch formats by configuration
alone.

Modules: `options` parses Spark's Kafka option names; `offsets` plans each batch's offsets on
the driver (pure arithmetic, testable without a broker or Spark, plus the broker lookups it
plans from); `client` holds both clients' settings; `reader` reads an offset range on an
executor into Arrow batches; `schema` is the rows' schema; `source` wires these into Spark and
holds `register`.
"""
