"""Watching the stream: each batch's progress, `status`, Prometheus metrics and their endpoint."""
