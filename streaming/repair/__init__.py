"""Operator repairs of one tenant's output: replaying its records with its current rules
(`tenants reprocess`)."""
