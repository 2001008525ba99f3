"""Exactly-once side effects: tell endpoints about committed panes (docs/notifications.md)."""
