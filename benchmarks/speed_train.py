"""speed-train: seconds per training step, DPALS and our ALS next to ``implicit``'s CPU ALS.

Data: the production-shaped synthetic generator (138K users x 20K items x 10M ratings; the
quick mode uses 20K x 5K x 1M), same matrix for every algorithm, ranks 64 and 128, in one run.

* ``implicit``: ``implicit.cpu.als.AlternatingLeastSquares`` (its defaults: float32, conjugate
  gradient), ``num_threads`` = BLAS_THREADS and its BLAS pool at one thread, as it recommends;
  seconds per iteration (one user and one item pass) from its own per-iteration callback.
* ``als``: our non-private weighted ALS with exact solves (``solver="exact"``), seconds per
  iteration; ``als-cg`` the same with three warm-started conjugate-gradient steps per row instead
  (``solver="cg"``, as implicit; ALSConfig's default).
* ``cpu_seconds_per_step``: the process's CPU seconds (all threads) over the same steps, steadier
  than wall time on a shared machine; peak-memory rows carry their ratio to implicit's.
* ``dpals``: seconds per DPALS step with the config's defaults otherwise (user CG iterations,
  ``user_cg_steps`` = 6; clipping, noisy Grams, PSD projection, item solves); pre-processing
  (Algorithm 3) is reported separately. ``seconds_noise``: the time spent in the exact
  discrete-Gaussian grid releases (``app.core.privacy.discrete_noise``; rounding to the grid and
  integer sampling) over the whole run divided by its T steps, summed over the solver threads;
  it is part of ``seconds_per_step``. ``cpu_seconds_noise``: the same releases' CPU seconds
  (per-thread CPU time, summed; not inflated by other load), next to the step's
  ``cpu_seconds_per_step``.
* ``noise_draws_per_s`` (dataset ``noise-sigma-2^k``): a micro-benchmark of the exact discrete
  Gaussian sampler at integer σ = 2^k (k = 10, 15, 20: the grid releases' range), one thread,
  best of a few repetitions in process CPU time, next to numpy's float ``normal`` in the same
  run (``baseline``; ``ratio`` = exact / float).
Peak resident memory of each run is reported as its own row (the process's RSS, the data included;
each run starts after the heap pages earlier runs freed are returned to the OS). Ratios are against implicit's
iteration in the same run; no absolute time is asserted anywhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial

import numpy as np

from app.core.data.ratings import Ratings
from app.core.data.synthetic import production_synthetic
from app.core.mf.als import ALSConfig, train_als
from app.core.mf.dpals import DPALSConfig, train_dpals
from app.core.privacy.discrete_noise import GridGaussian, discrete_gaussian
from benchmarks.harness import MemoryPeak, limit_threads, make_row, peak_memory

SUITE = "speed-train"
BLAS_THREADS = 2
FULL_SHAPE = (138_000, 20_000, 10_000_000)
QUICK_SHAPE = (20_000, 5_000, 1_000_000)
RANKS = (64, 128)
STEPS = 2
NOISE_SIGMA_EXPONENTS = (10, 15, 20)
NOISE_DRAWS = 1 << 21


def _stamp() -> tuple[float, float]:
    """(wall clock, CPU seconds of this process, all threads)."""
    return time.perf_counter(), time.process_time()


def _step_times(train: Callable[..., object]) -> tuple[float, float, float]:
    """Run ``train(progress=...)``; return mean wall and CPU seconds between progress calls, and the
    wall seconds before the first call (pre-processing and the first step)."""
    stamps: list[tuple[float, float]] = []
    start = _stamp()
    train(progress=lambda fraction, stage: stamps.append(_stamp()))
    edges = [start] + stamps if len(stamps) == 1 else stamps
    steps = np.diff(np.array(edges), axis=0)
    return float(steps[:, 0].mean()), float(steps[:, 1].mean()), stamps[0][0] - start[0]


@contextlib.contextmanager
def _noise_timer() -> Iterator[list[float]]:
    """Accumulate the wall and the CPU seconds spent in grid releases (each summed over the
    threads) into the yielded list: [wall, CPU]. CPU time (``time.thread_time``) is not inflated
    by other load on a shared machine, wall time is."""
    total = [0.0, 0.0]
    lock = threading.Lock()
    originals = {name: getattr(GridGaussian, name) for name in ("release", "release_symmetric")}  # neither calls the other

    def timer(original: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        def timed(self: GridGaussian, rng: np.random.Generator, value: np.ndarray, **kwargs: np.ndarray) -> np.ndarray:
            start, start_cpu = time.perf_counter(), time.thread_time()
            try:
                return original(self, rng, value, **kwargs)
            finally:
                with lock:
                    total[0] += time.perf_counter() - start
                    total[1] += time.thread_time() - start_cpu

        return timed

    for name, original in originals.items():
        setattr(GridGaussian, name, timer(original))
    try:
        yield total
    finally:
        for name, original in originals.items():
            setattr(GridGaussian, name, original)


def _release_freed_heap() -> None:
    """Return the heap pages earlier runs freed to the OS (glibc ``malloc_trim``; a no-op elsewhere),
    so that a run's peak RSS is its data and its own allocations, not the allocator's leftovers."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


@contextlib.contextmanager
def _run_memory() -> Iterator[MemoryPeak]:
    """:func:`peak_memory` of one run, after :func:`_release_freed_heap`."""
    _release_freed_heap()
    with peak_memory() as memory:
        yield memory


def _draws_per_second(draw: Callable[[int], object], n: int, repeats: int = 3) -> float:
    """Draws per second of ``draw(n)``: best of ``repeats`` in process CPU time (other load on a
    shared machine inflates wall time, not this process's CPU time)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        draw(n)
        best = min(best, time.process_time() - start)
    return n / max(best, 1e-9)


def noise_rows(n: int = NOISE_DRAWS) -> list[dict]:
    """``noise_draws_per_s`` of the exact discrete Gaussian at σ = 2^k vs numpy's float normal."""
    rng = np.random.default_rng(0)
    rows = []
    with limit_threads(1):
        for exponent in NOISE_SIGMA_EXPONENTS:
            sigma = 1 << exponent
            exact = _draws_per_second(partial(discrete_gaussian, rng, sigma), n)
            floats = _draws_per_second(partial(rng.normal, 0.0, float(sigma)), n)
            rows.append(_row(f"noise-sigma-2^{exponent}", "discrete-gaussian", "noise_draws_per_s", exact, floats))
            rows.append(_row(f"noise-sigma-2^{exponent}", "numpy-normal", "noise_draws_per_s", floats))
    return rows


def _implicit_seconds(ratings: Ratings, rank: int) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds per iteration, peak RSS MiB) of implicit's ALS."""
    from implicit.cpu.als import AlternatingLeastSquares

    per_iteration: list[float] = []
    cpu: list[float] = []
    with limit_threads(1), _run_memory() as memory:  # implicit checks the BLAS pool when constructed
        model = AlternatingLeastSquares(factors=rank, iterations=STEPS + 1, random_state=0, num_threads=BLAS_THREADS)

        def callback(iteration: int, elapsed: float, loss: float) -> None:
            per_iteration.append(elapsed)
            cpu.append(time.process_time())

        model.fit(ratings.csr.astype(np.float32), show_progress=False, callback=callback)
    # the first iteration warms up
    return float(np.mean(per_iteration[1:])), float(np.mean(np.diff(cpu))), memory.rss_peak_mib


def _row(dataset: str, algorithm: str, metric: str, value: float, baseline: float | None = None) -> dict:
    seconds = value if metric.startswith("seconds") else None
    return make_row(SUITE, dataset, algorithm, metric, value, baseline=baseline, seconds=seconds)


def run(quick: bool) -> list[dict]:
    n_users, n_items, n_ratings = QUICK_SHAPE if quick else FULL_SHAPE
    ranks = RANKS[:1] if quick else RANKS
    ratings = production_synthetic(n_users, n_items, n_ratings, seed=0).ratings
    dataset = f"production-synthetic-{n_users // 1000}Kx{n_items // 1000}Kx{n_ratings / 1e6:g}M"
    rows: list[dict] = noise_rows()
    for rank in ranks:
        name = f"{dataset}-r{rank}"
        implicit_step, implicit_cpu, implicit_mem = _implicit_seconds(ratings, rank)
        rows.append(_row(name, "implicit-als", "seconds_per_step", implicit_step))
        rows.append(_row(name, "implicit-als", "cpu_seconds_per_step", implicit_cpu))
        rows.append(_row(name, "implicit-als", "peak_rss_mib", implicit_mem))
        with limit_threads(BLAS_THREADS):
            als_config = ALSConfig(rank=rank, n_iters=STEPS, reg_item=5.0, reg_user=0.1, solver="exact")
            with _run_memory() as memory:
                als_step, als_cpu, _ = _step_times(partial(train_als, ratings, als_config))
            rows.append(_row(name, "als", "seconds_per_step", als_step, implicit_step))
            rows.append(_row(name, "als", "cpu_seconds_per_step", als_cpu, implicit_cpu))
            rows.append(_row(name, "als", "peak_rss_mib", memory.rss_peak_mib, implicit_mem))
            cg_config = replace(als_config, solver="cg", cg_steps=3)  # implicit's default: 3 CG steps
            with _run_memory() as memory:
                cg_step, cg_cpu, _ = _step_times(partial(train_als, ratings, cg_config))
            rows.append(_row(name, "als-cg", "seconds_per_step", cg_step, implicit_step))
            rows.append(_row(name, "als-cg", "cpu_seconds_per_step", cg_cpu, implicit_cpu))
            rows.append(_row(name, "als-cg", "peak_rss_mib", memory.rss_peak_mib, implicit_mem))
            dp_config = DPALSConfig(rank=rank, n_steps=STEPS, contribution_bound=50, frequent_fraction=1.0,
                                    contribution_mode="tail", noise_multiplier=1.0)
            with _run_memory() as memory, _noise_timer() as noise:
                dp_step, dp_cpu, preprocessing = _step_times(partial(train_dpals, ratings, dp_config))
            rows.append(_row(name, "dpals", "seconds_per_step", dp_step, implicit_step))
            rows.append(_row(name, "dpals", "cpu_seconds_per_step", dp_cpu, implicit_cpu))
            rows.append(_row(name, "dpals", "seconds_noise", noise[0] / STEPS, dp_step))
            rows.append(_row(name, "dpals", "cpu_seconds_noise", noise[1] / STEPS, dp_cpu))
            rows.append(_row(name, "dpals", "seconds_preprocessing_and_first_step", preprocessing))
            rows.append(_row(name, "dpals", "peak_rss_mib", memory.rss_peak_mib, implicit_mem))
    return rows
