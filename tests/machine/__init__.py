"""The environment record, memory accounts and the steadiness probe."""
