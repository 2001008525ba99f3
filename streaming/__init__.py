"""The stream: Kafka in, per-key watermarks and windows in hash buckets of state, the sink, and
`app`, the composition root that wires and runs it all."""
