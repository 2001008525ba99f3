"""Records in: each Kafka value parsed and routed to its (tenant, source), or quarantined with
its reason, and the quarantine log."""
