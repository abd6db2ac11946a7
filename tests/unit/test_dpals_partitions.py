"""Partition invariance of DPALS and DP-CMF (docs/algorithms.md §7; issue 28's foundation).

What a distributed driver will do is simulated in process: the users are split into partitions
in three different ways, each partition's exact statistics are computed by the public seam
functions (the ones the in-process trainer calls) and reduced; the results, and the releases
drawn from them with keyed noise, must be the unpartitioned run's bit for bit. End to end, a
model trained with the users in another order (other CSR order, other item-plan slots, other
Gram blocks), other bucket sizes, sampling chunks and threads must be published bit-identical,
with the same ledger event.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np
import pytest

from app.core.data.ratings import Ratings
from app.core.mf import als, dpals
from app.core.mf.als import solve_side_cg
from app.core.mf.dpals import (
    DPALSConfig,
    ItemSource,
    Preprocessed,
    PublicState,
    bound_contributions,
    count_statistic,
    gravity_statistic,
    item_bias_statistic,
    item_statistics,
    mean_statistics,
    rating_keys,
    reduce_exact,
    release_public_state,
    release_recounts,
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
    """The users split by ``assign(user ids)``: each part a Ratings of its users (their own
    positions), the whole catalogue."""
    labels = assign(np.asarray(ratings.user_ids))
    rows, cols, vals = ratings.coo()
    parts = []
    for label in range(int(labels.max()) + 1):
        members = np.flatnonzero(labels == label)
        position = np.full(ratings.n_users, -1)
        position[members] = np.arange(len(members))
        keep = position[rows] >= 0
        parts.append(Ratings.from_indices(position[rows[keep]], cols[keep], vals[keep],
                                          user_ids=ratings.user_ids[members], item_ids=ratings.item_ids))
    return parts


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


def _in_process(fn, *columns):
    """The mapper of the simulated workers: ``fn`` over the partitions, in process."""
    return [fn(*args) for args in zip(*columns, strict=True)]


# what each worker computes on its own partition (module level: a scheduler can ship them)
def _sampled(part: Ratings, config: DPALSConfig):
    keyed = KeyedRandomness(config.seed)
    sample = per_user_sample(part, config.contribution_bound, rating_keys(part, keyed, 0))
    return sample, (count_statistic(part.csr.indices[sample], None, part.n_items),
                    *mean_statistics(part.csr.data[sample], config.midpoint, config.half_range))


def _bias(part: Ratings, sample: np.ndarray, mean: float, config: DPALSConfig) -> np.ndarray:
    return item_bias_statistic(part, sample, mean, config)


def _bounded(part: Ratings, public: PublicState, config: DPALSConfig):
    return bound_contributions(part, config, public, KeyedRandomness(config.seed))


def _user_side(bounded_part, start, prep_public: dict, item_factors: np.ndarray, config: DPALSConfig, last: bool):
    """One worker's user step: its users' solves, the next warm start, the clipped table, and its
    exact item statistics and K (only these leave the worker)."""
    prep = Preprocessed(**prep_public, user_plan=bounded_part.user_plan, item_plan=bounded_part.item_plan)
    table = np.zeros((bounded_part.user_plan.n_rows + 1, config.rank))
    solved = dpals._user_step(prep, item_factors, config, user_regularisation(config), start, out=table[:-1])
    start = solved.astype(np.float32) if config.user_cg_steps and not last else None
    dpals._clip_rows_in_place(solved, config.clip_user)
    factors = als.quantised_factors(table, config.clip_user, weighted=False)
    return start, item_statistics(bounded_part.item_plan, table, config), gravity_statistic(factors)


def fit_partitioned(ratings: Ratings, config: DPALSConfig, assign, n_item_blocks: int, pmap=_in_process):
    """DPALS as a distributed driver runs it: every private statistic computed per user partition
    by the public seam (``pmap``: in process here, a Dask client in tests/integration) and reduced
    (:func:`reduce_exact`); releases, item solves and everything public on the driver; the item
    step over ``n_item_blocks`` blocks of items."""
    parts = _partitions(ratings, assign)
    keyed = KeyedRandomness(config.seed)
    releaser = GaussianReleaser(None, keyed)
    samples, sampled = zip(*pmap(_sampled, parts, [config] * len(parts)), strict=True)
    public = release_public_state(
        reduce_exact(sampled),
        lambda mean: reduce_exact(pmap(_bias, parts, samples, [mean] * len(parts), [config] * len(parts))),
        config, releaser)
    bounded = pmap(_bounded, parts, [public] * len(parts), [config] * len(parts))
    recounts = release_recounts(reduce_exact([b.recount_statistic for b in bounded]), config, releaser)
    prep_public = dict(global_mean=public.global_mean, item_counts=public.item_counts, frequent=public.frequent,
                       recounts=recounts, item_biases=public.item_biases)
    item_factors = keyed.init_generator().normal(0.0, config.init_scale, size=(len(public.frequent), config.rank))
    blocks = np.array_split(np.arange(len(public.frequent)), n_item_blocks)
    starts: list[np.ndarray | None] = [None] * len(parts)
    last: deque[np.ndarray] = deque(maxlen=config.average_last)
    for step in range(config.n_steps):
        n = len(parts)
        results = pmap(_user_side, bounded, starts, [prep_public] * n, [item_factors] * n, [config] * n,
                       [step + 1 == config.n_steps] * n)
        starts = [start for start, _, _ in results]
        grams, rhs = reduce_exact([statistics for _, statistics, _ in results])
        gravity = reduce_exact([k for _, _, k in results])
        source = ItemSource(chunks=blocks, statistics=lambda items, grams=grams, rhs=rhs: (items, grams[items], rhs[items]),
                            gravity=lambda gravity=gravity: gravity)
        item_factors = dpals._item_step(public.frequent, recounts, source, config, releaser)
        last.append(item_factors)
    event = releaser.event(config.n_steps, 3 if config.reg_gravity > 0 else 2)
    prep = Preprocessed(**prep_public, user_plan=bounded[0].user_plan, item_plan=bounded[0].item_plan)
    fit = dpals.DPALSFit(prep=prep, item_factors=dpals.average_releases(list(last)),
                         user_reg=user_regularisation(config), event=event, releaser=releaser)
    return dpals.public_model(ratings, config, fit)


@pytest.mark.parametrize(("partitioning", "item_blocks"), [("three-by-id", 3), ("two-by-hash", 1),
                                                           ("four-random-one-empty", 5)])
@pytest.mark.parametrize("variant", ["adaptive, gravity, pooling", "uniform, exact solves, filter"])
def test_a_partitioned_run_publishes_the_in_process_model(partitioning: str, item_blocks: int, variant: str):
    """End to end: users split three ways, items in blocks, statistics reduced exactly, noise drawn
    once per complete statistic: the published model, its releases and its event are the
    in-process run's, bit for bit."""
    ratings = _ratings(5, n_users=200)
    config = DPALSConfig(rank=5, n_steps=3, contribution_bound=7, frequent_fraction=0.8, noise_multiplier=0.7,
                         reg_gravity=0.3, gram_pooling=1.0, average_last=2, seed=SEED)
    if variant.startswith("uniform"):
        config = replace(config, contribution_mode="uniform", user_cg_steps=0, reg_gravity=0.0, gram_pooling=0.0,
                         noise_filter=0.5)
    reference = train_dpals(ratings, config)
    model = fit_partitioned(ratings, config, PARTITIONINGS[partitioning], item_blocks)
    for got, want in zip(_published(model), _published(reference), strict=True):
        np.testing.assert_array_equal(got, want)
    assert model.event == reference.event == dpals.dpals_event(config)
    assert model.metadata == reference.metadata


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
