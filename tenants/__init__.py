"""Tenant and source configuration: frozen models, YAML loading, the registry."""
