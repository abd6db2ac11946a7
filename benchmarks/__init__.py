"""Benchmark suites for privrec: ``python -m benchmarks SUITE [--quick] [--json PATH]``."""
