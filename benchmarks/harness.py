"""Benchmark harness: suite registry, result rows, table/JSON output, thread and memory helpers.

A suite is a module exposing ``SUITE = "<name>"`` and ``run(quick: bool) -> list[dict]`` whose
rows are made with :func:`make_row`. ``python -m benchmarks SUITE`` runs it, prints a table and
writes ``benchmarks/results/<suite>.json`` (or ``--json PATH``): an object
``{"suite", "quick", "created", "seconds", "machine": {...}, "rows": [...]}`` where every row has
exactly the keys of :data:`ROW_KEYS` and ``machine`` records the host, CPU and BLAS threads.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib
import json
import math
import os
import platform
import resource
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "ROW_KEYS",
    "SUITES",
    "SuiteUnavailable",
    "format_table",
    "limit_threads",
    "load_suite",
    "machine_info",
    "main",
    "make_row",
    "mean_std",
    "peak_memory",
    "run_suite",
    "validate_row",
    "write_json",
]

ROW_KEYS = (
    "suite", "dataset", "algorithm", "epsilon", "delta", "metric",
    "value", "std", "seeds", "baseline", "ratio", "seconds",
)

#: suite name -> module path (modules are written by the suites' owners).
SUITES: dict[str, str] = {
    "quality-synthetic": "benchmarks.quality_synthetic",
    "quality-ml1m": "benchmarks.quality_ml1m",
    "speed-train": "benchmarks.speed_train",
    "ingest": "benchmarks.ingest",
    "serve": "benchmarks.serve",
    "dpfw": "benchmarks.dpfw",
    "onebit": "benchmarks.onebit",
    "cmf": "benchmarks.cmf",
    "quality-defaults": "benchmarks.quality_defaults",
    "audit": "benchmarks.audit",
    "cli": "benchmarks.cli",
    "ledger": "benchmarks.ledger",
    "lifetime": "benchmarks.lifetime",
    "scale": "benchmarks.scale",
}

RESULTS_DIR = Path(__file__).resolve().parent / "results"


class SuiteUnavailable(RuntimeError):
    """The suite is unknown or its module cannot be imported."""


# ---------------------------------------------------------------------------- rows
def _opt_float(name: str, x: Any, *, positive: bool = False) -> float | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"row field {name!r} must be a number or None, got {x!r}")
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"row field {name!r} must be finite (use None for 'not applicable'), got {x}")
    if positive and x <= 0:
        raise ValueError(f"row field {name!r} must be > 0, got {x}")
    return x


def validate_row(row: dict) -> dict:
    """Check a row has exactly :data:`ROW_KEYS` with sane types; return it normalised.

    ``epsilon``/``delta`` are None for non-private algorithms; ``seeds`` is the number of seeds
    (int >= 1) or the list of seeds; ``std``/``baseline``/``ratio``/``seconds`` may be None.
    """
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a dict, got {type(row).__name__}")
    keys = set(row)
    if keys != set(ROW_KEYS):
        raise ValueError(
            f"row keys differ: missing {sorted(set(ROW_KEYS) - keys)}, unexpected {sorted(keys - set(ROW_KEYS))}"
        )
    out: dict[str, Any] = {}
    for name in ("suite", "dataset", "algorithm", "metric"):
        if not isinstance(row[name], str) or not row[name]:
            raise ValueError(f"row field {name!r} must be a non-empty string, got {row[name]!r}")
        out[name] = row[name]
    out["epsilon"] = _opt_float("epsilon", row["epsilon"], positive=True)
    out["delta"] = _opt_float("delta", row["delta"], positive=True)
    if out["delta"] is not None and out["delta"] >= 1:
        raise ValueError(f"row field 'delta' must be < 1, got {out['delta']}")
    value = _opt_float("value", row["value"])
    if value is None:
        raise ValueError("row field 'value' is required")
    out["value"] = value
    out["std"] = _opt_float("std", row["std"])
    seeds = row["seeds"]
    if isinstance(seeds, bool):
        raise ValueError("row field 'seeds' must be an int or a list of ints")
    if isinstance(seeds, int):
        if seeds < 1:
            raise ValueError(f"row field 'seeds' must be >= 1, got {seeds}")
    elif isinstance(seeds, (list, tuple)) and seeds and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        seeds = [int(s) for s in seeds]
    else:
        raise ValueError(f"row field 'seeds' must be an int >= 1 or a non-empty list of ints, got {seeds!r}")
    out["seeds"] = seeds
    out["baseline"] = _opt_float("baseline", row["baseline"])
    out["ratio"] = _opt_float("ratio", row["ratio"])
    out["seconds"] = _opt_float("seconds", row["seconds"])
    if out["seconds"] is not None and out["seconds"] < 0:
        raise ValueError("row field 'seconds' must be >= 0")
    return {k: out[k] for k in ROW_KEYS}


def make_row(
    suite: str,
    dataset: str,
    algorithm: str,
    metric: str,
    value: float,
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    std: float | None = None,
    seeds: int | Sequence[int] = 1,
    baseline: float | None = None,
    ratio: float | None = None,
    seconds: float | None = None,
) -> dict:
    """A validated result row; ``ratio`` defaults to value / baseline when a baseline is given."""
    if ratio is None and baseline is not None and baseline != 0:
        ratio = float(value) / float(baseline)
    return validate_row(
        {
            "suite": suite, "dataset": dataset, "algorithm": algorithm, "epsilon": epsilon,
            "delta": delta, "metric": metric, "value": value, "std": std,
            "seeds": list(seeds) if isinstance(seeds, (list, tuple)) else seeds,
            "baseline": baseline, "ratio": ratio, "seconds": seconds,
        }
    )


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (ddof=1) over seeds; std is None for a single value."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("mean_std of no values")
    mean = sum(vals) / len(vals)
    if len(vals) == 1:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))


# ---------------------------------------------------------------------------- output
def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, list):
        return str(len(x))
    if isinstance(x, float):
        if x == 0:
            return "0"
        if abs(x) >= 1e5 or abs(x) < 1e-3:
            return f"{x:.3g}"
        return f"{x:.4g}"
    return str(x)


def format_table(rows: Sequence[dict]) -> str:
    """Fixed-width text table of the rows (all :data:`ROW_KEYS` columns, ``seeds`` as a count)."""
    cells = [list(ROW_KEYS)] + [[_fmt(r[k]) for k in ROW_KEYS] for r in rows]
    widths = [max(len(row[c]) for row in cells) for c in range(len(ROW_KEYS))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_json(path: str | Path, suite: str, rows: Sequence[dict], *, quick: bool, seconds: float | None = None,
               machine: dict | None = None) -> Path:
    """Write the result document (rows validated, strict JSON: no NaN/inf); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "suite": suite,
        "quick": bool(quick),
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "seconds": seconds,
        "machine": machine if machine is not None else machine_info(),
        "rows": [validate_row(r) for r in rows],
    }
    path.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    return path


# ---------------------------------------------------------------------------- machine, threads, memory
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict:
    """Host facts a reader needs to compare timings: CPU, cores, memory, BLAS libraries/threads."""
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(pages * size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        info["memory_gib"] = None
    try:
        import numpy

        info["numpy"] = numpy.__version__
    except ImportError:  # pragma: no cover - numpy is a hard dependency
        pass
    try:
        from threadpoolctl import threadpool_info

        info["threadpools"] = [
            {"api": p.get("user_api"), "library": p.get("internal_api"), "num_threads": p.get("num_threads")}
            for p in threadpool_info()
        ]
    except ImportError:  # pragma: no cover
        info["threadpools"] = []
    return info


@contextlib.contextmanager
def limit_threads(n: int | None) -> Iterator[None]:
    """Limit BLAS/OpenMP thread pools to ``n`` threads inside the block (None: no limit)."""
    if n is None:
        yield
        return
    if n < 1:
        raise ValueError("thread limit must be >= 1")
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=int(n)):
        yield


def _rss_bytes() -> int:
    """Current resident set size (Linux /proc; falls back to the lifetime peak elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class MemoryPeak:
    """Result of :func:`peak_memory` (MiB). ``rss_*`` see native allocations (BLAS, C++ extensions)."""

    rss_before_mib: float = 0.0
    rss_peak_mib: float = 0.0
    traced_peak_mib: float | None = None


@contextlib.contextmanager
def peak_memory(interval: float = 0.005, trace_python: bool = False) -> Iterator[MemoryPeak]:
    """Measure peak memory of a block: RSS sampled every ``interval`` s by a background thread
    (catches native allocations), plus optionally the tracemalloc peak of Python/numpy buffers."""
    result = MemoryPeak(rss_before_mib=_rss_bytes() / 2**20)
    result.rss_peak_mib = result.rss_before_mib
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            result.rss_peak_mib = max(result.rss_peak_mib, _rss_bytes() / 2**20)
            stop.wait(interval)

    started_trace = trace_python and not tracemalloc.is_tracing()
    if started_trace:
        tracemalloc.start()
    if trace_python:
        tracemalloc.reset_peak()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield result
    finally:
        stop.set()
        thread.join()
        result.rss_peak_mib = max(result.rss_peak_mib, _rss_bytes() / 2**20)
        if trace_python:
            result.traced_peak_mib = tracemalloc.get_traced_memory()[1] / 2**20
            if started_trace:
                tracemalloc.stop()


# ---------------------------------------------------------------------------- suites
def load_suite(name: str, registry: dict[str, str] | None = None) -> ModuleType:
    """Import the suite's module and check it exposes ``SUITE == name`` and ``run``."""
    registry = SUITES if registry is None else registry
    if name not in registry:
        raise SuiteUnavailable(f"unknown suite {name!r}; known suites: {', '.join(sorted(registry))}")
    module_path = registry[name]
    try:
        module = importlib.import_module(module_path)
    except ModuleNotFoundError as exc:
        if exc.name and module_path.startswith(exc.name):
            raise SuiteUnavailable(
                f"suite {name!r} is registered as module {module_path!r}, which does not exist yet"
            ) from exc
        raise
    if getattr(module, "SUITE", None) != name or not callable(getattr(module, "run", None)):
        raise SuiteUnavailable(f"module {module_path!r} must define SUITE = {name!r} and run(quick) -> list[dict]")
    return module


def run_suite(name: str, quick: bool = False, registry: dict[str, str] | None = None,
              threads: int | None = None) -> tuple[list[dict], float]:
    """Run a suite; return (validated rows, wall seconds). Rows must carry ``suite == name``."""
    module = load_suite(name, registry)
    t0 = time.perf_counter()
    with limit_threads(threads):
        rows = module.run(quick)
    seconds = time.perf_counter() - t0
    if not isinstance(rows, list):
        raise ValueError(f"suite {name!r} returned {type(rows).__name__}, expected a list of rows")
    checked = [validate_row(r) for r in rows]
    wrong = {r["suite"] for r in checked} - {name}
    if wrong:
        raise ValueError(f"suite {name!r} produced rows labelled {sorted(wrong)}")
    return checked, seconds


def main(argv: Sequence[str] | None = None, registry: dict[str, str] | None = None) -> int:
    """CLI: run one suite, print its table, write its JSON. Returns the exit status."""
    registry = SUITES if registry is None else registry
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description="Run a privrec benchmark suite.")
    parser.add_argument("suite", nargs="?", help="suite name (see --list)")
    parser.add_argument("--quick", action="store_true", help="small settings (under a minute)")
    parser.add_argument("--json", metavar="PATH", help="result file (default benchmarks/results/<suite>.json)")
    parser.add_argument("--threads", type=int, default=None, help="limit BLAS/OpenMP threads (threadpoolctl)")
    parser.add_argument("--list", action="store_true", help="list the registered suites and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, module in sorted(registry.items()):
            print(f"{name:20s} {module}")
        return 0
    if not args.suite:
        parser.print_usage(sys.stderr)
        print("error: a suite name is required (see --list)", file=sys.stderr)
        return 2
    try:
        rows, seconds = run_suite(args.suite, args.quick, registry, args.threads)
    except SuiteUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    machine = machine_info()
    machine["thread_limit"] = args.threads
    print(f"suite {args.suite} ({'quick' if args.quick else 'full'}): {len(rows)} rows in {seconds:.1f} s "
          f"on {machine['cpu']} x{machine['affinity'] or machine['cpu_count']}")
    print(format_table(rows))
    path = write_json(args.json or RESULTS_DIR / f"{args.suite}.json", args.suite, rows,
                      quick=args.quick, seconds=seconds, machine=machine)
    print(f"wrote {path}")
    return 0
