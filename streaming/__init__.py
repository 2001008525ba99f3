"""Streaming building blocks: the Kafka source for Spark Structured Streaming."""
