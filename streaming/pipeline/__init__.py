"""The streaming query as Spark runs it: the session, the plan, the `foreachBatch` sink and when
the stream compacts."""
