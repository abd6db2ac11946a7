"""Partition invariance of DPALS and DP-CMF (docs/algorithms.md §7; issue 28's foundation).

The users are split into partitions in three different ways, each partition's exact statistics
are computed by the public seam functions (the ones the in-process trainer calls) and reduced; the
results, and the releases drawn from them with keyed noise, must be the unpartitioned run's bit for
bit. End to end, the product's distributed driver (app.core.mf.distributed, its tasks run in
process here; on a Dask LocalCluster in tests/integration/test_dask_equality.py) publishes the
in-process model, with the default rule-8 config (the count histogram's k, the user-level mean) and
for DP-CMF too; a model trained with the users in another order (other CSR order, other item-plan slots, other
Gram blocks), other bucket sizes, sampling chunks and threads must be published bit-identical,
with the same ledger event.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.core.algorithms import get_algorithm
from app.core.data.ratings import Ratings
from app.core.mf import als, defaults, dpals
from app.core.mf.als import solve_side_cg
from app.core.mf.distributed import InProcess, distributed_fit, split_users
from app.core.mf.dpals import (
    DPALSConfig,
    PublicState,
    bound_contributions,
    count_statistic,
    gravity_statistic,
    item_bias_statistic,
    item_statistics,
    mean_statistics,
    rating_keys,
    reduce_exact,
    train_dpals,
    user_regularisation,
)
from app.core.mf.dpcmf import DPCMFConfig, PublicData, metadata_source, train_dpcmf
from app.core.privacy import sampling
from app.core.privacy.keyed import KeyedRandomness
from app.core.privacy.releaser import GaussianReleaser
from app.core.privacy.sampling import clip_rows, per_user_sample

N_ITEMS = 40
SEED = (1 << 126) + 31


def _ratings(seed: int = 0, n_users: int = 150) -> Ratings:
    rng = np.random.default_rng(seed)
    mask = rng.random((n_users, N_ITEMS)) < rng.uniform(0.05, 0.6, size=N_ITEMS)
    users, items = np.nonzero(mask)
    values = rng.choice(np.arange(1.0, 5.5, 0.5), size=len(users))
    values[::7] = rng.uniform(1.0, 5.0, size=len(values[::7]))  # some off the half-star grid: rounded terms
    ids = rng.choice(10**12, size=n_users, replace=False)  # external ids, as the service's
    return Ratings.from_arrays(ids[users], items, values, user_ids=ids, item_ids=np.arange(N_ITEMS))


PARTITIONINGS = {
    "three-by-id": lambda ids: ids % 3,
    "two-by-hash": lambda ids: (ids // 7919) % 2,
    "four-random-one-empty": lambda ids: np.random.default_rng(5).choice([0, 1, 3], size=len(ids)),
}


def _partitions(ratings: Ratings, assign) -> list[Ratings]:
    """The users split by ``assign(user ids)`` (the product's :func:`split_users`)."""
    return split_users(ratings, assign(np.asarray(ratings.user_ids)))


def _sample_statistics(data: Ratings, config: DPALSConfig, keyed: KeyedRandomness, mean: float):
    """One partition's pre-processing statistics: counts, mean sum and count, item-bias sums."""
    _, cols, vals = data.coo()
    sample = per_user_sample(data, config.contribution_bound, rating_keys(data, keyed, 0))
    return (count_statistic(cols[sample], None, data.n_items),
            *mean_statistics(vals[sample], config.midpoint, config.half_range),
            item_bias_statistic(data, sample, mean, config))


@pytest.mark.parametrize("partitioning", sorted(PARTITIONINGS))
def test_pre_processing_statistics_and_releases_reduce_exactly(partitioning: str):
    ratings = _ratings()
    config = DPALSConfig(rank=3, contribution_bound=6, seed=SEED)
    keyed = KeyedRandomness(config.seed)
    whole = _sample_statistics(ratings, config, keyed, 3.3)
    parts = [_sample_statistics(p, config, keyed, 3.3) for p in _partitions(ratings, PARTITIONINGS[partitioning])]
    reduced = reduce_exact(parts)
    for got, want in zip(reduced, whole, strict=True):
        np.testing.assert_array_equal(got, want)  # bit for bit, not approximately
    # the releases drawn from the reduced statistics are the whole data's, noise included
    releases = []
    for statistics in (whole, reduced):
        releaser = GaussianReleaser(None, KeyedRandomness(config.seed))
        releases.append([releaser.vector(name, value, 2.0, 1.5)
                         for name, value in zip(("counts", "sum", "count", "bias"), statistics, strict=True)])
    for got, want in zip(*releases, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["uniform", "tail", "adaptive_weights"])
@pytest.mark.parametrize("partitioning", sorted(PARTITIONINGS))
def test_item_step_statistics_reduce_exactly(partitioning: str, mode: str):
    ratings = _ratings(1)
    config = DPALSConfig(rank=5, contribution_bound=5, contribution_mode=mode, clip_user=0.8, clip_rating=1.5,
                         seed=SEED)
    keyed = KeyedRandomness(config.seed)
    rng = np.random.default_rng(2)
    frequent = np.arange(0, N_ITEMS, 1)[:30]
    public = PublicState(global_mean=3.2, item_counts=rng.uniform(1, 60, N_ITEMS), frequent=frequent,
                         item_biases=rng.normal(0, 0.2, N_ITEMS))
    released_v = rng.normal(0, 0.4, size=(len(frequent), config.rank))  # a released V (public)

    def statistics(data: Ratings):
        bounded = bound_contributions(data, config, public, keyed)
        ridge = user_regularisation(config).ridge(bounded.user_plan.counts)
        start = np.zeros((data.n_users, config.rank), dtype=np.float32)
        users = clip_rows(solve_side_cg(bounded.user_plan, released_v, ridge, start, 4), config.clip_user)
        padded = np.vstack([users, np.zeros((1, config.rank))])
        factors = als.quantised_factors(padded, config.clip_user, weighted=False)
        grams, rhs = item_statistics(bounded.item_plan, padded, config)
        assert not np.tril(grams, -1).any()  # the upper triangles alone, the rest zero
        cached = dpals.plan_factors(bounded.item_plan, padded, config)
        for lo, hi in ((0, 7), (7, 8), (8, 30)):  # blocks of items (the cluster's): the whole's rows, bit for bit
            block = item_statistics(bounded.item_plan, padded, config, items=(lo, hi), factors=cached)
            np.testing.assert_array_equal(block[0], grams[lo:hi])
            np.testing.assert_array_equal(block[1], rhs[lo:hi])
        users_by_id = dict(zip(data.user_ids.tolist(), users, strict=True))
        return (bounded.recount_statistic, grams, rhs, gravity_statistic(factors)), users_by_id

    whole, whole_users = statistics(ratings)
    parts = [statistics(p) for p in _partitions(ratings, PARTITIONINGS[partitioning])]
    for _, users in parts:  # each user's solve is her own: the same vector in any partition
        for user_id, vector in users.items():
            np.testing.assert_array_equal(vector, whole_users[user_id])
    reduced = reduce_exact([stats for stats, _ in parts])
    for got, want in zip(reduced, whole, strict=True):
        np.testing.assert_array_equal(got, want)
    assert np.abs(whole[1]).sum() > 0 and np.abs(whole[2]).sum() > 0  # not vacuous


def fit_partitioned(ratings: Ratings, config: DPALSConfig, assign, item_block: int, executor=None,
                    algorithm: str = "dpals", **inputs):
    """The product's distributed driver (:mod:`app.core.mf.distributed`): every private statistic
    computed per user partition by the public seam (on ``executor``: in process here, a Dask
    client in tests/integration) and reduced exactly; releases, item solves and everything public
    on the driver; the item step over blocks of ``item_block`` items."""
    fit = distributed_fit(executor or InProcess(), labels=assign(np.asarray(ratings.user_ids)), item_block=item_block)
    return get_algorithm(algorithm).train(ratings, config, fit=fit, **inputs)


def default_config(objective: str = "rating", epsilon: float = 5.0, n_items: int = N_ITEMS) -> DPALSConfig:
    """The service's default DPALS config (defaults rule 8: k from the count histogram's DP
    quantile, the user-level mean for ratings), calibrated to (ε, 1e-6), with the test's seed."""
    params = defaults.default_hyperparameters(objective=objective, epsilon=epsilon, delta=1e-6,
                                              rating_range=(1.0, 5.0), n_items=n_items, max_users=None)
    config = DPALSConfig.from_dict({**params, "seed": SEED})
    assert config.bound_quantile is not None
    return dpals.calibrate(epsilon, 1e-6, config)


@pytest.mark.parametrize(("partitioning", "item_blocks"), [("three-by-id", 11), ("two-by-hash", 1024),
                                                           ("four-random-one-empty", 7)])
@pytest.mark.parametrize("variant", ["adaptive, gravity, pooling", "uniform, exact solves, filter"])
def test_a_partitioned_run_publishes_the_in_process_model(partitioning: str, item_blocks: int, variant: str):
    """End to end: users split three ways, items in blocks dealt to one or three owners (each owner
    forming its blocks' statistics from every partition's ratings of them), noise drawn once per
    complete statistic: the published model, its releases and its event are the in-process run's,
    bit for bit."""
    ratings = _ratings(5, n_users=200)
    config = DPALSConfig(rank=5, n_steps=3, contribution_bound=7, frequent_fraction=0.8, noise_multiplier=0.7,
                         reg_gravity=0.3, gram_pooling=1.0, average_last=2, seed=SEED)
    if variant.startswith("uniform"):
        config = replace(config, contribution_mode="uniform", user_cg_steps=0, reg_gravity=0.0, gram_pooling=0.0,
                         noise_filter=0.5)
    reference = train_dpals(ratings, config)
    for owners in (1, 3):
        model = fit_partitioned(ratings, config, PARTITIONINGS[partitioning], item_blocks, InProcess(width=owners))
        for got, want in zip(_published(model), _published(reference), strict=True):
            np.testing.assert_array_equal(got, want)
        assert model.event == reference.event == dpals.dpals_event(config)
        assert model.metadata == reference.metadata


@pytest.mark.parametrize("objective", ["rating", "ranking"])
@pytest.mark.parametrize("partitioning", sorted(PARTITIONINGS))
def test_the_default_config_partitioned_publishes_the_in_process_model(partitioning: str, objective: str):
    """Rule 8's defaults: the count histogram's release sets k (each partition's histogram is a
    per-user sum) and, for ratings, the user-level mean (a per-user sum too)."""
    ratings = _ratings(7, n_users=240)
    config = default_config(objective)
    if objective == "rating":
        assert config.mean_mode == "dp_user"
    reference = train_dpals(ratings, config)
    model = fit_partitioned(ratings, config, PARTITIONINGS[partitioning], 9, InProcess(width=2))
    for got, want in zip(_published(model), _published(reference), strict=True):
        np.testing.assert_array_equal(got, want)
    assert model.event == reference.event == dpals.dpals_event(config)
    assert model.metadata == reference.metadata and model.config == reference.config
    names = [release["name"] for release in model.metadata["releases"]]
    assert names[0] == "bound_histogram" and ("user_mean_sum" in names) == (objective == "rating")
    # rules 13 and 14's laws, read from released counts on the driver, consumed into the values used
    assert config.item_bias_prior_by_users == (objective == "rating") and not model.config["item_bias_prior_by_users"]
    assert (config.ridge_users_scale > 0) == (objective == "ranking") and model.config["ridge_users_scale"] == 0.0


@pytest.mark.parametrize("partitioning", ["three-by-id", "four-random-one-empty"])
def test_a_partitioned_run_under_the_step_law_publishes_the_in_process_model(partitioning: str):
    """Rule 10: the step count read from the released B and the rescaled noise, on the driver too."""
    ratings = _ratings(7, n_users=240)
    config = replace(default_config("rating"), n_steps=3, few_steps_bound=100_000, few_steps=1)
    reference = train_dpals(ratings, config)
    assert reference.config["n_steps"] == 1 and reference.config["later_noise_scale"] < 1.0
    model = fit_partitioned(ratings, config, PARTITIONINGS[partitioning], 9)
    for got, want in zip(_published(model), _published(reference), strict=True):
        np.testing.assert_array_equal(got, want)
    assert model.event == reference.event == dpals.dpals_event(config)
    assert model.metadata == reference.metadata and model.config == reference.config


def test_dpcmf_partitioned_publishes_the_in_process_model():
    ratings = _ratings(4, n_users=160)
    genres = np.random.default_rng(0).integers(0, 5, size=(N_ITEMS, 2))
    public = PublicData(sources=(metadata_source([[f"g{a}", f"g{b}"] for a, b in genres]),))
    config = DPCMFConfig(**{**default_config().to_dict(), "rating_range": (1.0, 5.0)}, alpha_metadata=50.0)
    reference = train_dpcmf(ratings, config, public=public)
    model = fit_partitioned(ratings, config, PARTITIONINGS["three-by-id"], 5, InProcess(width=2), algorithm="dpcmf",
                            public=public)
    for got, want in zip(_published(model), _published(reference), strict=True):
        np.testing.assert_array_equal(got, want)
    assert model.algorithm == "dpcmf" and model.event == reference.event
    assert model.metadata == reference.metadata and model.config == reference.config


def _reordered(ratings: Ratings, seed: int) -> Ratings:
    """The same ratings with the users at other positions (the id universe listed in another order)."""
    rows, cols, vals = ratings.coo()
    order = np.random.default_rng(seed).permutation(ratings.n_users)
    return Ratings.from_arrays(ratings.user_ids[rows], ratings.item_ids[cols], vals,
                               user_ids=ratings.user_ids[order], item_ids=ratings.item_ids)


def _published(model) -> tuple:
    return (model.item_factors, model.item_biases, model.item_counts, np.asarray(model.global_mean),
            model.trained_mask)


LAYOUTS = {
    "users reordered": dict(order=1),
    "users reordered, small buckets, one thread": dict(order=2, rows_per_chunk=3, slots=64, threads="1",
                                                       sample_chunk=17),
    "tiny chunks, two threads": dict(order=3, rows_per_chunk=1, slots=16, threads="2", sample_chunk=5),
}


def _train_in_layout(train, ratings: Ratings, layout: dict, monkeypatch: pytest.MonkeyPatch):
    with monkeypatch.context() as patch:
        if "rows_per_chunk" in layout:
            patch.setattr(als, "_MAX_ROWS_PER_CHUNK", layout["rows_per_chunk"])
            patch.setattr(als, "_MAX_SLOTS_PER_CHUNK", layout["slots"])
            patch.setenv("PRIVREC_THREADS", layout["threads"])
            patch.setattr(sampling, "_CHUNK", layout["sample_chunk"])
            patch.setattr(dpals, "_NORM_BLOCK_ROWS", 7)
        return train(_reordered(ratings, layout["order"]))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("variant", ["adaptive, gravity, pooling", "tail, exact solves, filter"])
def test_the_published_model_and_event_do_not_depend_on_the_layout(layout: str, variant: str,
                                                                   monkeypatch: pytest.MonkeyPatch):
    ratings = _ratings(3, n_users=220)
    config = DPALSConfig(rank=6, n_steps=3, contribution_bound=8, frequent_fraction=0.8, noise_multiplier=0.7,
                         reg_gravity=0.2, gram_pooling=1.0, average_last=2, seed=SEED)
    if variant.startswith("tail"):
        config = replace(config, contribution_mode="tail", user_cg_steps=0, reg_gravity=0.0, gram_pooling=0.0,
                         noise_filter=0.5)
    reference = train_dpals(ratings, config)
    model = _train_in_layout(lambda data: train_dpals(data, config), ratings, LAYOUTS[layout], monkeypatch)
    for got, want in zip(_published(model), _published(reference), strict=True):
        np.testing.assert_array_equal(got, want)
    assert model.event == reference.event == dpals.dpals_event(config)
    assert model.metadata["releases"] == reference.metadata["releases"]
    assert not np.array_equal(train_dpals(ratings, replace(config, seed=SEED + 1)).item_factors,
                              reference.item_factors)  # the seed matters: the check is not vacuous


def test_dpcmf_is_layout_free_too(monkeypatch: pytest.MonkeyPatch):
    ratings = _ratings(4, n_users=120)
    genres = np.random.default_rng(0).integers(0, 5, size=(N_ITEMS, 2))
    public = PublicData(sources=(metadata_source([[f"g{a}", f"g{b}"] for a, b in genres]),))
    config = DPCMFConfig(rank=4, n_steps=2, contribution_bound=6, noise_multiplier=0.8, alpha_metadata=0.5, seed=SEED)

    def train(data: Ratings):
        return train_dpcmf(data, config, public=public)

    reference = train(ratings)
    model = _train_in_layout(train, ratings, LAYOUTS["users reordered, small buckets, one thread"], monkeypatch)
    for got, want in zip(_published(model), _published(reference), strict=True):
        np.testing.assert_array_equal(got, want)
    assert model.event == reference.event


def test_rating_keys_by_any_chunks_are_the_keys_in_one_call():
    ratings = _ratings(6)
    keys = rating_keys(ratings, KeyedRandomness(SEED), 0)
    whole = keys(0, ratings.nnz)
    cuts = np.sort(np.random.default_rng(0).integers(0, ratings.nnz, 9))  # cuts inside users too
    pieces = [keys(a, b) for a, b in zip(np.r_[0, cuts], np.r_[cuts, ratings.nnz], strict=True)]
    np.testing.assert_array_equal(np.concatenate(pieces), whole)


def test_the_sampling_keys_alone_draw_the_seeded_keys():
    """What a cluster's workers get instead of the seed draws the same sampling keys, stage by stage."""
    ratings = _ratings(6)
    keyed = KeyedRandomness(SEED)
    for stage in (0, 1):
        np.testing.assert_array_equal(rating_keys(ratings, keyed.sampling_keys(), stage)(0, ratings.nnz),
                                      rating_keys(ratings, keyed, stage)(0, ratings.nnz))
    assert str(SEED) not in repr(keyed.sampling_keys())


def test_a_partitioned_run_keeps_the_same_items_as_in_process():
    """Rule 11's kept items (a public input) on the distributed driver: the in-process model."""
    ratings = _ratings(7, n_users=240)
    config = replace(default_config("ranking"), frequent_fraction=0.1, keep_trained_sigmas=0.5)
    kept_items = ratings.item_ids[::3]
    reference = train_dpals(ratings, config, kept_items=kept_items)
    assert reference.trained_mask.sum() > train_dpals(ratings, config).trained_mask.sum()  # items were kept
    # rule 12 (the default's secondary_weight): the kept items outside the fraction are secondary
    assert config.secondary_by_snr
    assert dpals.secondary_items(reference.item_counts, np.flatnonzero(reference.trained_mask), config) is not None
    model = fit_partitioned(ratings, config, PARTITIONINGS["three-by-id"], 9, InProcess(width=2), kept_items=kept_items)
    for got, want in zip(_published(model), _published(reference), strict=True):
        np.testing.assert_array_equal(got, want)
    assert model.event == reference.event
