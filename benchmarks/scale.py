"""Suite ``scale``: DPALS in process against the distributed driver on Dask ``LocalCluster`` s (issue 28).

Data: the production-shaped synthetic generator (speed-train's), rank 64, speed-train's DPALS
config (k = 50 by the tail rule, every item trained, noise multiplier 1) with two steps; full form
10⁷, 3·10⁷ and 10⁸ ratings (10⁶ users and 10⁵ items at the top) against clusters of 1, 2 and 4
workers; ``--quick`` 10⁵ and 10⁶ ratings against 1 and 2 workers. Runs, in one process, one after
the other on the same data and seed:

* ``in-process``: :func:`dpals.train_dpals` with every core (``PRIVREC_THREADS`` = the CPUs this
  process may use, as the service); ``in-process-1thread`` the same on one solver thread;
* ``dask-Nw``: :func:`app.core.mf.distributed.fit_distributed` with N user partitions (the public
  hash of the ids) on a fresh ``LocalCluster`` of N worker processes, one thread each, one solver
  thread (``PRIVREC_THREADS=1``; Dask sets one BLAS thread), no memory limit (no spilling, no
  nanny kill), no dashboard; the driver (and Dask's scheduler, which ``LocalCluster`` runs in the
  driver's process) keeps every core for its item step.

Rows (``seconds`` = the figure for time rows; the in-process run is the ``baseline`` of ratios):

* ``seconds_per_step``: wall seconds of the second step (between the two progress calls, less the
  counters' reads); ``seconds_preprocessing_and_first_step``;
* ``seconds_driver_item_step``: the driver's item step of the second step (its solves and noise;
  timed by wrapping ``dpals._item_step``); ``seconds_worker_tasks`` / ``seconds_reduce``: the
  workers' compute time in the second step (Dask's task stream), the per-partition tasks summed
  over the partitions (``seconds_worker_user_solves`` + ``seconds_worker_item_statistics``: the
  users' solves, and the dense per-item Gram and linear-term statistics), and the exact reductions;
* ``peak_rss_mib_driver``: the driver's resident memory sampled every 5 ms over the run (the data it
  holds included; the scheduler lives in it); ``peak_rss_mib_worker{i}``: each worker process's
  kernel high-water mark (``VmHWM``, /proc; ``ru_maxrss`` elsewhere) over its life (the cluster is
  fresh per run), next to ``rss_mib_worker_idle`` (the largest worker's before the run);
  ``worker_peak_over_target``: the largest worker peak over the issue's bound 1.2 × (in-process
  peak per rating) × (ratings of the largest partition) + 1 GiB (≤ 1 meets it);
* ``bytes_driver_cluster_per_step``: what crossed between the driver and the workers in the second
  step (:attr:`DaskExecutor.moved_bytes`: the shared item factors and the gathered reduced
  statistics, by ``dask.sizeof``); ``bytes_worker_worker_per_step``: what the workers fetched from
  each other (Dask's incoming-transfer log: partial statistics to the reducing worker, the shared
  factors to the other workers); ``bytes_per_step`` their sum; ``tasks_per_step``; on loopback the
  bytes are counted, not timed;
* ``equal_to_in_process``: 1 when the published model (factors, biases, counts, mean, trained set)
  and the ledger event are the in-process run's bit for bit, else 0.

Cost: ``--quick`` about a minute of wall time on 2 cores; the full form needs about 24 GB at 10⁸
(generator and in-process run included) and hours.
"""

from __future__ import annotations

import contextlib
import os
import resource
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.core.data.ratings import Ratings
from app.core.data.synthetic import production_synthetic
from app.core.mf import dpals
from app.core.mf.distributed import DaskExecutor, distributed_fit, partition_labels
from app.core.mf.dpals import DPALSConfig, train_dpals
from app.core.mf.model import PublicModel
from benchmarks.harness import SuiteUnavailable, limit_threads, make_row
from benchmarks.speed_train import _run_memory

SUITE = "scale"
RANK = 64
STEPS = 2
SEED = (1 << 100) + 7
#: (users, items, ratings)
FULL_SIZES = ((138_000, 20_000, 10_000_000), (400_000, 50_000, 30_000_000), (1_000_000, 100_000, 100_000_000))
QUICK_SIZES = ((2_000, 1_000, 100_000), (20_000, 5_000, 1_000_000))
FULL_WORKERS = (1, 2, 4)
QUICK_WORKERS = (1, 2)
MIB = 2**20
#: the per-partition tasks of a step and the reduction (names of :mod:`app.core.mf.distributed`'s tasks)
WORKER_TASKS = ("_users_task", "_statistics_task")
REDUCE_TASKS = ("reduce_exact",)


def config() -> DPALSConfig:
    """speed-train's DPALS config at rank 64, two steps, a fixed seed."""
    return DPALSConfig(rank=RANK, n_steps=STEPS, contribution_bound=50, frequent_fraction=1.0,
                       contribution_mode="tail", noise_multiplier=1.0, seed=SEED)


def cores() -> int:
    """The CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# ---------------------------------------------------------------------------- probes
@contextlib.contextmanager
def solver_threads(n: int) -> Iterator[None]:
    """``PRIVREC_THREADS`` = n (the solvers' thread pool) and n BLAS threads inside the block."""
    previous = os.environ.get("PRIVREC_THREADS")
    os.environ["PRIVREC_THREADS"] = str(n)
    try:
        with limit_threads(n):
            yield
    finally:
        if previous is None:
            os.environ.pop("PRIVREC_THREADS", None)
        else:
            os.environ["PRIVREC_THREADS"] = previous


@contextlib.contextmanager
def item_step_timer() -> Iterator[list[float]]:
    """Wall seconds of every ``dpals._item_step`` call in the block (both drivers look it up there)."""
    seconds: list[float] = []
    original = dpals._item_step

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)

    setattr(dpals, "_item_step", timed)  # noqa: B010 - a module attribute replaced for the block
    try:
        yield seconds
    finally:
        setattr(dpals, "_item_step", original)  # noqa: B010


def process_memory() -> tuple[float, float]:
    """(current, peak) resident MiB of the calling process: /proc's VmRSS and VmHWM on Linux, else
    ``ru_maxrss`` for both. Run on each worker by ``client.run``."""
    fields: dict[str, float] = {}
    with contextlib.suppress(OSError), open("/proc/self/status") as fh:
        for line in fh:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(rest.split()[0]) / 1024  # kB
    if len(fields) == 2:
        return fields["VmRSS"], fields["VmHWM"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return peak, peak


def received_bytes(start: float, stop: float, dask_worker: Any = None) -> int:
    """Bytes this worker fetched from other workers between ``start`` and ``stop`` (epoch seconds;
    Dask's own incoming-transfer log, which holds peer fetches only: a client's gathers and the
    scheduler's messages are not in it). Run on each worker by ``client.run``."""
    return int(sum(entry["total"] for entry in dask_worker.transfer_incoming_log if start <= entry["middle"] <= stop))


# ---------------------------------------------------------------------------- one run
@dataclass
class Stamp:
    """A progress call: when it was entered and left (epoch seconds) and the counters read in it."""

    entered: float
    left: float
    driver_bytes: int = 0
    tasks: int = 0


@dataclass
class Measured:
    """One run's figures (MiB, seconds, bytes)."""

    model: PublicModel
    start: float
    stamps: list[Stamp]
    driver_peak_mib: float
    item_steps: list[float]
    worker_idle_mib: list[float] = field(default_factory=list)
    worker_peak_mib: list[float] = field(default_factory=list)
    compute: dict[str, float] = field(default_factory=dict)
    worker_bytes: int = 0

    @property
    def step_s(self) -> float:
        return self.stamps[-1].entered - self.stamps[-2].left

    @property
    def first_s(self) -> float:
        return self.stamps[0].entered - self.start

    def per_step(self, name: str) -> int:
        return int(getattr(self.stamps[-1], name) - getattr(self.stamps[-2], name))


def in_process(ratings: Ratings, cfg: DPALSConfig, threads: int) -> Measured:
    """The service's trainer in this process on ``threads`` solver threads."""
    stamps: list[Stamp] = []

    def progress(fraction: float, stage: str) -> None:
        now = time.time()
        stamps.append(Stamp(now, now))

    with solver_threads(threads), item_step_timer() as item_steps, _run_memory() as memory:
        start = time.time()
        model = train_dpals(ratings, cfg, progress=progress)
    return Measured(model, start, stamps, memory.rss_peak_mib, item_steps)


def task_compute(client: Any, start: float, stop: float) -> dict[str, float]:
    """Compute seconds per task function (summed over its tasks) between ``start`` and ``stop``."""
    totals: dict[str, float] = {}
    for record in client.get_task_stream(start=start, stop=stop):
        for part in record["startstops"]:
            if part["action"] == "compute" and part["start"] >= start and part["stop"] <= stop:
                name = str(record["key"]).split("-", 1)[0]  # "<function>-<uuid>[-<i>]" (pure=False)
                totals[name] = totals.get(name, 0.0) + part["stop"] - part["start"]
    return totals


def on_cluster(ratings: Ratings, cfg: DPALSConfig, n_workers: int) -> Measured:
    """:func:`fit_distributed` with ``n_workers`` partitions on a fresh LocalCluster of as many
    single-threaded worker processes; the driver keeps every core."""
    from distributed import Client, LocalCluster

    with (tempfile.TemporaryDirectory(prefix="privrec-scale-") as folder,
          LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None,
                       memory_limit=0, local_directory=folder, env={"PRIVREC_THREADS": "1"}) as cluster,
          Client(cluster) as client):
        client.get_task_stream()  # the scheduler starts recording its task stream
        idle = client.run(process_memory)
        executor = DaskExecutor(client)
        stamps: list[Stamp] = []

        def progress(fraction: float, stage: str) -> None:
            now = time.time()
            stamps.append(Stamp(now, now, executor.moved_bytes, executor.tasks))

        with solver_threads(cores()), item_step_timer() as item_steps, _run_memory() as memory:
            start = time.time()
            model = train_dpals(ratings, cfg, progress=progress, fit=distributed_fit(executor, n_partitions=n_workers))
        peaks = client.run(process_memory)
        window = (stamps[-2].left, stamps[-1].entered)
        compute = task_compute(client, *window)
        fetched = sum(client.run(received_bytes, *window).values())
    return Measured(model, start, stamps, memory.rss_peak_mib, item_steps,
                    worker_idle_mib=[idle[w][0] for w in sorted(idle)],
                    worker_peak_mib=[peaks[w][1] for w in sorted(peaks)], compute=compute, worker_bytes=fetched)


def same_model(a: PublicModel, b: PublicModel) -> bool:
    """The published arrays and the ledger event, bit for bit."""
    arrays = ("item_factors", "item_biases", "item_counts", "trained_mask")
    return (all(np.array_equal(getattr(a, name), getattr(b, name)) for name in arrays)
            and a.global_mean == b.global_mean and a.event == b.event)


def largest_partition(ratings: Ratings, n_partitions: int) -> int:
    """Ratings of the largest user partition (by the driver's public hash)."""
    labels = partition_labels(ratings.user_ids, n_partitions)
    return int(np.bincount(labels, weights=ratings.user_counts(), minlength=n_partitions).max())


# ---------------------------------------------------------------------------- rows
def dataset_name(n_users: int, n_items: int, n_ratings: int) -> str:
    def short(n: int) -> str:
        return f"{n / 1e6:g}M" if n >= 10**6 else f"{n / 1e3:g}K"

    return f"production-synthetic-{short(n_users)}x{short(n_items)}x{short(n_ratings)}-r{RANK}"


def _row(dataset: str, algorithm: str, metric: str, value: float, baseline: float | None = None) -> dict:
    seconds = value if metric.startswith("seconds") else None
    return make_row(SUITE, dataset, algorithm, metric, value, baseline=baseline, seconds=seconds)


def common_rows(dataset: str, name: str, run: Measured, reference: Measured) -> list[dict]:
    """The rows every run has: time, the driver's item step and memory, equality with the reference."""
    return [
        _row(dataset, name, "seconds_per_step", run.step_s, reference.step_s),
        _row(dataset, name, "seconds_preprocessing_and_first_step", run.first_s, reference.first_s),
        _row(dataset, name, "seconds_driver_item_step", run.item_steps[-1], reference.item_steps[-1]),
        _row(dataset, name, "peak_rss_mib_driver", run.driver_peak_mib, reference.driver_peak_mib),
        _row(dataset, name, "equal_to_in_process", float(same_model(run.model, reference.model))),
    ]


def cluster_rows(dataset: str, name: str, run: Measured, reference: Measured, n_ratings: int, held: int) -> list[dict]:
    """A cluster run's own rows: workers' memory and compute, bytes and tasks per step."""
    target = 1.2 * reference.driver_peak_mib / n_ratings * held + 1024.0
    rows = [_row(dataset, name, f"peak_rss_mib_worker{i}", peak) for i, peak in enumerate(run.worker_peak_mib)]
    rows += [
        _row(dataset, name, "rss_mib_worker_idle", max(run.worker_idle_mib)),
        _row(dataset, name, "ratings_largest_partition", float(held)),
        _row(dataset, name, "worker_peak_over_target", max(run.worker_peak_mib) / target),
        _row(dataset, name, "seconds_worker_tasks", sum(run.compute.get(t, 0.0) for t in WORKER_TASKS)),
        _row(dataset, name, "seconds_worker_user_solves", run.compute.get("_users_task", 0.0)),
        _row(dataset, name, "seconds_worker_item_statistics", run.compute.get("_statistics_task", 0.0)),
        _row(dataset, name, "seconds_reduce", sum(run.compute.get(t, 0.0) for t in REDUCE_TASKS)),
    ]
    driver, workers = run.per_step("driver_bytes"), run.worker_bytes
    rows += [
        _row(dataset, name, "bytes_driver_cluster_per_step", float(driver)),
        _row(dataset, name, "bytes_worker_worker_per_step", float(workers)),
        _row(dataset, name, "bytes_per_step", float(driver + workers)),
        _row(dataset, name, "tasks_per_step", float(run.per_step("tasks"))),
    ]
    return rows


def measure_size(shape: tuple[int, int, int], workers: Sequence[int],
                 cluster: Callable[[Ratings, DPALSConfig, int], Measured] = on_cluster) -> list[dict]:
    """Every run at one size: in process (all cores, one thread), then each cluster."""
    n_users, n_items, n_ratings = shape
    ratings = production_synthetic(n_users, n_items, n_ratings, seed=0).ratings
    dataset, cfg = dataset_name(*shape), config()
    reference = in_process(ratings, cfg, cores())
    rows = common_rows(dataset, "in-process", reference, reference)
    rows += common_rows(dataset, "in-process-1thread", in_process(ratings, cfg, 1), reference)
    for n in workers:
        run = cluster(ratings, cfg, n)
        name = f"dask-{n}w"
        rows += common_rows(dataset, name, run, reference)
        rows += cluster_rows(dataset, name, run, reference, ratings.nnz, largest_partition(ratings, n))
    return rows


def measure(sizes: Sequence[tuple[int, int, int]], workers: Sequence[int]) -> list[dict]:
    return [row for shape in sizes for row in measure_size(shape, workers)]


def run(quick: bool) -> list[dict]:
    try:
        import distributed  # noqa: F401 - the optional 'dask' extra
    except ImportError as exc:
        raise SuiteUnavailable("suite 'scale' needs the optional 'dask' extra: pip install .[dask]") from exc
    return measure(QUICK_SIZES, QUICK_WORKERS) if quick else measure(FULL_SIZES, FULL_WORKERS)
