"""Entry point: ``python -m benchmarks SUITE [--quick] [--json PATH]`` / ``--list``."""

import sys

from benchmarks.harness import SUITES, main

SUITES.setdefault("hostile", "benchmarks.hostile")  # hostile requests: server CPU, /health beside

if __name__ == "__main__":
    sys.exit(main())
