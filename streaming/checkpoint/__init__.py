"""Spark's checkpoint read without Spark, and the identity that ties a checkpoint to one stream."""
