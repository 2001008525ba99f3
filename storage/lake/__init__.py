"""Writing the lake: table schemas, executors' data files, fenced Delta commits, S3 options, the
snapshot reader, the writer lease and the notification outbox."""
