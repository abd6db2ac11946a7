"""DPALS post-processing options: pooled item Grams and averaged released V's.

Both are functions of released quantities only, so they must leave every release, its noise
draws and the run's event exactly as they are; these tests check that, and the formulas.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.core.data.ratings import Ratings
from app.core.mf import dpals
from app.core.mf.dpals import (
    DPALSConfig,
    average_releases,
    fit_dpals,
    pool_item_grams,
    pooled_gram,
    train_dpals,
)
from app.core.privacy.discrete_noise import grid_gaussian
from app.core.privacy.releaser import audit_tap
from app.core.privacy.sampling import clip_rows


def _ratings(n_users: int = 80, n_items: int = 30, seed: int = 0) -> Ratings:
    rng = np.random.default_rng(seed)
    users, items = np.nonzero(rng.random((n_users, n_items)) < 0.4)
    return Ratings.from_arrays(users, items, rng.integers(1, 6, size=len(users)).astype(float))


def _config(**overrides) -> DPALSConfig:
    base = dict(rank=3, n_steps=3, contribution_bound=6, frequent_fraction=0.6, noise_multiplier=0.5, seed=3)
    return DPALSConfig(**{**base, **overrides})


@pytest.mark.parametrize("gravity", [0.0, 0.4])
def test_pooling_and_averaging_leave_releases_and_event_unchanged(gravity: float):
    ratings = _ratings()
    plain = train_dpals(ratings, _config(reg_gravity=gravity))
    post = train_dpals(ratings, _config(reg_gravity=gravity, gram_pooling=5.0, average_last=2))
    assert post.event == plain.event
    assert post.metadata["releases"] == plain.metadata["releases"]
    # pre-processing's releases are drawn before training: bit for bit the same
    assert np.array_equal(post.item_counts, plain.item_counts)
    assert np.array_equal(post.item_biases, plain.item_biases)
    assert post.global_mean == plain.global_mean
    assert not np.allclose(post.item_factors, plain.item_factors)


def test_pool_item_grams_formula_and_limits():
    rng = np.random.default_rng(0)
    grams = rng.normal(size=(4, 3, 3))
    grams = grams + np.swapaxes(grams, 1, 2)
    counts = np.array([1.0, 10.0, 100.0, 1000.0])
    mean_gram = np.diag([1.0, 2.0, 3.0])
    pooled, weights = pool_item_grams(grams, counts, mean_gram, scale=10.0, strength=2.0)
    assert np.allclose(weights, counts / (counts + 20.0))
    for j in range(4):
        expected = weights[j] * grams[j] + (1 - weights[j]) * counts[j] * mean_gram
        assert np.allclose(pooled[j], expected)
    same, ones = pool_item_grams(grams, counts, mean_gram, scale=10.0, strength=0.0)
    assert np.array_equal(same, grams) and np.all(ones == 1)
    full, _ = pool_item_grams(grams, counts, mean_gram, scale=10.0, strength=1e12)
    assert np.allclose(full, counts[:, None, None] * mean_gram)
    unpooled, _ = pool_item_grams(grams, counts, mean_gram, scale=0.0, strength=5.0)  # c* = 0: no pooling
    assert np.array_equal(unpooled, grams)


def test_pooled_gram_is_the_weight_normalised_sum():
    rng = np.random.default_rng(1)
    chunks = [rng.normal(size=(5, 2, 2)), rng.normal(size=(3, 2, 2))]
    recounts = rng.uniform(1, 9, size=8)
    mean_gram, scale = pooled_gram(chunks, recounts, noise_std=4.0)
    total = chunks[0].sum(axis=0) + chunks[1].sum(axis=0)
    assert np.allclose(mean_gram, total / recounts.sum())
    per_entry = np.trace(mean_gram) / 2
    assert scale == (pytest.approx(4.0 / per_entry) if per_entry > 0 else 0.0)
    _, none = pooled_gram([-np.eye(2)[None]], np.ones(1), noise_std=4.0)  # a non-positive trace: no pooling
    assert none == 0.0


def test_pooled_item_step_is_a_function_of_the_releases():
    """Rebuild the pooled solve from the released Ã_j, b̃_j and recounts alone."""
    config = _config(n_steps=1, gram_pooling=3.0, reg_gravity=0.0)
    with audit_tap() as tap:
        fit = fit_dpals(_ratings(), config)
    prep, factors = fit.prep, fit.item_factors  # one step: the published V is that step's
    rank, n = config.rank, len(prep.frequent)
    upper = rank * (rank + 1) // 2
    # chunk by chunk (in any order: chunks are released in parallel), the Gram release (whole
    # symmetric matrices: pooling mirrors them) and the linear one, each row at its item's position
    grams, rhs = np.full((n, rank, rank), np.nan), np.full((n, rank), np.nan)
    for rows, full in tap.rows["item_grams"]:
        assert full.shape == (len(rows), rank, rank) and np.array_equal(full, full.transpose(0, 2, 1))
        grams[rows] = full
    for rows, lin in tap.rows["item_linear"]:
        rhs[rows] = lin.reshape(len(rows), rank)
    assert not np.isnan(grams).any() and not np.isnan(rhs).any()  # every trained item released
    assert sum(len(rows) for rows, _ in tap.rows["item_grams"]) == n  # once
    gram_std = grid_gaussian(np.sqrt(config.contribution_bound) * config.clip_user**2,
                             config.noise_multipliers()["gram"], n * upper).std
    mean_gram, scale = pooled_gram([grams], prep.recounts, gram_std)
    shift = dpals.PSD_SHIFT * dpals.noise_edge(gram_std, rank)
    ridge = config.reg_item * dpals.item_ridge_weights(prep.recounts, config.item_reg_exponent)
    pooled, weights = pool_item_grams(grams, prep.recounts, mean_gram, scale, config.gram_pooling)
    rebuilt = dpals._solve_projected(pooled, rhs, ridge, None, None, 0.0, shift * weights[:, None])
    assert np.allclose(rebuilt, factors)


def test_average_last_publishes_the_mean_of_the_last_released_factors():
    """V_t of a T-step run is the published V of the same run stopped after t steps (the noise of
    each step is drawn from its own streams), so the average is the mean of those."""
    ratings, config = _ratings(), _config(n_steps=4, average_last=3)
    model = train_dpals(ratings, config)
    steps = [train_dpals(ratings, replace(config, n_steps=t, average_last=1)) for t in (2, 3, 4)]
    expected = np.mean([step.item_factors[step.trained_mask] for step in steps], axis=0)
    assert np.array_equal(model.trained_mask, steps[-1].trained_mask)
    assert np.allclose(model.item_factors[model.trained_mask], expected)
    assert not np.allclose(model.item_factors, steps[-1].item_factors)  # averaging changed the published V
    last = steps[-1].item_factors[steps[-1].trained_mask]
    assert np.array_equal(average_releases([last]), last)


@pytest.mark.parametrize(
    "overrides",
    [{"gram_pooling": -1.0}, {"gram_pooling": float("inf")}, {"average_last": 0}, {"average_last": 4},
     {"average_last": 1.5}, {"average_last": True}],
)
def test_bad_postprocessing_configs_raise(overrides):
    with pytest.raises(ValueError):
        _config(**overrides)


def test_each_cg_user_step_starts_from_the_last_unclipped_solutions(monkeypatch):
    """The CG warm start of step t is step t−1's user solutions before the clip, in float32 (its
    buffer is reused in place from the third step on), and the item step gathers the clipped ones
    from the table the solve wrote into."""
    starts: list[np.ndarray | None] = []
    solutions: list[np.ndarray] = []
    gathered: list[np.ndarray] = []
    real_user_step, real_item_source = dpals._user_step, dpals.local_item_source

    def user_step(prep, item_factors, config, user_reg, start=None, out=None):
        starts.append(None if start is None else start.copy())
        solved = real_user_step(prep, item_factors, config, user_reg, start, out=out)
        solutions.append(solved.copy())
        return solved

    def item_source(plan, padded, config):
        gathered.append(padded.copy())
        return real_item_source(plan, padded, config)

    # no public seam: the unclipped user solutions and the CG warm start are never released
    monkeypatch.setattr(dpals, "_user_step", user_step)
    # no public seam: the clipped U the item step gathers is private (only its noisy statistics are released)
    monkeypatch.setattr(dpals, "local_item_source", item_source)
    config = _config(n_steps=4, user_cg_steps=3, clip_user=0.05)  # a clip small enough to bind
    train_dpals(_ratings(), config)
    assert starts[0] is None and len(starts) == 4
    for step in range(1, 4):
        assert starts[step] is not None and starts[step].dtype == np.float32
        assert np.array_equal(starts[step], solutions[step - 1].astype(np.float32))
    for solved, padded in zip(solutions, gathered, strict=True):
        assert np.linalg.norm(solved, axis=1).max() > config.clip_user  # the clip binds
        assert np.array_equal(padded[:-1], clip_rows(solved, config.clip_user)) and not padded[-1].any()
