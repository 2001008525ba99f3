"""Local infrastructure for tests and development: real services on loopback."""
