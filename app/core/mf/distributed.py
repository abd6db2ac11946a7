"""DPALS and DP-CMF over user partitions on a cluster (issue 28): the same releases, the same model.

The driver (:func:`fit_distributed`) runs where the run is charged (the Celery worker): it has each
user partition read on a cluster worker (a :class:`~app.core.data.partitioned.PartitionedRatings`:
one reader task each, the driver never holding the matrix) or cuts a matrix it holds and places the
parts, through an :class:`Executor` (a Dask client, :class:`DaskExecutor`; or :class:`InProcess`,
the same driver in one process), maps the per-partition statistics of :mod:`app.core.mf.dpals`
(the partition-invariant seam, docs/algorithms.md §7) over them, reduces them exactly (a tree of
sums on a cluster; the item step's statistics block by block of items, a few blocks ahead of the
driver, Grams as packed upper triangles) and draws every release **once, on the driver**, where the
statistic is complete: the count histogram that sets k, the item counts, the (user-level) mean, the
item-bias sums, the re-counts, and per step K̃, {Ã_j} and {b̃_j}. The item solves and everything public
run on the driver too.

Tasks are pure: each is a function of its partition, public released values, the config without
its seed, and the sampling keys (:meth:`KeyedRandomness.sampling_keys`, from which no noise can be
derived: the seed never leaves the driver, and tasks draw no noise). A task that the cluster recomputes (a
lost worker, a retry) returns the same bits and releases nothing; only the driver's releaser adds to
the run's record, which is checked against the reserved event exactly as in process. What stays on
the workers: each partition's ratings, its sample, its bounded plans and its users' factors (never
gathered); what reaches the driver: exact statistics of the size of the catalogue (counted by
:attr:`DaskExecutor.moved_bytes`).

Dask is an optional extra (``pip install .[dask]``): nothing here imports it; :class:`DaskExecutor`
only calls the client it is handed.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from app.core.arrays import HeldBytes
from app.core.data.partitioned import PartitionedRatings, PartitionReader, read_partition
from app.core.data.ratings import Ratings
from app.core.mf import dpals
from app.core.mf.als import QuantisedFactors, SolvePlan, quantised_factors
from app.core.mf.dpals import (
    BoundedData,
    DPALSConfig,
    DPALSFit,
    FitFunction,
    ItemSource,
    Preprocessed,
    Progress,
    PublicState,
    PublicTermsHook,
)
from app.core.privacy.keyed import KeyedRandomness, SamplingKeys, user_hashes
from app.core.privacy.releaser import GaussianReleaser
from app.core.privacy.sampling import per_user_sample

__all__ = [
    "Executor",
    "InProcess",
    "DaskExecutor",
    "partition_labels",
    "split_users",
    "fit_distributed",
    "distributed_fit",
    "ITEM_BLOCK",
    "REDUCE_FAN_IN",
]

#: trained items per block of the driver's item step (the noise is keyed per item: any block size
#: releases the same bits)
ITEM_BLOCK = 1024
#: partial statistics summed per task of the cluster's reduction tree
REDUCE_FAN_IN = 4
#: item blocks whose statistics the cluster forms ahead of the one the driver's item step is at: what
#: a worker holds of them is a few blocks' partials, not the whole catalogue's
BLOCKS_AHEAD = 4
#: times Dask re-runs a partition's read that raised (a dropped connection, a worker's transient error): the
#: reader imports the run's exported snapshot again, so a retry reads the same rows and releases nothing
READ_RETRIES = 2


class Executor(Protocol):
    """Where the partitions live and the per-partition tasks run. Handles are opaque (values in
    process, futures on a cluster); tasks take handles or plain values as arguments."""

    def place(self, values: Sequence[Any]) -> list[Any]:
        """One handle per value, the values spread over the workers (recomputable where a worker
        is lost)."""

    def share(self, value: Any) -> Any:
        """One handle to a value every task may read (sent once per worker, not per task)."""

    def spread(self, fn: Callable[..., Any], *columns: Sequence[Any]) -> list[Any]:
        """``fn`` over the columns' rows as :meth:`map`, the tasks spread round robin over the
        workers (any other worker may recompute one): where each partition is read."""

    def map(self, fn: Callable[..., Any], *columns: Sequence[Any]) -> list[Any]:
        """``fn`` over the columns' rows (a pure task each); the results stay where they ran."""

    def reduce(self, handles: Sequence[Any]) -> Any:
        """One handle to the exact sum (:func:`dpals.reduce_exact`) of the handles' values (any
        grouping of the sums: they are exact)."""

    def gather(self, handles: Sequence[Any]) -> list[Any]:
        """The handles' values, on the driver."""


class InProcess:
    """The driver's tasks in this process, one after the other (tests; a cluster of one)."""

    def place(self, values: Sequence[Any]) -> list[Any]:
        return list(values)

    def share(self, value: Any) -> Any:
        return value

    def spread(self, fn: Callable[..., Any], *columns: Sequence[Any]) -> list[Any]:
        return self.map(fn, *columns)

    def map(self, fn: Callable[..., Any], *columns: Sequence[Any]) -> list[Any]:
        return [fn(*args) for args in zip(*columns, strict=True)]

    def reduce(self, handles: Sequence[Any]) -> Any:
        return dpals.reduce_exact(handles)

    def gather(self, handles: Sequence[Any]) -> list[Any]:
        return list(handles)


class DaskExecutor:
    """The tasks on a ``distributed.Client``'s workers. Every key is random (``pure=False``): no
    key is derived from an argument, so no id or key material appears in a key, the scheduler's
    task list or the dashboard. Partitions and shared values are tasks' results (recomputable);
    what they hold (ratings, the sampling keys) crosses the network as data, under the cluster's
    TLS; the seed never does.

    A partition's tasks follow it: each task runs on the worker its first argument's partition was
    spread to (:attr:`homes`), and the containers they pass report the bytes they hold to
    ``dask.sizeof`` (:class:`~app.core.arrays.HeldBytes`), so neither the scheduler nor its work
    stealing moves a partition's data to another worker to save a queue's wait.

    ``moved_bytes`` counts what crossed between the driver and the cluster (partitions, shared
    values and gathered statistics, by ``dask.sizeof``); ``tasks`` the tasks submitted. A result
    not back within ``timeout_s`` (a cluster left without workers waits for ever) raises
    ``TimeoutError``: the run fails closed instead of hanging. A partition's read that raises is
    re-run up to ``read_retries`` times (:data:`READ_RETRIES`); the other tasks are pure functions of
    their inputs, which Dask recomputes itself where a worker is lost."""

    def __init__(self, client: Any, timeout_s: float | None = None, fan_in: int = REDUCE_FAN_IN,
                 read_retries: int = READ_RETRIES) -> None:
        if fan_in < 2:
            raise ValueError("a reduction sums at least two partials a task")
        if read_retries < 0:
            raise ValueError("read_retries must be >= 0")
        self.client = client
        self.timeout_s = timeout_s
        self.fan_in = fan_in
        self.read_retries = read_retries
        self.moved_bytes = 0
        self.tasks = 0
        #: the worker each partition was spread to, by task key, and the tasks that follow it there
        self.homes: dict[Any, str] = {}

    def _count(self, values: Any) -> None:
        from dask.sizeof import sizeof  # the optional extra: imported only where a client exists

        self.moved_bytes += int(sizeof(values))

    def place(self, values: Sequence[Any]) -> list[Any]:
        """Each value as the result of a task on a worker (round robin; any other worker may
        recompute it): a worker lost mid-run loses nothing Dask cannot recompute from lineage,
        unlike scattered data, whose loss would leave its dependents waiting."""
        values = list(values)
        self._count(values)
        return self.spread(_hold, values)

    def share(self, value: Any) -> Any:
        """A task's result too (not a broadcast scatter: a scatter that names a lost worker waits
        for it; a task's result is recomputed)."""
        self._count(value)
        self.tasks += 1
        return self.client.submit(_hold, value, pure=False)

    def spread(self, fn: Callable[..., Any], *columns: Sequence[Any]) -> list[Any]:
        workers = sorted(self.client.nthreads()) or [None]
        rows = list(zip(*columns, strict=True))
        self.tasks += len(rows)
        handles = [self.client.submit(fn, *args, pure=False, workers=workers[i % len(workers)],
                                      allow_other_workers=True, retries=self.read_retries)
                   for i, args in enumerate(rows)]
        self.homes.update((handle.key, workers[i % len(workers)]) for i, handle in enumerate(handles))
        return handles

    def map(self, fn: Callable[..., Any], *columns: Sequence[Any]) -> list[Any]:
        """Each task on its first argument's home (the worker its partition was spread to), loosely: a
        partition's tasks run where its data is, and any worker may run one whose home is lost."""
        rows = list(zip(*columns, strict=True))
        self.tasks += len(rows)
        handles = []
        for args in rows:
            home = self.homes.get(getattr(args[0], "key", None)) if args else None
            handle = self.client.submit(fn, *args, pure=False, workers=home, allow_other_workers=home is not None)
            if home is not None:
                self.homes[handle.key] = home
            handles.append(handle)
        return handles

    def reduce(self, handles: Sequence[Any]) -> Any:
        """A tree of sums, ``fan_in`` partials a task (exact: any grouping gives the same bits), so
        no worker holds more than ``fan_in`` partials and their sum, and the depth grows as log N."""
        level = list(handles)
        if not level:
            raise ValueError("nothing to reduce")
        while True:
            level = [self.client.submit(dpals.reduce_exact, level[i:i + self.fan_in], pure=False)
                     for i in range(0, len(level), self.fan_in)]
            self.tasks += len(level)
            if len(level) == 1:
                return level[0]

    def gather(self, handles: Sequence[Any]) -> list[Any]:
        values = [handle.result(timeout=self.timeout_s) for handle in handles]
        self._count(values)
        return values


def _hold(value: Any) -> Any:
    """A partition as a task's result (:meth:`DaskExecutor.place`)."""
    return value


# ---------------------------------------------------------------------------- partitions
def partition_labels(user_ids: np.ndarray, n_partitions: int) -> np.ndarray:
    """Each user's partition: her id's public hash modulo ``n_partitions`` (no secret involved;
    any partitioning publishes the same model)."""
    if n_partitions < 1:
        raise ValueError("n_partitions must be >= 1")
    return np.asarray(user_hashes(np.asarray(user_ids)) % np.uint64(n_partitions), dtype=np.int64)


def split_users(ratings: Ratings, labels: np.ndarray) -> list[Ratings]:
    """The users split by ``labels`` (one per user, 0..n−1): each part a :class:`Ratings` of its
    users (in their order), over the whole catalogue; a label without users gives an empty part."""
    rows, cols, vals = ratings.coo()
    parts = []
    for label in range(int(labels.max()) + 1 if len(labels) else 1):
        members = np.flatnonzero(labels == label)
        position = np.full(ratings.n_users, -1)
        position[members] = np.arange(len(members))
        keep = position[rows] >= 0
        parts.append(Ratings.from_indices(position[rows[keep]], cols[keep], vals[keep],
                                          user_ids=ratings.user_ids[members], item_ids=ratings.item_ids))
    return parts


# ---------------------------------------------------------------------------- tasks (pure, module level)
def _read_task(reader: PartitionReader, item_ids: np.ndarray, excluded: frozenset[str], config: DPALSConfig) -> Ratings:
    """A partition read where it lives, checked as :func:`dpals.fit_dpals` checks the whole matrix
    (ranking: its positives)."""
    part = read_partition(reader, item_ids, excluded)
    dpals._validate_for_training(part, config)
    return dpals.positives(part, config.threshold) if config.objective == "ranking" else part


def _bound_task(part: Ratings, config: DPALSConfig) -> np.ndarray:
    return dpals.bound_statistic(part.user_counts(), config)


def _sample_task(part: Ratings, keys: SamplingKeys, config: DPALSConfig) -> np.ndarray:
    return per_user_sample(part, config.contribution_bound, dpals.rating_keys(part, keys, 0))


def _sampled_task(part: Ratings, sample: np.ndarray, config: DPALSConfig) -> tuple[np.ndarray, float, float]:
    """(item counts, mean sum, mean count) of the partition: the sample's, or the user-level mean's."""
    counts = dpals.count_statistic(part.csr.indices[sample], None, part.n_items)
    if config.mean_mode == "dp_user":
        return counts, *dpals.user_mean_statistics(part, config.midpoint, config.half_range)
    return counts, *dpals.mean_statistics(part.csr.data[sample], config.midpoint, config.half_range)


def _bias_task(part: Ratings, sample: np.ndarray, mean: float, config: DPALSConfig) -> np.ndarray:
    return dpals.item_bias_statistic(part, sample, mean, config)


def _bounded_task(part: Ratings, public: PublicState, keys: SamplingKeys, config: DPALSConfig) -> BoundedData:
    return dpals.bound_contributions(part, config, public, keys)


def _recount_task(bounded: BoundedData) -> np.ndarray:
    return bounded.recount_statistic


@dataclass(frozen=True)
class _Users(HeldBytes):
    """A partition's user step: the clipped U with a trailing zero row, the next warm start, and U
    as the item statistics read it (quantised once a step, whatever the number of item blocks)."""

    padded: np.ndarray
    start: np.ndarray | None
    factors: QuantisedFactors


def _users_task(bounded: BoundedData, previous: _Users | None, public: dict[str, Any], item_factors: np.ndarray,
                config: DPALSConfig, last: bool) -> _Users:
    """The partition's users' solves (as :func:`dpals.fit_dpals`'s, value for value), clipped."""
    prep = Preprocessed(**public, user_plan=bounded.user_plan, item_plan=bounded.item_plan)
    padded = np.zeros((bounded.user_plan.n_rows + 1, config.rank))
    start = None if previous is None else previous.start
    solved = dpals._user_step(prep, item_factors, config, dpals.user_regularisation(config), start, out=padded[:-1])
    start = solved.astype(np.float32) if config.user_cg_steps and not last else None
    dpals._clip_rows_in_place(solved, config.clip_user)
    return _Users(padded, start, dpals.plan_factors(bounded.item_plan, padded, config))


def _block_statistics_task(bounded: BoundedData, users: _Users, config: DPALSConfig,
                           items: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The partition's exact item-step statistics of the trained items lo..hi-1: (packed Gram
    upper triangles, linear terms). A block's partials, not the whole catalogue's, are what a
    worker forms and the reduction holds at once."""
    return dpals.item_statistics(bounded.item_plan, users.padded, config, items=items, factors=users.factors)


def _gravity_task(users: _Users, config: DPALSConfig) -> np.ndarray:
    """The partition's exact K = Σ x xᵀ over its users (the gravity release's statistic)."""
    return dpals.gravity_statistic(quantised_factors(users.padded, config.clip_user, weighted=False))


# ---------------------------------------------------------------------------- the driver
def _reduced(executor: Executor, handles: Sequence[Any]) -> Any:
    """The exact sum of the partitions' statistics, reduced on the cluster, on the driver."""
    return executor.gather([executor.reduce(handles)])[0]


def _item_blocks(n_items: int, block: int) -> list[np.ndarray]:
    return np.array_split(np.arange(n_items), max(1, math.ceil(n_items / block)))


class _BlockStatistics:
    """The item step's :class:`ItemSource` over the cluster: each item block's statistics mapped
    over the partitions and reduced exactly, submitted at most ``window`` blocks ahead of the
    block the item step asks for, and gathered (Grams unpacked) when it does. The item step may
    ask from several threads and in any order."""

    def __init__(self, executor: Executor, bounded: list[Any], users: list[Any], configs: list[Any],
                 blocks: list[np.ndarray], rank: int, gravity: np.ndarray, window: int) -> None:
        self.executor, self.bounded, self.users, self.configs = executor, bounded, users, configs
        self.blocks, self.rank, self.gravity, self.window = blocks, rank, gravity, window
        self.index = {int(block[0]): k for k, block in enumerate(blocks) if len(block)}
        self.pending: dict[int, Any] = {}
        self.submitted = 0
        self.lock = threading.Lock()

    def _submit(self, k: int) -> None:
        lo, hi = int(self.blocks[k][0]), int(self.blocks[k][-1]) + 1
        n = len(self.bounded)
        partials = self.executor.map(_block_statistics_task, self.bounded, self.users, self.configs, [(lo, hi)] * n)
        self.pending[k] = self.executor.reduce(partials)

    def statistics(self, items: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k = self.index[int(items[0])]
        with self.lock:
            while self.submitted < min(len(self.blocks), k + 1 + self.window):
                self._submit(self.submitted)
                self.submitted += 1
            handle = self.pending.pop(k)
        packed, rhs = self.executor.gather([handle])[0]
        return items, dpals.unpack_upper(packed, self.rank), rhs

    def source(self) -> ItemSource:
        return ItemSource(chunks=list(self.blocks), statistics=self.statistics, gravity=lambda: self.gravity)


def _partitions(ratings: Ratings | PartitionedRatings, config: DPALSConfig, executor: Executor, requested: Any,
                n_partitions: int, labels: np.ndarray | None) -> list[Any]:
    """Handles to the training partitions: read on the workers (a :class:`PartitionedRatings`, one
    task per reader) or cut here and placed (a :class:`Ratings`, by ``labels`` or the ids' hash)."""
    if isinstance(ratings, PartitionedRatings):
        n = ratings.n_partitions
        item_ids, excluded = executor.share(ratings.item_ids), executor.share(ratings.excluded_labels)
        return executor.spread(_read_task, ratings.readers, [item_ids] * n, [excluded] * n, [requested] * n)
    dpals._validate_for_training(ratings, config)
    if config.objective == "ranking":
        ratings = dpals.positives(ratings, config.threshold)
    return executor.place(split_users(ratings, partition_labels(ratings.user_ids, n_partitions)
                                      if labels is None else np.asarray(labels)))


_EMPTY_PLAN = SolvePlan(n_rows=0, n_cols=0, counts=np.zeros(0, dtype=np.int64), buckets=())


def fit_distributed(
    ratings: Ratings | PartitionedRatings,
    config: DPALSConfig,
    executor: Executor,
    *,
    n_partitions: int = 2,
    labels: np.ndarray | None = None,
    item_block: int = ITEM_BLOCK,
    progress: Progress | None = None,
    public_terms: PublicTermsHook | None = None,
) -> DPALSFit:
    """:func:`dpals.fit_dpals` with the users in partitions on ``executor``: the same releases in
    the same order, the same fit (bit for bit on one hardware/BLAS build), the same event.

    ``ratings`` is either read on the workers, one task per partition (a :class:`PartitionedRatings`:
    the driver never holds the matrix; ``labels`` and ``n_partitions`` are then unused), or cut here:
    ``labels`` (one per user) or ``n_partitions`` (by :func:`partition_labels`) cut the users;
    ``item_block`` sizes the driver's item blocks. ``progress`` and ``public_terms`` as in
    :func:`dpals.fit_dpals`. The fit's ``prep`` carries the public pre-processing and empty plans
    (the private plans never leave the workers)."""
    keyed = KeyedRandomness(config.seed)
    releaser = GaussianReleaser(None, keyed)
    # the tasks' config carries no seed, only the sampling keys travel: the noise stays on the driver
    requested = executor.share(replace(config, seed=0))
    parts = _partitions(ratings, config, executor, requested, n_partitions, labels)
    del ratings
    n = len(parts)
    reserved = config
    config = dpals.release_contribution_bound(_reduced(executor, executor.map(_bound_task, parts, [requested] * n)),
                                              config, releaser)
    configs = [executor.share(replace(config, seed=0))] * n  # k as released: what every later task reads
    keys = [executor.share(keyed.sampling_keys())] * n
    samples = executor.map(_sample_task, parts, keys, configs)

    def bias_statistic(mean: float, parts: list[Any] = parts, samples: list[Any] = samples) -> np.ndarray:
        return np.asarray(_reduced(executor, executor.map(_bias_task, parts, samples, [mean] * n, configs)))

    public = dpals.release_public_state(_reduced(executor, executor.map(_sampled_task, parts, samples, configs)),
                                        bias_statistic, config, releaser)
    del samples
    bounded = executor.map(_bounded_task, parts, [executor.share(public)] * n, keys, configs)
    del parts  # the bounded plans hold what the steps need
    recounts = dpals.release_recounts(_reduced(executor, executor.map(_recount_task, bounded)), config, releaser)
    prep_public: dict[str, Any] = dict(global_mean=public.global_mean, item_counts=public.item_counts, frequent=public.frequent,
                       recounts=recounts, item_biases=public.item_biases)
    shared_public = executor.share(prep_public)
    item_factors = keyed.init_generator().normal(0.0, config.init_scale, size=(len(public.frequent), config.rank))
    blocks = _item_blocks(len(public.frequent), item_block)
    users: list[Any] = [None] * n
    last_releases: deque[np.ndarray] = deque(maxlen=config.average_last)
    for step in range(config.n_steps):
        users = executor.map(_users_task, bounded, users, [shared_public] * n, [executor.share(item_factors)] * n,
                             configs, [step + 1 == config.n_steps] * n)
        gravity = (_reduced(executor, executor.map(_gravity_task, users, configs)) if config.reg_gravity > 0
                   else np.zeros((config.rank, config.rank)))
        cluster = _BlockStatistics(executor, bounded, users, configs, blocks, config.rank, gravity, BLOCKS_AHEAD)
        terms = None if public_terms is None else public_terms(public, item_factors)
        item_factors = dpals._item_step(public.frequent, recounts, cluster.source(), config, releaser, terms)
        del cluster
        last_releases.append(item_factors)
        if progress:
            progress((step + 1) / config.n_steps, f"step {step + 1}/{config.n_steps}")
    event = dpals.checked_event(releaser, reserved, config)
    prep = Preprocessed(**prep_public, user_plan=_EMPTY_PLAN, item_plan=_EMPTY_PLAN)
    return DPALSFit(prep=prep, item_factors=dpals.average_releases(list(last_releases)),
                    user_reg=dpals.user_regularisation(config), event=event, releaser=releaser, config=config)


def distributed_fit(executor: Executor, *, n_partitions: int = 2, labels: np.ndarray | None = None,
                    item_block: int = ITEM_BLOCK) -> FitFunction:
    """:func:`fit_distributed` on ``executor`` as a :class:`dpals.FitFunction`: what ``train_dpals``
    and ``train_dpcmf`` (``fit=``) and so the DPALS and DP-CMF algorithms' ``train`` take to run
    their private part on a cluster; they then publish what they publish in process."""

    def fit(ratings: Ratings | PartitionedRatings, config: DPALSConfig, *, progress: Progress | None = None,
            public_terms: PublicTermsHook | None = None) -> DPALSFit:
        return fit_distributed(ratings, config, executor, n_partitions=n_partitions, labels=labels,
                               item_block=item_block, progress=progress, public_terms=public_terms)

    return fit
