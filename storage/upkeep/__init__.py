"""Keeping the lake in shape: compaction, retention, purge, and which keys still hold state."""
