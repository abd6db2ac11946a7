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
  nanny kill), no dashboard, the allocator settings the deployed workers take
  (:data:`~app.core.mf.distributed.WORKER_MALLOC_ENV`); the driver (and Dask's scheduler, which ``LocalCluster`` runs in the
  driver's process) keeps every core for its item step. After the in-process runs (and the read
  rows) the benchmark writes the data as one Parquet snapshot per cluster size
  (:mod:`app.core.data.snapshot`, partition by partition) and drops the matrix, so the driver of
  the cluster runs holds no ratings; each partition is read on a worker by its task;
* ``read-parquet-Nw`` / ``read-copy-Nw``: the partitions alone read on a fresh cluster of N workers
  (the readers' modules imported first), from the Parquet snapshot and, where ``PRIVREC_BENCH_PG_URL``
  names a PostgreSQL server (an administrator URL: a database is created there and dropped) and
  the data hold at most 10⁷ ratings, by the service's partitioned read: ``COPY`` of each user range
  in one exported snapshot (:mod:`app.db.partitions`), the database loaded through the service's
  batch ingest.

Rows (``seconds`` = the figure for time rows; the in-process run is the ``baseline`` of ratios):

* ``seconds_per_step``: wall seconds of the second step (between the two progress calls, less the
  counters' reads); ``seconds_preprocessing_and_first_step``;
* ``seconds_driver_item_step``: the item step of the second step as the driver sees it (timed by
  wrapping ``dpals._item_step``): in process its noise and solves; on a cluster the wait until the
  workers have formed, released and solved every item block and the driver has gathered V;
  ``seconds_worker_tasks`` / ``seconds_reduce``: the workers' compute time in the second step (Dask's
  task stream), the tasks summed over the partitions and item blocks (``seconds_worker_user_solves`` +
  ``seconds_worker_item_statistics`` + ``seconds_worker_item_solves``: the users' solves; the users'
  factors stacked on the items' owners and each block's Gram and linear-term statistics, with K; each
  block's noise and solves), and the exact reductions (K's, with gravity);
* ``peak_rss_mib_driver``: the driver's resident memory sampled every 5 ms over the run (the data it
  holds included; the scheduler lives in it); ``peak_rss_mib_worker{i}``: each worker process's
  kernel high-water mark (``VmHWM``, /proc; ``ru_maxrss`` elsewhere) over its life (the cluster is
  fresh per run), next to ``rss_mib_worker_idle`` (the largest worker's before the run);
  ``worker_peak_over_target``: the largest worker peak over the issue's bound 1.2 × (in-process
  peak per rating) × (ratings of the largest partition) + 1 GiB (≤ 1 meets it);
* ``bytes_driver_cluster_per_step``: what crossed between the driver and the workers in the second
  step (:attr:`DaskExecutor.moved_bytes`: the gathered V and r × r sums and the shared public inputs,
  by ``dask.sizeof``); ``bytes_worker_worker_per_step``: what the workers fetched from each other
  (Dask's incoming-transfer log: each partition's users' factors to the items' owners, the stacked
  item factors to the partitions' workers); ``bytes_per_step`` their sum; ``tasks_per_step``; on
  loopback the bytes are counted, not timed;
* ``equal_to_in_process``: 1 when the published model (factors, biases, counts, mean, trained set)
  and the ledger event are the in-process run's bit for bit, else 0;
* ``seconds_write_snapshot`` / ``bytes_snapshot``: the export of a ``dask-Nw`` run's snapshot and its
  size; ``seconds_read_partitions``: from the run's start until the last partition's read task
  ended (Dask's task stream; a fresh worker's first import of pyarrow included);
  ``bytes_driver_cluster_total``: everything the run moved between driver and cluster;
* the read rows: ``seconds_read_partitions`` (the fastest of three reads until every partition is
  loaded on its worker; nothing gathered; the baseline of COPY's is Parquet's), ``seconds_export``
  (writing the snapshot; loading the database), ``bytes_source`` (the snapshot's files; the ratings
  table and its indexes), ``bytes_to_workers`` (Parquet: the file bytes the workers read, ``rchar``;
  COPY: the stream's bytes by the protocol, 43 a rating, since a socket's receives are not in
  ``rchar``), ``peak_rss_mib_worker_max`` (``VmHWM``, restarted before each source's reads) beside
  ``rss_mib_worker_idle``, and ``ratings_read`` (every rating delivered: the data's count).

Cost: ``--quick`` about 1.5 minutes of wall time on 2 idle cores (3 under other load), a third of it
the read rows (PostgreSQL's included); the CI check (tests/integration/test_scale_bench.py) runs
10⁵ ratings only, about a minute. The full form without the read rows took 13 minutes on 2 idle
cores in session 40 (10⁷: 1.5, 3·10⁷: 3, 10⁸ with 1, 2 and 4 workers and its in-process runs: 8).
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

from app.core.data.partitioned import PartitionedRatings, read_partition
from app.core.data.ratings import Ratings
from app.core.data.synthetic import production_synthetic
from app.core.mf import dpals
from app.core.mf.distributed import DaskExecutor, distributed_fit, partition_labels, worker_environment
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
WORKER_TASKS = ("_users_task", "_item_rows_task", "_table_task", "_block_statistics_task", "_gravity_task",
                "_release_task", "_grid_sum_task", "_solve_task")
#: the item step's statistics: the users' factors to the items' owners, each block's Grams and linear terms, K
ITEM_STATISTICS_TASKS = ("_item_rows_task", "_table_task", "_block_statistics_task", "_gravity_task")
#: the item step's tasks on the workers after its statistics: each block's release and solves
ITEM_SOLVE_TASKS = ("_release_task", "_grid_sum_task", "_solve_task")
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
    read_s: float = 0.0
    write_s: float = 0.0
    snapshot_bytes: int = 0
    driver_bytes_total: int = 0

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


def user_partitions(ratings: Ratings, n_partitions: int) -> Iterator[Ratings]:
    """The users in ``n_partitions`` partitions by the driver's public hash, made one at a time
    (what an export step writes without holding more than the matrix and one partition)."""
    labels = partition_labels(ratings.user_ids, n_partitions)
    rows, cols, vals = ratings.coo()
    for label in range(n_partitions):
        members = np.flatnonzero(labels == label)
        position = np.full(ratings.n_users, -1)
        position[members] = np.arange(len(members))
        keep = position[rows] >= 0
        yield Ratings.from_indices(position[rows[keep]], cols[keep], vals[keep],
                                   user_ids=ratings.user_ids[members], item_ids=ratings.item_ids)


def export_snapshot(ratings: Ratings, n_partitions: int, directory: str) -> tuple[PartitionedRatings, float, int]:
    """``ratings`` written as a Parquet snapshot of ``n_partitions`` user partitions, partition by
    partition, and opened: (the readers, seconds to write, bytes on disk)."""
    from app.core.data.snapshot import open_snapshot, write_snapshot

    start = time.perf_counter()
    write_snapshot(directory, user_partitions(ratings, n_partitions), ratings.item_ids)
    seconds = time.perf_counter() - start
    size = sum(entry.stat().st_size for entry in os.scandir(directory))
    return open_snapshot(directory), seconds, size


@dataclass(frozen=True)
class Snapshot:
    """A Parquet snapshot of N user partitions, written before the cluster runs: its readers, the
    seconds it took to write and its bytes on disk."""

    data: PartitionedRatings
    write_s: float
    size: int


def snapshots(ratings: Ratings, workers: Sequence[int], directory: str) -> dict[int, Snapshot]:
    """One snapshot per cluster size, each in its own folder under ``directory``."""
    return {n: Snapshot(*export_snapshot(ratings, n, os.path.join(directory, f"{n}w"))) for n in workers}


def on_cluster(snapshot: Snapshot, cfg: DPALSConfig, n_workers: int) -> Measured:
    """:func:`fit_distributed` with ``n_workers`` partitions on a fresh LocalCluster of as many
    single-threaded worker processes, each partition read on a worker from ``snapshot`` (written
    before, so the driver holds no ratings); the driver keeps every core."""
    from distributed import Client, LocalCluster

    with (tempfile.TemporaryDirectory(prefix="privrec-scale-") as folder,
          worker_environment(),
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
            model = train_dpals(snapshot.data, cfg, progress=progress, fit=distributed_fit(executor))
        peaks = client.run(process_memory)
        window = (stamps[-2].left, stamps[-1].entered)
        compute = task_compute(client, *window)
        fetched = sum(client.run(received_bytes, *window).values())
        read_done = max(stop for stop in task_stops(client, "_read_task", start))
    return Measured(model, start, stamps, memory.rss_peak_mib, item_steps,
                    worker_idle_mib=[idle[w][0] for w in sorted(idle)],
                    worker_peak_mib=[peaks[w][1] for w in sorted(peaks)], compute=compute, worker_bytes=fetched,
                    read_s=read_done - start, write_s=snapshot.write_s, snapshot_bytes=snapshot.size,
                    driver_bytes_total=executor.moved_bytes)


def task_stops(client: Any, function: str, since: float) -> list[float]:
    """When each compute of ``function``'s tasks ended (epoch seconds), from ``since``."""
    return [part["stop"] for record in client.get_task_stream(start=since)
            if str(record["key"]).split("-", 1)[0] == function
            for part in record["startstops"] if part["action"] == "compute"]


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
        _row(dataset, name, "seconds_worker_item_statistics",
             sum(run.compute.get(t, 0.0) for t in ITEM_STATISTICS_TASKS)),
        _row(dataset, name, "seconds_worker_item_solves", sum(run.compute.get(t, 0.0) for t in ITEM_SOLVE_TASKS)),
        _row(dataset, name, "seconds_reduce", sum(run.compute.get(t, 0.0) for t in REDUCE_TASKS)),
        _row(dataset, name, "seconds_write_snapshot", run.write_s),
        _row(dataset, name, "bytes_snapshot", float(run.snapshot_bytes)),
        _row(dataset, name, "seconds_read_partitions", run.read_s),
        _row(dataset, name, "bytes_driver_cluster_total", float(run.driver_bytes_total)),
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
                 cluster: Callable[[Snapshot, DPALSConfig, int], Measured] = on_cluster,
                 pg_admin_url: str | None = None, reads: bool = True) -> list[dict]:
    """Every run at one size: in process (all cores, one thread); with ``reads``, the partitions
    read on fresh clusters from each source (:func:`read_rows`); then each cluster, from a snapshot
    written before the driver lets go of the matrix (as a service's export step would: the driver
    of a cluster run holds no ratings, and its peak memory says so)."""
    n_users, n_items, n_ratings = shape
    ratings = production_synthetic(n_users, n_items, n_ratings, seed=0).ratings
    dataset, cfg = dataset_name(*shape), config()
    reference = in_process(ratings, cfg, cores())
    rows = common_rows(dataset, "in-process", reference, reference)
    rows += common_rows(dataset, "in-process-1thread", in_process(ratings, cfg, 1), reference)
    read = read_rows(dataset, ratings, workers, pg_admin_url) if reads else []
    nnz, held = ratings.nnz, {n: largest_partition(ratings, n) for n in workers}
    with tempfile.TemporaryDirectory(prefix="privrec-scale-snapshots-") as folder:
        exported = snapshots(ratings, workers, folder)
        del ratings
        for n in workers:
            run = cluster(exported[n], cfg, n)
            name = f"dask-{n}w"
            rows += common_rows(dataset, name, run, reference)
            rows += cluster_rows(dataset, name, run, reference, nnz, held[n])
    return rows + read


# ---------------------------------------------------------------------------- the read: COPY against Parquet
#: the largest data set loaded into PostgreSQL (10⁸ ratings would take about 10 GB of database disk)
COPY_MAX_RATINGS = 10**7
#: an administrator URL of the PostgreSQL server that the COPY rows use (a database is created and
#: dropped there); unset: no COPY rows
PG_URL_ENV = "PRIVREC_BENCH_PG_URL"
#: rows per batch of the service's batch ingest that loads the database
LOAD_BATCH = 50_000
#: reads of each source on one cluster (the fastest is reported: the machine is shared)
READ_REPEATS = 3


def process_read_bytes() -> int:
    """Bytes the calling process has read through read(2)-like calls, files and sockets alike
    (``rchar`` of /proc/self/io; 0 where absent). Run on each worker by ``client.run``."""
    with contextlib.suppress(OSError), open("/proc/self/io") as fh:
        for line in fh:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


@dataclass
class Read:
    """Every partition read once on a fresh cluster: seconds, the workers' memory, bytes read, ratings."""

    seconds: float
    worker_idle_mib: list[float]
    worker_peak_mib: list[float]
    bytes_read: int
    ratings: int


def _nnz(part: Ratings) -> int:
    return part.nnz


def import_readers() -> None:
    """Import both readers' modules (pyarrow; SQLAlchemy and psycopg) on a worker, so that a read
    is timed without the worker's first imports (and its bytes without reading their files)."""
    import psycopg  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    import app.core.data.snapshot  # noqa: F401
    import app.db.partitions  # noqa: F401


def reset_peak_memory() -> bool:
    """Restart the calling process's ``VmHWM`` from its current size (``clear_refs`` 5, Linux ≥ 4.0);
    False where that is not possible. Run on each worker by ``client.run`` between two reads."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


@contextlib.contextmanager
def read_cluster(n_workers: int) -> Iterator[Any]:
    """A client of a fresh LocalCluster of ``n_workers`` single-threaded processes (as the training
    runs'), the readers' modules imported on every worker (:func:`import_readers`)."""
    from distributed import Client, LocalCluster

    with (tempfile.TemporaryDirectory(prefix="privrec-scale-read-") as folder,
          LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None,
                       memory_limit=0, local_directory=folder, env={"PRIVREC_THREADS": "1"}) as cluster,
          Client(cluster) as client):
        client.run(import_readers)
        yield client


def read_on_cluster(client: Any, data: PartitionedRatings, repeats: int = READ_REPEATS) -> Read:
    """Each of ``data``'s readers run as a task on ``client``'s workers (round robin, as the driver
    places them), ``repeats`` times (each read's partitions released before the next): the fewest
    seconds until every partition was loaded on its worker (nothing is gathered), each worker's peak
    (``VmHWM``, restarted before the first read) and the bytes the workers read per read (``rchar``)."""
    from distributed import wait

    if not all(client.run(reset_peak_memory).values()):
        raise RuntimeError("the workers' peak memory cannot be restarted (/proc/self/clear_refs)")
    idle = client.run(process_memory)
    names = sorted(client.nthreads())
    item_ids = client.submit(lambda ids: ids, data.item_ids, pure=False)
    wait([item_ids])
    best, read_bytes, ratings = float("inf"), 0, 0
    for _ in range(repeats):
        before = client.run(process_read_bytes)
        start = time.perf_counter()
        parts = [client.submit(read_partition, reader, item_ids, data.excluded_labels, pure=False,
                               workers=names[i % len(names)]) for i, reader in enumerate(data.readers)]
        wait(parts)
        best = min(best, time.perf_counter() - start)
        after = client.run(process_read_bytes)
        read_bytes += sum(after[w] - before[w] for w in after)
        ratings = int(sum(client.gather([client.submit(_nnz, part, pure=False) for part in parts])))
        del parts
    peaks = client.run(process_memory)
    return Read(best, [idle[w][0] for w in sorted(idle)], [peaks[w][1] for w in sorted(peaks)],
                read_bytes // repeats, ratings)


def synthetic_ids(ratings: Ratings) -> tuple[list[str], list[str]]:
    """External ids for the database: users ``u<id>``; items ``i<position>``, zero-padded so that
    their database ids (assigned in sorted order) keep the catalogue's order."""
    return [f"u{u}" for u in ratings.user_ids.tolist()], [f"i{k:08d}" for k in range(ratings.n_items)]


@contextlib.contextmanager
def postgres_with(ratings: Ratings, admin_url: str) -> Iterator[tuple[str, float, int]]:
    """A fresh migrated database holding ``ratings`` in the data set ``default``, loaded through the
    service's batch ingest (its COPY path), dropped afterwards: (its URL, seconds to load, bytes of
    the ratings table with its indexes)."""
    import uuid

    from sqlalchemy import create_engine, text

    from app.config import Settings
    from app.db.migrate import upgrade_head
    from app.db.session import dispose_engines, engine_options, get_sessionmaker, normalise_url
    from app.schemas.ingest import RatingColumns
    from app.services import budget, catalog, ingest

    admin = create_engine(normalise_url(admin_url), isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    name = f"privrec_bench_scale_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin_url.rsplit("/", 1)[0] + "/" + name
    try:
        settings = Settings(database_url=url, redis_url=None, seed_demo=False, embedded_worker=False,
                            secret_key="bench-secret-0123456789abcdef-0123456789")
        upgrade_head(url)
        maker = get_sessionmaker(url, engine_options(settings))
        users, items = synthetic_ids(ratings)
        with maker() as s:
            budget.bootstrap(s, settings)
            catalog.import_items(s, dataset="default", rows=[(item, None, []) for item in items])
            s.commit()
        rows, cols, vals = ratings.coo()
        user_of, item_of = np.asarray(users, dtype=object), np.asarray(items, dtype=object)
        start = time.perf_counter()
        for a in range(0, ratings.nnz, LOAD_BATCH):
            b = min(a + LOAD_BATCH, ratings.nnz)
            batch = RatingColumns(user_of[rows[a:b]].tolist(), item_of[cols[a:b]].tolist(), vals[a:b].tolist())
            with maker() as s:
                ingest.upsert_ratings_batch(s, dataset="default", rows=batch)
                s.commit()
        seconds = time.perf_counter() - start
        with maker() as s:
            size = int(s.execute(text("SELECT pg_total_relation_size('ratings')")).scalar_one())
            s.commit()
        yield url, seconds, size
    finally:
        dispose_engines()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def postgres_partitions(url: str, n_partitions: int) -> contextlib.AbstractContextManager[PartitionedRatings]:
    """The service's partitioned read of the data set ``default`` (DPALS's inputs): one
    :class:`~app.db.partitions.PostgresPartition` per partition in one exported snapshot, held open."""
    from sqlalchemy import select

    from app.core.algorithms import get_algorithm
    from app.db.models import Dataset
    from app.db.partitions import exported_snapshot, partitioned_inputs

    @contextlib.contextmanager
    def opened() -> Iterator[PartitionedRatings]:
        with exported_snapshot(url, None) as snapshot:
            ds = snapshot.session.scalar(select(Dataset).where(Dataset.name == "default"))
            assert ds is not None
            data, _ = partitioned_inputs(snapshot, url, ds, get_algorithm("dpals"), n_partitions, None)
            yield data

    return opened()


#: bytes of a binary COPY's stream a rating (a CopyData message: 5-byte header, 2-byte field
#: count, three 4-byte lengths and 8-byte values) and a partition (19-byte header, 2-byte trailer)
COPY_BYTES_PER_RATING = 5 + 2 + 3 * (4 + 8)
COPY_BYTES_PER_STREAM = 19 + 2


def _read_row_set(dataset: str, name: str, read: Read, load_s: float, source_bytes: int,
                  baseline: Read | None, streamed: int | None = None) -> list[dict]:
    """``bytes_to_workers``: what reached the workers from the source: the files' bytes they read
    (``rchar``) for Parquet; for COPY (a socket's receives are not in ``rchar``) the stream's bytes
    from the protocol, ``streamed``."""
    return [
        _row(dataset, name, "bytes_to_workers", float(read.bytes_read if streamed is None else streamed)),
        _row(dataset, name, "seconds_read_partitions", read.seconds, None if baseline is None else baseline.seconds),
        _row(dataset, name, "seconds_export", load_s),
        _row(dataset, name, "bytes_source", float(source_bytes)),
        _row(dataset, name, "peak_rss_mib_worker_max", max(read.worker_peak_mib)),
        _row(dataset, name, "rss_mib_worker_idle", max(read.worker_idle_mib)),
        _row(dataset, name, "ratings_read", float(read.ratings)),
    ]


def read_rows(dataset: str, ratings: Ratings, workers: Sequence[int], pg_admin_url: str | None) -> list[dict]:
    """Every partition read on a fresh cluster of each size in ``workers`` (one partition a worker),
    from each source in turn: ``read-parquet-Nw`` from a Parquet snapshot (``seconds_export``:
    writing it, partition by partition), and where ``pg_admin_url`` is given and the data hold at
    most :data:`COPY_MAX_RATINGS` ratings, ``read-copy-Nw`` by COPY in one exported PostgreSQL
    snapshot (``seconds_export``: loading the database through the service's batch ingest; the
    baseline of its read seconds is Parquet's). ``bytes_source``: the snapshot's files, or the
    ratings table and its indexes; ``bytes_to_workers``: see :func:`_read_row_set`."""
    rows: list[dict] = []
    copy = pg_admin_url is not None and ratings.nnz <= COPY_MAX_RATINGS
    with contextlib.ExitStack() as stack:
        if copy:
            assert pg_admin_url is not None
            url, load_s, table_bytes = stack.enter_context(postgres_with(ratings, pg_admin_url))
        for n in workers:
            with read_cluster(n) as client:
                with tempfile.TemporaryDirectory(prefix="privrec-scale-parquet-") as folder:
                    data, write_s, size = export_snapshot(ratings, n, os.path.join(folder, "snapshot"))
                    parquet = read_on_cluster(client, data)
                rows += _read_row_set(dataset, f"read-parquet-{n}w", parquet, write_s, size, None)
                if copy:
                    with postgres_partitions(url, n) as data:
                        read = read_on_cluster(client, data)
                    streamed = COPY_BYTES_PER_RATING * ratings.nnz + COPY_BYTES_PER_STREAM * n
                    rows += _read_row_set(dataset, f"read-copy-{n}w", read, load_s, table_bytes, parquet, streamed)
    return rows


def measure_reads(sizes: Sequence[tuple[int, int, int]], workers: Sequence[int], pg_admin_url: str | None) -> list[dict]:
    """The read rows alone (no training) at each size."""
    return [row for shape in sizes
            for row in read_rows(dataset_name(*shape), production_synthetic(*shape, seed=0).ratings, workers,
                                 pg_admin_url)]


def measure(sizes: Sequence[tuple[int, int, int]], workers: Sequence[int], pg_admin_url: str | None = None,
            reads: bool = True) -> list[dict]:
    return [row for shape in sizes for row in measure_size(shape, workers, pg_admin_url=pg_admin_url, reads=reads)]


def run(quick: bool) -> list[dict]:
    try:
        import distributed  # noqa: F401 - the optional 'dask' extra
        import pyarrow  # noqa: F401
    except ImportError as exc:
        raise SuiteUnavailable("suite 'scale' needs the optional 'dask' extra: pip install .[dask]") from exc
    pg_admin_url = os.environ.get(PG_URL_ENV) or None
    return (measure(QUICK_SIZES, QUICK_WORKERS, pg_admin_url) if quick
            else measure(FULL_SIZES, FULL_WORKERS, pg_admin_url))
