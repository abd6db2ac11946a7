"""The ``cli`` benchmark suite: registered, and its CPU reading is the child's own user + system time."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from benchmarks import cli as bench
from benchmarks import harness


def test_the_suite_is_registered_and_names_the_light_commands_first() -> None:
    assert harness.SUITES["cli"] == "benchmarks.cli" and harness.load_suite("cli") is bench
    assert [name for name, _ in bench.COMMANDS[:2]] == ["--help", "issue-token"]


def test_child_cpu_reads_the_child_process_not_the_parent(tmp_path: Path) -> None:
    busy = [sys.executable, "-c", "sum(i * i for i in range(3_000_000))"]
    idle = [sys.executable, "-c", "import time; time.sleep(0.3)"]
    busy_cpu, _ = bench.child_cpu(busy, dict(os.environ), tmp_path)
    idle_cpu, _ = bench.child_cpu(idle, dict(os.environ), tmp_path)
    assert busy_cpu > 0.05 and idle_cpu < busy_cpu  # the sleep's wall time is not CPU
