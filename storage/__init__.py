"""Delta tables under the lake root, idempotent micro-batch commits, and Spark SQL views."""
