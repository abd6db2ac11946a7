"""Bucket-level parallelism for the batched solvers.

Many small matrix products and factorisations run fastest with BLAS on one thread and the
buckets spread over a pool of Python threads (numpy releases the GIL inside them); a
multi-threaded BLAS on 64x64 problems spends its time synchronising.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from threadpoolctl import threadpool_limits

__all__ = ["default_threads", "parallel_map"]

T = TypeVar("T")
R = TypeVar("R")


def default_threads() -> int:
    """``PRIVREC_THREADS`` if set, else the number of CPUs this process may use."""
    configured = os.environ.get("PRIVREC_THREADS")
    if configured:
        value = int(configured)
        if value < 1:
            raise ValueError("PRIVREC_THREADS must be >= 1")
        return value
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def parallel_map(fn: Callable[[T], R], items: Iterable[T], n_threads: int | None = None) -> list[R]:
    """``[fn(x) for x in items]`` on ``n_threads`` threads with single-threaded BLAS, in order."""
    n = default_threads() if n_threads is None else n_threads
    items = list(items)
    with threadpool_limits(limits=1, user_api="blas"):
        if n <= 1 or len(items) <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(max_workers=n) as pool:
            return list(pool.map(fn, items))
