"""The distributed driver on a Dask ``LocalCluster`` publishes the in-process model (issue 28).

:mod:`app.core.mf.distributed`'s driver with its tasks on two Dask worker processes (one thread
each, no dashboard): under three partitionings of the users and three item block sizes the
published model, its releases record and its ledger event are the in-process run's, bit for bit
(one hardware and BLAS build), with the service's default rule-8 config (the count histogram's k,
the user-level mean) and with a hand-set one (gravity, pooling, CG warm starts). Needs the
optional ``dask`` extra; skipped without it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.core.mf.distributed import DaskExecutor, distributed_fit
from app.core.mf.dpals import DPALSConfig, dpals_event, train_dpals
from tests.unit.test_dpals_partitions import (
    PARTITIONINGS,
    SEED,
    _published,
    _ratings,
    default_config,
    fit_partitioned,
)

distributed = pytest.importorskip("distributed", reason="the optional 'dask' extra is not installed")


@pytest.fixture(scope="module")
def client():
    with (distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
          distributed.Client(cluster) as dask_client):
        yield dask_client


CONFIGS = {
    "default rule 8": lambda: default_config("rating"),
    "adaptive, gravity, pooling": lambda: DPALSConfig(
        rank=5, n_steps=3, contribution_bound=7, frequent_fraction=0.8, noise_multiplier=0.7, reg_gravity=0.3,
        gram_pooling=1.0, average_last=2, seed=SEED),
    "uniform, exact solves, filter": lambda: replace(
        CONFIGS["adaptive, gravity, pooling"](), contribution_mode="uniform", user_cg_steps=0, reg_gravity=0.0,
        gram_pooling=0.0, noise_filter=0.5),
}


@pytest.mark.parametrize("variant", sorted(CONFIGS))
def test_a_local_cluster_publishes_the_in_process_model(client, variant: str):
    ratings = _ratings(5, n_users=200)
    config = CONFIGS[variant]()
    reference = train_dpals(ratings, config)
    executor = DaskExecutor(client, fan_in=2)  # four partitions: a reduction tree two deep
    for partitioning, item_block in (("three-by-id", 11), ("two-by-hash", 1024), ("four-random-one-empty", 7)):
        model = fit_partitioned(ratings, config, PARTITIONINGS[partitioning], item_block, executor)
        for got, want in zip(_published(model), _published(reference), strict=True):
            np.testing.assert_array_equal(got, want)
        assert model.event == reference.event == dpals_event(config)
        assert model.metadata == reference.metadata and model.config == reference.config
    assert executor.tasks > 0 and executor.moved_bytes > 0
    executed = client.run(lambda dask_worker: dask_worker.state.executed_count)
    assert len(executed) == 2 and all(count > 0 for count in executed.values())  # both workers computed
    keys = client.run_on_scheduler(lambda dask_scheduler: [str(key) for key in dask_scheduler.tasks])
    assert all(str(SEED) not in key for key in keys)  # the seed is in no task key


def test_the_seed_never_reaches_a_worker(client):
    """The workers hold the config without its seed, the sampling keys and each item release's own
    noise key (from which no other release's noise follows), never the seed."""
    ratings = _ratings(5, n_users=200)
    executor = DaskExecutor(client)
    config = default_config("rating")
    shared = []

    def progress(fraction: float, stage: str) -> None:  # mid-run: the run's values are on the workers
        shared.extend(client.run(lambda dask_worker: [value.seed for value in dask_worker.data.values()
                                                      if isinstance(value, DPALSConfig)]).values())

    train_dpals(ratings, config, progress=progress, fit=distributed_fit(executor, n_partitions=3))
    seeds = [seed for worker in shared for seed in worker]
    assert seeds and set(seeds) == {0}


def test_the_default_config_reaches_its_releases_on_the_cluster(client):
    """The first release is the count histogram (k from the data), the mean the user-level one."""
    ratings = _ratings(5, n_users=200)
    model = fit_partitioned(ratings, default_config("rating"), PARTITIONINGS["two-by-hash"], 64, DaskExecutor(client))
    names = [release["name"] for release in model.metadata["releases"]]
    assert names[:2] == ["bound_histogram", "item_counts"] and {"user_mean_sum", "user_count"} <= set(names)


def test_partitions_read_on_the_workers_from_a_parquet_snapshot(client, tmp_path):
    """Each partition read by its task on a worker from a Parquet snapshot (the driver places no
    ratings): the in-process model, bit for bit."""
    pytest.importorskip("pyarrow", reason="the optional 'dask' extra (pyarrow) is not installed")
    from app.core.data.snapshot import open_snapshot, write_snapshot
    from app.core.mf.distributed import split_users

    ratings = _ratings(5, n_users=200)
    config = default_config("rating")
    write_snapshot(tmp_path / "s", split_users(ratings, PARTITIONINGS["three-by-id"](np.asarray(ratings.user_ids))),
                   ratings.item_ids)
    reference = train_dpals(ratings, config)
    executor = DaskExecutor(client)
    model = train_dpals(open_snapshot(tmp_path / "s"), config, fit=distributed_fit(executor))
    for got, want in zip(_published(model), _published(reference), strict=True):
        np.testing.assert_array_equal(got, want)
    assert model.event == reference.event and model.metadata == reference.metadata
    assert executor.moved_bytes > 0


class FlakyReader:
    """A partition's reader whose first call fails (as a dropped database connection would)."""

    def __init__(self, part, marker: str) -> None:
        self.part, self.marker = part, marker

    def __call__(self):
        import os

        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise ConnectionError("the connection dropped during the read")
        return self.part


def test_a_read_that_fails_once_is_retried_on_the_cluster(client, tmp_path):
    """A partition's read that raises is re-run by Dask (the same rows: the run's snapshot), so the
    run publishes the in-process model; without retries it fails closed."""
    import sys

    import cloudpickle

    from app.core.data.partitioned import PartitionedRatings
    from app.core.mf.distributed import split_users

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import the tests
    ratings = _ratings(5, n_users=200)
    config = default_config("rating")
    parts = split_users(ratings, PARTITIONINGS["three-by-id"](np.asarray(ratings.user_ids)))
    reference = train_dpals(ratings, config)

    def flaky(name: str) -> PartitionedRatings:
        readers = tuple(FlakyReader(part, str(tmp_path / f"{name}-{i}")) for i, part in enumerate(parts))
        return PartitionedRatings(ratings.item_ids, readers)

    model = train_dpals(flaky("retried"), config, fit=distributed_fit(DaskExecutor(client)))
    for got, want in zip(_published(model), _published(reference), strict=True):
        np.testing.assert_array_equal(got, want)
    assert model.event == reference.event and model.metadata == reference.metadata
    with pytest.raises(ConnectionError):
        train_dpals(flaky("once"), config, fit=distributed_fit(DaskExecutor(client, read_retries=0)))


#: the results a partition's tasks make from its private data, which no other worker needs, and an
#: item block's release (solved where it was drawn)
#: tasks whose results never leave their worker: a partition's data, and an owner's shard, tables and blocks
PARTITION_TASKS = ("_read_task", "_sample_task", "_bounded_task", "_users_only_task", "_users_task", "_shard_task",
                   "_table_task", "_block_statistics_task", "_release_task")


@pytest.fixture
def client_without_stealing():
    """A cluster whose scheduler places every task itself: Dask's work stealing may still move a
    task whose inputs are small (as this test's are) to an idle worker, and at a production size it
    leaves a partition's tasks alone (their inputs' bytes show, :class:`~app.core.arrays.HeldBytes`)."""
    import dask

    with (dask.config.set({"distributed.scheduler.work-stealing": False}),
          distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
          distributed.Client(cluster) as dask_client):
        yield dask_client


def test_a_partitions_data_stays_on_the_worker_that_read_it(client_without_stealing, tmp_path):
    """Every task over a partition is placed where the partition was read, so no partition's
    ratings, sample, bounded plans or solves cross to another worker; what does is each partition's
    ratings of another owner's item blocks (once a run) and its users' factors (once a step), and
    no block's statistics travel to be summed: a worker holds its own partition and its own items."""
    pytest.importorskip("pyarrow", reason="the optional 'dask' extra (pyarrow) is not installed")
    client = client_without_stealing
    from app.core.data.snapshot import open_snapshot, write_snapshot
    from app.core.mf.distributed import split_users

    ratings = _ratings(5, n_users=400)
    config = replace(CONFIGS["adaptive, gravity, pooling"](), n_steps=4)
    write_snapshot(tmp_path / "s", split_users(ratings, PARTITIONINGS["four-random-one-empty"](
        np.asarray(ratings.user_ids))), ratings.item_ids)
    client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())
    executor = DaskExecutor(client)
    model = train_dpals(open_snapshot(tmp_path / "s"), config, fit=distributed_fit(executor, item_block=8))
    np.testing.assert_array_equal(model.item_factors, train_dpals(ratings, config).item_factors)
    fetched = client.run(lambda dask_worker: [str(key) for entry in dask_worker.transfer_incoming_log
                                              for key in entry["keys"]])
    moved = [key for keys in fetched.values() for key in keys]
    assert any(key.startswith("_piece_task") for key in moved)  # ratings go to their items' owners ...
    assert any(key.startswith("_item_rows_task") for key in moved)  # ... and the users' factors follow them
    assert not [key for key in moved if key.startswith(PARTITION_TASKS)]
    assert set(executor.homes.values()) == set(fetched)  # the partitions were spread over both workers
    solved_on = {home for key, home in executor.homes.items() if str(key).startswith("_solve_task")}
    assert solved_on == set(fetched)  # the item blocks are owned by both workers


def test_the_containers_tasks_pass_report_the_bytes_they_hold():
    """The scheduler reads a result's size through ``dask.sizeof``: a partition, its bounded plans
    and its users' factors report their arrays, not an empty object's few dozen bytes."""
    from dask.sizeof import sizeof

    from app.core.mf import dpals
    from app.core.privacy.keyed import KeyedRandomness

    ratings = _ratings(5, n_users=200)
    config = replace(CONFIGS["adaptive, gravity, pooling"](), frequent_fraction=1.0)
    keyed = KeyedRandomness(config.seed)
    public = dpals.PublicState(3.0, np.ones(ratings.n_items), np.arange(ratings.n_items), np.zeros(ratings.n_items))
    bounded = dpals.bound_contributions(ratings, config, public, keyed.sampling_keys())
    csr_csc = sum(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes for m in (ratings.csr, ratings.csc))
    assert sizeof(ratings) >= csr_csc + ratings.user_ids.nbytes + ratings.item_ids.nbytes
    plans = [bounded.user_plan, bounded.item_plan]
    bucket_bytes = sum(b.cols.nbytes + b.values.nbytes for plan in plans for b in plan.buckets)
    assert sizeof(bounded) >= bucket_bytes + bounded.recount_statistic.nbytes > 10_000
    entries = dpals.bound_contributions(ratings, config, public, keyed.sampling_keys(), by_item="entries").item_entries
    assert entries is not None and len(entries.users) > 1000
    assert sizeof(entries) >= entries.users.nbytes + entries.values.nbytes + entries.weights.nbytes


class RecordingExecutor(DaskExecutor):
    """A Dask executor that keeps what the driver gathers and what it shares."""

    def __init__(self, client) -> None:
        super().__init__(client)
        self.gathered: list = []
        self.shared: list = []

    def gather(self, handles):
        values = super().gather(handles)
        self.gathered.extend(values)
        return values

    def share(self, value):
        self.shared.append(value)
        return super().share(value)


def test_item_factors_reach_the_workers_from_the_driver_once_in_chunks(client, monkeypatch: pytest.MonkeyPatch):
    """The initial V goes out in chunks of at most ``SHARE_BYTES`` (each below Dask's large-graph
    warning), and each later step's user solves read V stacked on the cluster from the solved
    blocks: the driver never sends it again."""
    from app.core.mf import distributed as distributed_module

    monkeypatch.setattr(distributed_module, "SHARE_BYTES", 100)
    ratings = _ratings(5, n_users=200)
    config = replace(CONFIGS["adaptive, gravity, pooling"](), frequent_fraction=1.0, n_steps=3)
    executor = RecordingExecutor(client)
    model = fit_partitioned(ratings, config, PARTITIONINGS["three-by-id"], 8, executor)
    for got, want in zip(_published(model), _published(train_dpals(ratings, config)), strict=True):
        np.testing.assert_array_equal(got, want)
    factor_rows = [value for value in executor.shared
                   if isinstance(value, np.ndarray) and value.ndim == 2 and value.shape[1] == config.rank]
    assert sum(len(rows) for rows in factor_rows) == ratings.n_items  # V once, not once a step
    assert len(factor_rows) > 1 and all(rows.nbytes <= 100 for rows in factor_rows)


@pytest.mark.parametrize("pooling", [0.0, 1.0])
def test_the_item_step_is_released_and_solved_on_the_workers(client, pooling: float):
    """Each item block is released and solved where its statistics were formed: the driver gathers
    its factor rows (and, with pooling, one r × r integer sum a block), never an item's Gram; the
    in-process model, bit for bit."""
    ratings = _ratings(5, n_users=200)
    config = replace(CONFIGS["adaptive, gravity, pooling"](), gram_pooling=pooling, frequent_fraction=1.0)
    executor = RecordingExecutor(client)
    model = fit_partitioned(ratings, config, PARTITIONINGS["three-by-id"], 8, executor)
    for got, want in zip(_published(model), _published(train_dpals(ratings, config)), strict=True):
        np.testing.assert_array_equal(got, want)
    rank, n_items = config.rank, ratings.n_items
    arrays = [value for value in executor.gathered if isinstance(value, np.ndarray)]
    members = [member for value in executor.gathered if isinstance(value, tuple) for member in value]
    grams = [value for value in arrays + members if isinstance(value, np.ndarray) and value.ndim >= 2
             and value.shape[1:] in ((rank * (rank + 1) // 2,), (rank, rank))]
    assert all(value.shape == (rank, rank) for value in grams)  # K (gravity) and the grid sums only
    blocks = [value for value in arrays if value.shape == (8, rank)]  # a block's factor rows
    assert n_items % 8 == 0 and len(blocks) == config.n_steps * n_items // 8  # every block, every step
    sums = [value for value in arrays if value.dtype == np.int64]
    assert len(sums) == (len(blocks) if pooling else 0) and all(value.shape == (rank, rank) for value in sums)


def _malloc_environment() -> dict:
    import os

    from app.core.mf.distributed import WORKER_MALLOC_ENV

    return {name: os.environ.get(name) for name in WORKER_MALLOC_ENV}


def test_workers_started_under_the_config_take_the_allocator_settings():
    """Dask's nanny sets its pre-spawn environment before a worker process starts (glibc reads it
    then): under :func:`worker_environment` the workers run with :data:`WORKER_MALLOC_ENV`,
    not Dask's default trim threshold, even where an earlier cluster left that default in this
    process's environment (as the module's cluster has); the environment is restored after."""
    import os

    from app.core.mf.distributed import WORKER_MALLOC_ENV, worker_environment

    with (worker_environment(),
          distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
          distributed.Client(cluster) as dask_client):
        assert list(dask_client.run(_malloc_environment).values()) == [WORKER_MALLOC_ENV]
    assert os.environ.get("MALLOC_MMAP_THRESHOLD_") != WORKER_MALLOC_ENV["MALLOC_MMAP_THRESHOLD_"]
