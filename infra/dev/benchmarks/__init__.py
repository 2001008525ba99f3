"""Benchmarks that print figures; run by hand, not by the test suite."""
