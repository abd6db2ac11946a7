"""DPALS and DP-CMF over user partitions on a cluster (issue 28): the same releases, the same model.

The driver (:func:`fit_distributed`) runs where the run is charged (the Celery worker): it has each
user partition read on a cluster worker (a :class:`~app.core.data.partitioned.PartitionedRatings`:
one reader task each, the driver never holding the matrix) or cuts a matrix it holds and places the
parts, through an :class:`Executor` (a Dask client, :class:`DaskExecutor`; or :class:`InProcess`,
the same driver in one process), maps the per-partition statistics of :mod:`app.core.mf.dpals`
(the partition-invariant seam, docs/algorithms.md §7) over them and reduces them exactly (a tree of
sums on a cluster). Each release is drawn **once, where its statistic is complete**: on the driver,
the count histogram that sets k, the item counts, the (user-level) mean, the item-bias sums, the
re-counts and per step K̃; on the cluster, per step and block of trained items, {Ã_j} and {b̃_j},
on the block's *owner*: the worker that holds every user's bounded ratings of the block's items
(sent by the partitions once a run) and, each step, every user's factors, so it forms the block's
statistics complete, releases them and solves the block's items (:class:`_ClusterItemStep`, a few
blocks ahead of the driver). The driver records every release and gathers V.

Tasks are pure: each is a function of its partition, public released values, the config without
its seed, the sampling keys (:meth:`KeyedRandomness.sampling_keys`) and, for a block's release, the
step's two noise keys (:class:`~app.core.mf.dpals.ItemReleases`: item j's noise is its key's stream j,
so a block drawn anywhere gives the same numbers). No key yields the seed or another release's
noise, and the seed never leaves the driver. A task that the cluster recomputes (a lost worker, a
retry) returns the same bits and releases nothing new; only the driver's releaser adds to the run's
record, which is checked against the reserved event exactly as in process. What stays on the
workers: each partition's ratings, its sample, its user plan and its solves (never gathered, and
never moved to another worker: :attr:`DaskExecutor.homes`), the owners' item plans, the users'
factors they receive and the blocks' statistics; what reaches the driver: catalogue-sized vectors,
r × r sums, the partitions' user counts and V (counted by :attr:`DaskExecutor.moved_bytes`).

Dask is an optional extra (``pip install .[dask]``): nothing here imports it; :class:`DaskExecutor`
only calls the client it is handed.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
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
    ItemEntries,
    ItemReleases,
    ItemSource,
    Preprocessed,
    Progress,
    PublicItemTerms,
    PublicState,
    PublicTermsHook,
    _ReleasedChunk,
)
from app.core.mf.linalg import quantise_table
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
    "SHARE_BYTES",
    "WORKER_MALLOC_ENV",
    "worker_environment",
]

#: trained items per block of the item step (the noise is keyed per item: any block size releases the
#: same bits)
ITEM_BLOCK = 1024
#: partial statistics summed per task of the cluster's reduction tree
REDUCE_FAN_IN = 4
#: item blocks the cluster forms, releases and solves ahead of the one the driver gathers (at least
#: two an owner): what a worker holds of them is a few blocks' statistics, not the whole catalogue's
BLOCKS_AHEAD = 4
#: the most bytes one :meth:`Executor.share` sends of the initial item factors (the rows go in chunks
#: and are stacked on the cluster: each chunk is a task's input, carried by the scheduler, below
#: Dask's large-graph warning at 10 MB); later steps' factors never leave the cluster to be shared
SHARE_BYTES = 8 * 2**20
#: the allocator settings a cluster's worker processes start with (glibc reads them at start-up: put
#: them in a worker's environment, or start a ``LocalCluster`` inside :func:`worker_environment`).
#: Dask's nanny default, MALLOC_TRIM_THRESHOLD_=65536, also fixes glibc's mmap threshold at 128 KiB,
#: so every numpy temporary above it (a gathered row block, a buffered ``take``) is a fresh mapping
#: faulted in page by page: the item statistics ran about 2× slower on a worker than in process.
#: With these, arrays from 4 MiB up are still mapped and returned when freed, and the heap is
#: trimmed once 16 MiB at its top are free.
WORKER_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "4194304", "MALLOC_TRIM_THRESHOLD_": "16777216"}
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

    def width(self) -> int:
        """How many workers the partitions are spread over (the item blocks' owners, one a worker)."""


class InProcess:
    """The driver's tasks in this process, one after the other (tests; a cluster of one). ``width``:
    the workers it stands for (the item blocks' owners; any number gives the same model)."""

    def __init__(self, width: int = 1) -> None:
        if width < 1:
            raise ValueError("width must be >= 1")
        self._width = width

    def width(self) -> int:
        return self._width

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
    what they hold (ratings, the sampling keys, an item step's noise keys) crosses the network as
    data, under the cluster's TLS; the seed never does.

    A partition's tasks follow it: each task is placed on the worker its first argument's partition
    was spread to (:attr:`homes`), and the containers they pass report the bytes they hold to
    ``dask.sizeof`` (:class:`~app.core.arrays.HeldBytes`). Dask's work stealing weighs those bytes
    against a task's compute, so it leaves a partition of any size that matters where it is (a
    small one's task it may still move to an idle worker, copying that small partition).

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
        return [self._submit_at_home(fn, *args, home_of=args[0] if args else None) for args in rows]

    def reduce(self, handles: Sequence[Any]) -> Any:
        """A tree of sums, ``fan_in`` partials a task (exact: any grouping gives the same bits), so
        no worker holds more than ``fan_in`` partials and their sum, and the depth grows as log N.
        Each sum runs on its first partial's home (loosely), so the total lands on the first
        handle's: whoever orders the handles chooses where the sum, and what follows it, runs."""
        level = list(handles)
        if not level:
            raise ValueError("nothing to reduce")
        while True:
            level = [self._submit_at_home(dpals.reduce_exact, level[i:i + self.fan_in], home_of=level[i])
                     for i in range(0, len(level), self.fan_in)]
            self.tasks += len(level)
            if len(level) == 1:
                return level[0]

    def _submit_at_home(self, fn: Callable[..., Any], *args: Any, home_of: Any) -> Any:
        """``fn(*args)`` on the home of ``home_of`` (a handle), where it has one; the result's home is
        the same."""
        home = self.homes.get(getattr(home_of, "key", None))
        handle = self.client.submit(fn, *args, pure=False, workers=home, allow_other_workers=home is not None)
        if home is not None:
            self.homes[handle.key] = home
        return handle

    def gather(self, handles: Sequence[Any]) -> list[Any]:
        values = [handle.result(timeout=self.timeout_s) for handle in handles]
        self._count(values)
        return values

    def width(self) -> int:
        return max(1, len(self.client.nthreads()))


@contextlib.contextmanager
def worker_environment() -> Iterator[None]:
    """Worker processes started inside (a ``LocalCluster``'s nannies) get :data:`WORKER_MALLOC_ENV`:
    a nanny takes its pre-spawn variables from this process's environment before Dask's config, and
    writes them there when it spawns (so a cluster started earlier leaves Dask's default behind);
    both are set here and restored on exit. A deployed worker takes the variables themselves."""
    saved = {name: os.environ.get(name) for name in WORKER_MALLOC_ENV}
    os.environ.update(WORKER_MALLOC_ENV)
    try:
        import dask  # the optional extra: imported only where a cluster is started

        with dask.config.set({f"distributed.nanny.pre-spawn-environ.{name}": value
                              for name, value in WORKER_MALLOC_ENV.items()}):
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


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
    """The partition's bounded ratings: its user plan, and its item entries for the items' owners."""
    return dpals.bound_contributions(part, config, public, keys, by_item="entries")


def _recount_task(bounded: BoundedData) -> np.ndarray:
    return bounded.recount_statistic


def _n_users_task(bounded: BoundedData) -> int:
    return bounded.user_plan.n_rows


def _piece_task(bounded: BoundedData, ranges: tuple[tuple[int, int], ...], offset: int) -> ItemEntries:
    """The partition's bounded ratings of one owner's item blocks, its users numbered from
    ``offset`` (their place in the whole's order): what it sends that owner, once a run."""
    if bounded.item_entries is None:
        raise ValueError("the partition's item entries were already handed over")
    return bounded.item_entries.select(ranges, offset)


def _users_only_task(bounded: BoundedData) -> BoundedData:
    """The partition's bounded data once its item entries are with their owners: the user plan."""
    return replace(bounded, item_entries=None)


@dataclass(frozen=True)
class _Shard(HeldBytes):
    """An item owner's bounded ratings: one item plan per owned block (keyed by its first trained
    item; rows 0.. are the block's items), each over every user."""

    plans: dict[int, SolvePlan]


def _shard_task(own: ItemEntries, pieces: list[ItemEntries], ranges: tuple[tuple[int, int], ...],
                n_users: int) -> _Shard:
    """An owner's shard from every partition's bounded ratings of its blocks (``pieces``, in
    partition order, so users ascend), block by block. ``own`` (its own partition's piece, among
    ``pieces``) places the task on the owner's worker."""
    del own
    return _Shard({lo: dpals.merge_item_entries([piece.rows(lo, hi) for piece in pieces]).plan(n_users)
                   for lo, hi in ranges})


def _weighted(config: DPALSConfig) -> bool:
    """Whether the item plans carry weights (then each weighted row is quantised as it is gathered)."""
    return config.contribution_mode == "adaptive_weights"


@dataclass(frozen=True)
class _Users(HeldBytes):
    """A partition's user step: the clipped U with a trailing zero row, and the next warm start."""

    padded: np.ndarray
    start: np.ndarray | None


def _users_task(bounded: BoundedData, previous: _Users | None, public: dict[str, Any], item_factors: np.ndarray,
                config: DPALSConfig, last: bool) -> _Users:
    """The partition's users' solves (as :func:`dpals.fit_dpals`'s, value for value), clipped."""
    prep = Preprocessed(**public, user_plan=bounded.user_plan, item_plan=bounded.item_plan)
    padded = np.zeros((bounded.user_plan.n_rows + 1, config.rank))
    start = None if previous is None else previous.start
    solved = dpals._user_step(prep, item_factors, config, dpals.user_regularisation(config), start, out=padded[:-1])
    start = solved.astype(np.float32) if config.user_cg_steps and not last else None
    dpals._clip_rows_in_place(solved, config.clip_user)
    return _Users(padded, start)


def _item_rows_task(users: _Users, config: DPALSConfig) -> np.ndarray:
    """The partition's clipped user factors as the items' owners read them: quantised once (int16,
    a quarter of the bytes) for unweighted plans; as they are where each weight enters before the
    rounding. Rows are quantised independently, so the owners' stacked table is the whole's."""
    rows = users.padded[:-1]
    return rows if _weighted(config) else quantise_table(rows, config.clip_user)


def _table_task(shard: _Shard, rows: list[np.ndarray], config: DPALSConfig) -> QuantisedFactors:
    """Every user's factors on an owner (``shard`` places it), in the whole's order, a zero row last:
    what its blocks' statistics gather from, one a step."""
    del shard
    stacked = np.concatenate([*rows, np.zeros((1, config.rank), dtype=rows[0].dtype)])
    if _weighted(config):
        return QuantisedFactors(stacked, config.clip_user, None)
    return QuantisedFactors(None, config.clip_user, stacked)


def _block_statistics_task(shard: _Shard, table: QuantisedFactors, config: DPALSConfig,
                           lo: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact item-step statistics of the block of trained items from ``lo`` on their owner,
    complete (the shard holds every user's bounded ratings of them): (Grams, upper triangles set;
    linear terms)."""
    return dpals.item_statistics(shard.plans[lo], None, config, factors=table)


def _gravity_task(users: _Users, config: DPALSConfig) -> np.ndarray:
    """The partition's exact K = Σ x xᵀ over its users (the gravity release's statistic)."""
    return dpals.gravity_statistic(quantised_factors(users.padded, config.clip_user, weighted=False))


# ---------------------------------------------------------------------------- the driver
def _reduced(executor: Executor, handles: Sequence[Any]) -> Any:
    """The exact sum of the partitions' statistics, reduced on the cluster, on the driver."""
    return executor.gather([executor.reduce(handles)])[0]


def _stack_task(rows: list[np.ndarray]) -> np.ndarray:
    """Consecutive row blocks as one array: the item factors every user solve of a step reads."""
    return np.concatenate(rows)


def _shared_rows(executor: Executor, values: np.ndarray) -> Any:
    """A handle to ``values`` on the cluster, sent in chunks of at most :data:`SHARE_BYTES`."""
    per_chunk = max(1, SHARE_BYTES // max(1, values.itemsize * int(np.prod(values.shape[1:]))))
    chunks = [executor.share(values[start : start + per_chunk]) for start in range(0, len(values), per_chunk)]
    return executor.map(_stack_task, [chunks or [executor.share(values)]])[0]


def _item_blocks(n_items: int, block: int) -> list[np.ndarray]:
    return np.array_split(np.arange(n_items), max(1, math.ceil(n_items / block)))


def _no_statistics(chunk: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    raise AssertionError("the cluster's item step solves its blocks itself")  # ItemSource.solve is set


def _release_task(statistic: tuple[np.ndarray, np.ndarray], items: np.ndarray, step: ItemReleases) -> _ReleasedChunk:
    """A block's complete statistics released where they were formed: Ã_j and
    b̃_j of its trained items, each item's noise from its keyed stream (a recomputed task draws the
    same numbers, so a retry releases nothing new)."""
    return step.release(items, *statistic)


def _grid_sum_task(released: _ReleasedChunk, step: ItemReleases) -> np.ndarray:
    return step.grid_sum(released)


def _solve_task(released: _ReleasedChunk, step: ItemReleases, public: PublicItemTerms | None,
                pool: tuple[np.ndarray, float] | None) -> np.ndarray:
    """The block's item factors from its released systems (post-processing)."""
    return step.solve(released, public, pool)


class _ClusterItemStep:
    """The item step on the cluster (:attr:`ItemSource.solve`). The trained items are dealt out to
    owners by block (block k to owner k mod the owners, one owner a worker), and each owner holds
    every user's bounded ratings of its blocks (its shard, sent once a run) and, each step, every
    user's factors (its table). So a block's statistics are formed complete on its owner, once an
    item, released there and solved there; only the users' factors travel, not partial statistics.
    The driver gathers the blocks' factor rows, at most ``window`` blocks behind the last one
    submitted. With pooling every block is released first and its grid sum gathered (Ā needs them
    all), the released blocks staying on the workers, then solved. The driver draws no item noise and
    holds no r × r statistic; what crosses to it is V and, with pooling, one r × r integer sum a block."""

    def __init__(self, executor: Executor, shards: list[Any], tables: list[Any], config: Any,
                 blocks: list[np.ndarray], rank: int, window: int) -> None:
        self.executor, self.shards, self.tables, self.config = executor, shards, tables, config
        self.blocks, self.rank, self.window = blocks, rank, window
        self.solved: list[Any] = []  # each block's factor rows on the cluster, in block order

    def factors(self) -> Any:
        """A handle to the step's item factors stacked on the cluster from its solved blocks (the
        blocks are consecutive and in order): what the next step's user solves read, without V
        going back through the driver."""
        return self.executor.map(_stack_task, [self.solved])[0]

    def _released(self, k: int, step: Any) -> Any:
        block, owner = self.blocks[k], k % len(self.shards)
        statistic = self.executor.map(_block_statistics_task, [self.shards[owner]], [self.tables[owner]],
                                      [self.config], [int(block[0])])[0]
        return self.executor.map(_release_task, [statistic], [block], [step])[0]

    def _pipelined(self, submit: Callable[[int], Any], take: Callable[[int, Any], None]) -> None:
        """``submit`` each block in order and ``take`` its value, gathering block k once block
        k + window is submitted."""
        pending: deque[tuple[int, Any]] = deque()
        for k in range(len(self.blocks)):
            pending.append((k, submit(k)))
            if len(pending) > self.window:
                j, handle = pending.popleft()
                take(j, self.executor.gather([handle])[0])
        while pending:
            j, handle = pending.popleft()
            take(j, self.executor.gather([handle])[0])

    def solve(self, step: ItemReleases, public: PublicItemTerms | None) -> np.ndarray:
        shared = self.executor.share(step)
        factors = np.empty((len(step.frequent), self.rank))

        def solved(k: int, released: Any, pool: tuple[np.ndarray, float] | None) -> Any:
            block = self.blocks[k]
            handle = self.executor.map(_solve_task, [released], [shared], [dpals._rows_of(public, block)], [pool])[0]
            self.solved.append(handle)
            return handle

        def take(k: int, rows: np.ndarray) -> None:
            factors[self.blocks[k]] = rows

        if step.pooling == 0:
            self._pipelined(lambda k: solved(k, self._released(k, shared), None), take)
            return factors
        released: list[Any] = []
        total = np.zeros((self.rank, self.rank), dtype=np.int64)

        def summed(k: int, grid_sum: np.ndarray) -> None:
            nonlocal total
            total = total + grid_sum

        def release(k: int) -> Any:
            released.append(self._released(k, shared))
            return self.executor.map(_grid_sum_task, [released[k]], [shared])[0]

        self._pipelined(release, summed)
        pool = step.pool(total)

        def solve_pooled(k: int) -> Any:
            handle, released[k] = released[k], None  # the cluster frees Ã_j once its block is solved
            return solved(k, handle, pool)

        self._pipelined(solve_pooled, take)
        return factors


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


def _item_owners(executor: Executor, bounded: list[Any], blocks: list[np.ndarray]) -> tuple[list[Any], list[Any]]:
    """(the owners' shards, the partitions' bounded data without item entries): block k goes to
    owner k mod the owners (one a worker, at most one a partition or a block), each partition sends each owner
    its ratings of the owner's blocks, its users numbered in the whole's order, and keeps its user
    plan. The partitions' user counts come to the driver for that numbering (a few integers, used
    for nothing else)."""
    n = len(bounded)
    n_owners = max(1, min(n, executor.width(), len(blocks)))  # an owner without a block would hold a table for nothing
    sizes = executor.gather(executor.map(_n_users_task, bounded))
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).tolist()
    ranges = [tuple((int(block[0]), int(block[-1]) + 1) for block in blocks[owner::n_owners]) for owner in range(n_owners)]
    pieces = [executor.map(_piece_task, bounded, [ranges[owner]] * n, offsets[:-1]) for owner in range(n_owners)]
    # owner o runs where partition o lives: the partitions are spread round robin, so the owners are on distinct workers
    shards = executor.map(_shard_task, [pieces[owner][owner] for owner in range(n_owners)], pieces, ranges,
                          [int(offsets[-1])] * n_owners)
    return shards, executor.map(_users_only_task, bounded)


_EMPTY_PLAN = dpals._EMPTY_PLAN


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
    kept_items: np.ndarray | None = None,
) -> DPALSFit:
    """:func:`dpals.fit_dpals` with the users in partitions on ``executor``: the same releases in
    the same order, the same fit (bit for bit on one hardware/BLAS build), the same event.

    ``ratings`` is either read on the workers, one task per partition (a :class:`PartitionedRatings`:
    the driver never holds the matrix; ``labels`` and ``n_partitions`` are then unused), or cut here:
    ``labels`` (one per user) or ``n_partitions`` (by :func:`partition_labels`) cut the users;
    ``item_block`` sizes the driver's item blocks. ``progress``, ``public_terms`` and ``kept_items``
    as in :func:`dpals.fit_dpals`. The fit's ``prep`` carries the public pre-processing and empty plans
    (the private plans never leave the workers)."""
    keyed = KeyedRandomness(config.seed)
    releaser = GaussianReleaser(None, keyed)
    # the tasks' config carries no seed: the sampling keys travel, and each item release's own noise key
    requested = executor.share(replace(config, seed=0))
    kept = dpals.kept_mask(ratings.item_ids, kept_items)  # the public catalogue's positions
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
                                        bias_statistic, config, releaser, kept)
    del samples
    bounded = executor.map(_bounded_task, parts, [executor.share(public)] * n, keys, configs)
    del parts  # the bounded plans hold what the steps need
    recounts = dpals.release_recounts(_reduced(executor, executor.map(_recount_task, bounded)), config, releaser)
    prep_public: dict[str, Any] = dict(global_mean=public.global_mean, item_counts=public.item_counts, frequent=public.frequent,
                       recounts=recounts, item_biases=public.item_biases, item_bias_prior=public.item_bias_prior)
    shared_public = executor.share(prep_public)
    item_factors = keyed.init_generator().normal(0.0, config.init_scale, size=(len(public.frequent), config.rank))
    blocks = [block for block in _item_blocks(len(public.frequent), item_block) if len(block)]
    shards, bounded = _item_owners(executor, bounded, blocks)
    n_owners = len(shards)
    users: list[Any] = [None] * n
    last_releases: deque[np.ndarray] = deque(maxlen=config.average_last)
    shared_factors = _shared_rows(executor, item_factors)  # later steps': stacked on the cluster (factors())
    for step in range(config.n_steps):
        users = executor.map(_users_task, bounded, users, [shared_public] * n, [shared_factors] * n,
                             configs, [step + 1 == config.n_steps] * n)
        gravity = (_reduced(executor, executor.map(_gravity_task, users, configs)) if config.reg_gravity > 0
                   else np.zeros((config.rank, config.rank)))
        rows = executor.map(_item_rows_task, users, configs)
        tables = executor.map(_table_task, shards, [rows] * n_owners, configs[:n_owners])
        del rows
        cluster = _ClusterItemStep(executor, shards, tables, configs[0], blocks, config.rank,
                                   max(BLOCKS_AHEAD, 2 * n_owners))
        source = ItemSource(chunks=[], statistics=_no_statistics, gravity=functools.partial(np.asarray, gravity),
                            solve=cluster.solve)
        terms = None if public_terms is None else public_terms(public, item_factors)
        item_factors = dpals._item_step(public.frequent, recounts, source, config, releaser, terms)
        if step + 1 < config.n_steps:
            shared_factors = cluster.factors()
        del cluster, source, tables
        last_releases.append(item_factors)
        if progress:
            progress((step + 1) / config.n_steps, f"step {step + 1}/{config.n_steps}")
    event = dpals.checked_event(releaser, reserved, config)
    prep = Preprocessed(**prep_public, user_plan=_EMPTY_PLAN, item_plan=_EMPTY_PLAN)
    return DPALSFit(prep=prep, item_factors=dpals.average_releases(list(last_releases)),
                    user_reg=dpals.user_regularisation(config), event=event, releaser=releaser,
                    config=dpals.with_bias_prior_used(config, public.item_bias_prior))


def distributed_fit(executor: Executor, *, n_partitions: int = 2, labels: np.ndarray | None = None,
                    item_block: int = ITEM_BLOCK) -> FitFunction:
    """:func:`fit_distributed` on ``executor`` as a :class:`dpals.FitFunction`: what ``train_dpals``
    and ``train_dpcmf`` (``fit=``) and so the DPALS and DP-CMF algorithms' ``train`` take to run
    their private part on a cluster; they then publish what they publish in process."""

    def fit(ratings: Ratings | PartitionedRatings, config: DPALSConfig, *, progress: Progress | None = None,
            public_terms: PublicTermsHook | None = None, kept_items: np.ndarray | None = None) -> DPALSFit:
        return fit_distributed(ratings, config, executor, n_partitions=n_partitions, labels=labels,
                               item_block=item_block, progress=progress, public_terms=public_terms,
                               kept_items=kept_items)

    return fit
