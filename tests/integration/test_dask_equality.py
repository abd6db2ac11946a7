"""DPALS's per-partition statistics on a Dask ``LocalCluster`` (issue 28, first step).

The partitioned driver of tests/unit/test_dpals_partitions.py, its per-partition functions run by
two Dask worker processes (one thread each, no dashboard) instead of in process: under three
partitionings of the users and items the published model, its releases record and its ledger
event are the in-process run's, bit for bit (one hardware and BLAS build). Needs the optional
``dask`` extra; skipped without it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.core.mf.dpals import DPALSConfig, dpals_event, train_dpals
from tests.unit.test_dpals_partitions import PARTITIONINGS, SEED, _published, _ratings, fit_partitioned

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client():
    with (distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
          distributed.Client(cluster) as dask_client):
        yield dask_client


@pytest.mark.parametrize("variant", ["adaptive, gravity, pooling", "uniform, exact solves, filter"])
def test_a_local_cluster_publishes_the_in_process_model(client, variant: str):
    ratings = _ratings(5, n_users=200)
    config = DPALSConfig(rank=5, n_steps=3, contribution_bound=7, frequent_fraction=0.8, noise_multiplier=0.7,
                         reg_gravity=0.3, gram_pooling=1.0, average_last=2, seed=SEED)
    if variant.startswith("uniform"):
        config = replace(config, contribution_mode="uniform", user_cg_steps=0, reg_gravity=0.0, gram_pooling=0.0,
                         noise_filter=0.5)
    reference = train_dpals(ratings, config)
    ran_on: set[str] = set()

    def on_cluster(fn, *columns):
        # pure=False: task keys are random, never a hash of the arguments (the config holds the seed)
        futures = client.map(fn, *columns, pure=False)
        results = client.gather(futures)
        ran_on.update(worker for who in client.who_has(futures).values() for worker in who)
        return results

    for partitioning, item_blocks in (("three-by-id", 3), ("two-by-hash", 1), ("four-random-one-empty", 5)):
        model = fit_partitioned(ratings, config, PARTITIONINGS[partitioning], item_blocks, pmap=on_cluster)
        for got, want in zip(_published(model), _published(reference), strict=True):
            np.testing.assert_array_equal(got, want)
        assert model.event == reference.event == dpals_event(config)
        assert model.metadata == reference.metadata
    assert len(ran_on) == 2  # both workers computed partitions
    assert all(str(SEED) not in key for key in client.run_on_scheduler(lambda dask_scheduler: list(
        dask_scheduler.tasks)))  # the seed is in no task key
