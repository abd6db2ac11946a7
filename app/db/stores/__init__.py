"""Per-domain stores: every query the use cases make, behind plain functions per domain."""
