"""Entry point: ``python -m benchmarks SUITE [--quick] [--json PATH]`` / ``--list``."""

import sys

from benchmarks.harness import main

if __name__ == "__main__":
    sys.exit(main())
