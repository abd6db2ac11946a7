"""Suite ``cli``: start-up CPU of the ``privrec`` commands (user + system time of the child process).

Each command runs as the operator runs it (the installed ``privrec`` script, a fresh process, a
migrated SQLite database in a temporary folder, no Redis); its CPU time is read from the kernel's
accounting of the waited child (``getrusage(RUSAGE_CHILDREN)`` before and after), so the figure
includes the interpreter's own start. Rows: metric ``startup_cpu_s`` per command, the median over
the repeats with their standard deviation; ``seconds`` is the median wall time.

Cost: about 9 s of CPU per repeat over all commands (``budget``, ``migrate`` and ``openapi`` load
SQLAlchemy, the accountant, Alembic or the web app: 2–4 s each); 3 repeats quick (~30 s of CPU),
7 full (~65 s), one core.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import make_row

SUITE = "cli"
SECRET = "benchmark-cli-secret-0123456789abcdef"

#: (row name, argv after ``privrec``): the light commands first.
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("--help", ("--help",)),
    ("issue-token", ("issue-token", "--admin")),
    ("import-items --help", ("import-items", "--help")),
    ("budget", ("budget",)),
    ("migrate (at head)", ("migrate",)),
    ("openapi", ("openapi",)),
)


def _privrec() -> str:
    return str(Path(sys.executable).with_name("privrec"))


def child_cpu(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(CPU seconds: user + system, wall seconds) of one run of ``argv`` as a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def run(quick: bool) -> list[dict]:
    repeats = 3 if quick else 7
    rows = []
    with tempfile.TemporaryDirectory(prefix="privrec-cli-bench-") as folder:
        cwd = Path(folder)
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL", "ARTIFACT_DIR")}
        env.update(DATABASE_URL=f"sqlite:///{cwd / 'bench.db'}", ARTIFACT_DIR=str(cwd / "artifacts"), SECRET_KEY=SECRET)
        subprocess.run([_privrec(), "migrate"], env=env, cwd=cwd, stdout=subprocess.DEVNULL, check=True)
        for name, argv in COMMANDS:
            runs = [child_cpu([_privrec(), *argv], env, cwd) for _ in range(repeats)]
            cpu = [c for c, _ in runs]
            rows.append(make_row(SUITE, "sqlite", name, "startup_cpu_s", statistics.median(cpu),
                                 std=statistics.stdev(cpu) if len(cpu) > 1 else None, seeds=repeats,
                                 seconds=statistics.median(w for _, w in runs)))
    return rows
