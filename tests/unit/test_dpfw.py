"""DPFW (private Frank-Wolfe): sensitivities, accounting of every draw, fold-in replay, artifact."""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import numpy as np
import pytest

from app.core.data.ratings import Ratings
from app.core.data.splits import random_split
from app.core.mf.dpfw import (
    DPFWConfig,
    LocalState,
    _replay,
    _train_with_trace,
    calibrate,
    dpfw_event,
    gram_product,
    gram_sensitivity,
    gram_statistic,
    local_update,
    paper_sigma,
    predict_dpfw,
    prepare_rows,
    recommend_dpfw,
    replay_user,
    top_eigenvector_dense,
    top_eigenvector_oja,
    train_dpfw,
)
from app.core.privacy import accounting
from app.core.privacy.releaser import GaussianReleaser
from tests.unit.test_dpals_privacy import CountingRng, _record_grid_releases

N_ITEMS = 12
L = 2.5


def _ratings(seed: int = 0, n_users: int = 50, n_items: int = N_ITEMS, p: float = 0.5, extra_user: bool = False) -> Ratings:
    rng = np.random.default_rng(seed)
    users, items = np.nonzero(rng.random((n_users, n_items)) < p)
    values = rng.integers(1, 6, size=len(users)).astype(float)
    if extra_user:  # a maximal user: every item, polarised 5/1 (survives own-mean centring)
        users = np.concatenate([users, np.full(n_items, n_users)])
        items = np.concatenate([items, np.arange(n_items)])
        values = np.concatenate([values, np.where(np.arange(n_items) % 2 == 0, 5.0, 1.0)])
    return Ratings.from_arrays(users, items, values, user_ids=np.arange(n_users + extra_user), item_ids=np.arange(n_items))


def _config(**overrides) -> DPFWConfig:
    base = dict(nuclear_norm=40.0, n_steps=5, row_clip=L, max_ratings_per_user=N_ITEMS, eigen_method="dense",
                noise_multiplier=1.3, oja_iterations=4, seed=3)
    return DPFWConfig(**{**base, **overrides})


def _upper_norm(x: np.ndarray) -> float:
    iu = np.triu_indices(x.shape[0])
    return float(np.linalg.norm(x[iu]))


# ---------------------------------------------------------------------------- sensitivity
def test_gram_sensitivity_under_adding_a_maximal_user():
    config = _config()
    small = prepare_rows(_ratings(), config, np.random.default_rng(0))
    large = prepare_rows(_ratings(extra_user=True), config, np.random.default_rng(0))
    assert np.linalg.norm(large.target[large.row_of == 50]) == pytest.approx(L)  # clipped to exactly L
    # any public sequence (v̂_s, λ̂'_s): replay it on both data sets and compare every statistic
    rng = np.random.default_rng(1)
    directions = rng.normal(size=(N_ITEMS, config.n_steps - 1))
    directions /= np.linalg.norm(directions, axis=0)
    scales = np.array([0.5, 3.0, 0.1, 10.0])
    bound = gram_sensitivity(L)
    assert bound == 4 * L**2
    params = dict(nuclear_norm=config.nuclear_norm, n_steps=config.n_steps, row_clip=L)
    s_small, s_large = LocalState.zeros(small, config.n_steps), LocalState.zeros(large, config.n_steps)
    v_pub = rng.normal(size=N_ITEMS)
    v_pub /= np.linalg.norm(v_pub)
    for step in range(config.n_steps - 1):
        a0, a1 = s_small.values - small.target, s_large.values - large.target
        assert np.allclose(a1[: len(a0)], a0)  # the others' rows do not depend on the new user
        diff = gram_statistic(large, a1) - gram_statistic(small, a0)
        a_new = a1[large.row_of == 50]
        assert np.linalg.norm(diff) == pytest.approx(np.sum(a_new**2))  # ‖A_iᵀA_i‖_F = ‖A_i‖²
        assert _upper_norm(diff) <= np.linalg.norm(diff) <= bound + 1e-9
        assert np.linalg.norm(gram_product(large, a1, v_pub) - gram_product(small, a0, v_pub)) <= bound + 1e-9
        for state, rows in ((s_small, small), (s_large, large)):
            local_update(rows, state, step, directions[:, step], scales[step], **params)
        norms = np.sqrt(np.bincount(large.row_of, weights=s_large.values**2))
        assert np.all(norms <= L + 1e-9)  # Π_{L,Ω} keeps ‖P_Ω(Y_i)‖ <= L
    # the bound is attained: a state with Y_i = −Y*_i (allowed, norm L) gives ‖A_i‖ = 2L
    worst = LocalState.zeros(large, config.n_steps)
    worst.values[large.row_of == 50] = -large.target[large.row_of == 50]
    base = LocalState.zeros(small, config.n_steps)
    diff = gram_statistic(large, worst.values - large.target) - gram_statistic(small, base.values - small.target)
    assert np.linalg.norm(diff) == pytest.approx(bound)
    assert _upper_norm(diff) >= 0.7 * bound  # close to the bound, so the check is not vacuous


# ---------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("method", ["dense", "oja"])
def test_every_noise_draw_is_in_the_event(method: str, monkeypatch: pytest.MonkeyPatch):
    _record_grid_releases(monkeypatch)
    ratings = _ratings(n_users=80)
    config = _config(eigen_method=method, noise_multiplier=0.7, eigenvalue_noise_ratio=1.9, max_ratings_per_user=5)
    rng = CountingRng(4)
    model = train_dpfw(ratings, config, rng=rng)
    releases = model.metadata["releases"]
    steps = config.n_steps - 1
    assert model.event == dpfw_event(config)
    assert accounting.count_gaussian_releases(model.event) == len(releases)
    by_name: dict[str, int] = {}
    for r in releases:
        by_name[r["name"]] = by_name.get(r["name"], 0) + 1
        expected = math.sqrt(config.max_ratings_per_user) if r["name"] == "item_counts" else 4 * L**2
        assert r["l2_sensitivity"] == pytest.approx(expected)
    stds = {r["l2_sensitivity"] * r["noise_multiplier"] for r in releases}
    init = [d for d in rng.normal_draws if d[0] == 1.0]
    noise = [d for d in rng.normal_draws if d[0] != 1.0]
    assert {s for s, _ in noise} <= stds  # every draw belongs to a recorded release
    count_std = math.sqrt(config.max_ratings_per_user) * config.noise_multiplier * config.count_noise_ratio
    assert [d for d in noise if d[0] == pytest.approx(count_std)] == [(pytest.approx(count_std), N_ITEMS)]
    assert by_name.pop("item_counts") == 1  # the DP counts, released once
    noise = [d for d in noise if d[0] != pytest.approx(count_std)]
    if method == "dense":
        assert by_name == {"gram": steps}  # exactly T − 1 eigen releases
        assert init == []
        assert noise == [(config.noise_multiplier * 4 * L**2, N_ITEMS * (N_ITEMS + 1) // 2)] * steps
    else:
        assert by_name == {"oja_product": steps * config.oja_iterations, "oja_eigenvalue": steps}
        assert init == [(1.0, N_ITEMS)] * steps  # the data-free start of each step
        product_std = config.noise_multiplier * 4 * L**2
        value_std = 4 * L**2 * (config.noise_multiplier * config.eigenvalue_noise_ratio)  # as recorded
        assert sum(1 for s, n in noise if s == product_std and n == N_ITEMS) == steps * config.oja_iterations
        assert sum(1 for s, n in noise if s == value_std and n == 1) == steps
        assert len(noise) == steps * (config.oja_iterations + 1)  # Γ + 1 releases per step
    assert model.directions.shape == (N_ITEMS, steps) and model.scales.shape == (steps,)
    assert "seed" not in model.config


def test_auto_method_switches_to_oja_above_the_dense_limit():
    config = _config(eigen_method="auto", dense_max_items=10)
    assert config.method(10) == "dense" and config.method(11) == "oja"
    with pytest.raises(ValueError, match="number of items"):
        dpfw_event(config)
    assert accounting.count_gaussian_releases(dpfw_event(config, 11)) == 1 + (config.n_steps - 1) * (config.oja_iterations + 1)
    model = train_dpfw(_ratings(), config)  # 12 items > 10
    assert model.metadata["eigen_method"] == "oja"


@pytest.mark.parametrize("method,epsilon,delta", [("dense", 1.0, 1e-5), ("oja", 5.0, 1e-6), ("dense", 20.0, 1e-6)])
def test_calibrate_round_trip(method: str, epsilon: float, delta: float):
    config = calibrate(epsilon, delta, _config(eigen_method=method, eigenvalue_noise_ratio=2.0))
    event = dpfw_event(config)
    achieved = accounting.epsilon_rdp(event, delta)
    assert achieved <= epsilon
    assert achieved == pytest.approx(epsilon, abs=1e-3 * epsilon)
    assert accounting.epsilon_pld(event, delta) <= achieved * 1.001
    less = replace(config, noise_multiplier=config.noise_multiplier * 0.99)
    assert accounting.epsilon_rdp(dpfw_event(less), delta) > epsilon


def test_paper_sigma_formula_and_its_condition():
    assert paper_sigma(1.0, 1e-5, 10, 2.0) == pytest.approx(4.0 * math.sqrt(640 * math.log(1e5)))
    limit = 2 * math.log(1e5)
    paper_sigma(limit, 1e-5, 10, 2.0)
    with pytest.raises(ValueError, match="2 log"):
        paper_sigma(limit * 1.01, 1e-5, 10, 2.0)
    with pytest.raises(ValueError):
        paper_sigma(0.0, 1e-5, 10, 2.0)


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"eigen_inflation": True, "noise_multiplier": 0.0}, "sigma > 0"),
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"row_clip": 0.0}, "row_clip"),
        ({"row_clip": -1.0}, "row_clip"),
        ({"nuclear_norm": 0.0}, "nuclear_norm"),
        ({"n_steps": 1}, "n_steps"),
        ({"max_ratings_per_user": 0}, "max_ratings_per_user"),
        ({"oja_iterations": 0}, "oja_iterations"),
        ({"eigen_method": "lanczos"}, "eigen_method"),
        ({"failure_probability": 1.0}, "failure_probability"),
        ({"oja_learning_rate": -1.0}, "oja_learning_rate"),
        ({"noise_multiplier": float("nan")}, "noise_multiplier"),
    ],
)
def test_bad_configs_raise(overrides, match):
    with pytest.raises(ValueError, match=match):
        _config(**overrides)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="unknown"):
        DPFWConfig.from_dict({"n_steps": 3, "epsilon_bonus": 1})
    empty = Ratings.from_arrays(np.array([], dtype=int), np.array([], dtype=int), np.array([]), item_ids=np.arange(3))
    noise_only = train_dpfw(empty, _config())  # no data-dependent refusal: every release is noise
    assert noise_only.event == dpfw_event(_config(), 3) and np.all(np.isfinite(noise_only.directions))
    with pytest.raises(ValueError, match="two items"):
        train_dpfw(Ratings.from_arrays(np.array([], dtype=int), np.array([], dtype=int), np.array([]),
                                       item_ids=np.arange(1)), _config())
    with pytest.raises(ValueError):
        calibrate(0.0, 1e-5, _config())
    model = train_dpfw(_ratings(), _config())
    with pytest.raises(ValueError, match="range"):
        replay_user(model, np.array([N_ITEMS]), np.array([3.0]))
    with pytest.raises(ValueError, match="duplicate"):
        replay_user(model, np.array([1, 1]), np.array([3.0, 4.0]))


# ---------------------------------------------------------------------------- fold-in
def _reference_rows(ratings: Ratings, model, config: DPFWConfig) -> np.ndarray:
    """Algorithm 1's local updates, literally, on dense m × n matrices (no cap: ξ >= n)."""
    dense = ratings.csr.toarray()
    observed = np.zeros_like(dense, dtype=bool)
    rows, cols, _ = ratings.coo()
    observed[rows, cols] = True
    counts = observed.sum(1, keepdims=True)
    means = np.where(counts[:, 0] > 0, dense.sum(1) / np.maximum(counts[:, 0], 1), config.default_mean)
    target = np.where(observed, dense - means[:, None], 0.0)
    target *= np.minimum(1.0, config.row_clip / np.maximum(np.linalg.norm(target, axis=1), 1e-300))[:, None]
    y = np.zeros_like(target)
    T, k = config.n_steps, config.nuclear_norm
    for v, lam in zip(model.directions.T, model.scales, strict=True):
        a = np.where(observed, y - target, 0.0)
        u = a @ v / lam
        y = (1 - 1 / T) * y - (k / T) * np.outer(u, v)
        norm_omega = np.linalg.norm(np.where(observed, y, 0.0), axis=1)
        y *= np.minimum(1.0, config.row_clip / np.maximum(norm_omega, 1e-300))[:, None]
    return means[:, None] + y


@pytest.mark.parametrize("method", ["dense", "oja"])
def test_fold_in_replay_equals_the_training_state(method: str):
    ratings = _ratings(n_users=40)
    config = _config(eigen_method=method, noise_multiplier=0.5)
    model, trace = _train_with_trace(ratings, config)
    training = trace.rows.means[:, None] + trace.state.coefficients @ model.directions.T
    reference = _reference_rows(ratings, model, config)
    assert np.allclose(training, reference)
    rows, cols, _ = ratings.coo()
    assert np.allclose(trace.state.values, training[rows, cols] - trace.rows.means[rows])  # Y on Ω
    for user in (0, 7, 21):
        idx, vals = ratings.user_row(user)
        assert np.allclose(replay_user(model, idx, vals), training[user])
    means, coef = __import__("app.core.mf.dpfw", fromlist=["fold_in_users_dpfw"]).fold_in_users_dpfw(model, ratings)
    assert np.allclose(coef, trace.state.coefficients)
    assert np.allclose(predict_dpfw(model, ratings, ratings), training[rows, cols])


def test_fold_in_uses_all_ratings_while_training_caps_them():
    ratings = _ratings(n_users=40, p=0.8)
    config = _config(max_ratings_per_user=3)
    model, trace = _train_with_trace(ratings, config)
    assert np.all(np.diff(trace.rows.indptr) <= 3)
    idx, vals = ratings.user_row(0)
    assert len(idx) > 3
    rows = prepare_rows(ratings, config, None, cap=False)
    full = _replay(rows, model.directions, model.scales, dict(nuclear_norm=40.0, n_steps=5, row_clip=L))
    assert np.allclose(replay_user(model, idx, vals), rows.means[0] + model.directions @ full.coefficients[0])


def test_recommend_has_the_top_n_semantics_of_dpals():
    ratings = _ratings(n_users=40)
    model = train_dpfw(ratings, _config(noise_multiplier=0.2))
    idx, vals = ratings.user_row(3)
    scores = replay_user(model, idx, vals)
    chosen, got = recommend_dpfw(model, idx, vals, 4)
    assert len(chosen) == 4 and not set(chosen) & set(idx.tolist())
    assert np.all(np.diff(got) <= 0) and np.allclose(got, scores[chosen])
    unrated = np.setdiff1d(np.arange(N_ITEMS), idx)
    assert chosen[0] == unrated[np.argmax(scores[unrated])]
    allowed = unrated[:2]
    chosen, _ = recommend_dpfw(model, idx, vals, 5, allowed_idx=allowed, exclude_idx=allowed[:1])
    assert chosen.tolist() == allowed[1:].tolist()  # fewer than n when filtering leaves fewer
    nobody, _ = recommend_dpfw(model, np.array([], dtype=int), np.array([]), 3)
    assert len(nobody) == 3
    assert np.allclose(replay_user(model, np.array([], dtype=int), np.array([])), model.config["default_mean"])


# ---------------------------------------------------------------------------- eigenvectors and quality
def test_dense_and_oja_agree_on_a_well_separated_top_eigenvector():
    rng = np.random.default_rng(0)
    m, n = 300, 15
    direction = rng.normal(size=n)
    values = np.outer(rng.normal(size=m), direction) + 0.1 * rng.normal(size=(m, n))
    users, items = np.nonzero(np.ones((m, n)))
    ratings = Ratings.from_arrays(users, items, values.ravel())
    config = _config(row_clip=50.0, noise_multiplier=1e-7, oja_iterations=60)
    rows = prepare_rows(ratings, config, np.random.default_rng(0))
    a = -rows.target
    exact = np.linalg.eigh(gram_statistic(rows, a))[1][:, -1]
    v_dense, lam_dense, _ = top_eigenvector_dense(rows, a, config, GaussianReleaser(np.random.default_rng(1)))
    v_oja, lam_oja, _ = top_eigenvector_oja(rows, a, config, GaussianReleaser(np.random.default_rng(2)))
    assert abs(v_dense @ exact) > 0.9999
    assert abs(v_oja @ exact) > 0.999
    assert lam_oja == pytest.approx(lam_dense, rel=1e-3)


def test_seeded_determinism():
    ratings = _ratings()
    for method in ("dense", "oja"):
        a = train_dpfw(ratings, _config(eigen_method=method, max_ratings_per_user=4))
        b = train_dpfw(ratings, _config(eigen_method=method, max_ratings_per_user=4))
        c = train_dpfw(ratings, _config(eigen_method=method, max_ratings_per_user=4, seed=9))
        assert np.array_equal(a.directions, b.directions) and np.array_equal(a.scales, b.scales)
        assert not np.allclose(a.scales, c.scales)


def test_rank_one_problem_at_huge_epsilon_beats_predicting_zero():
    rng = np.random.default_rng(5)
    m, n = 1500, 30
    b = rng.normal(size=n)
    b -= b.mean()
    truth = np.outer(rng.normal(size=m), b)
    users, items = np.nonzero(rng.random((m, n)) < 0.5)
    ratings = Ratings.from_arrays(users, items, truth[users, items], item_ids=np.arange(n))
    train, test = random_split(ratings, (0.8, 0.2), seed=0)
    config = calibrate(1e4, 1e-6, DPFWConfig(nuclear_norm=300.0, n_steps=20, row_clip=8.0, max_ratings_per_user=n,
                                             eigen_method="dense"))
    model = train_dpfw(train, config)
    pred = predict_dpfw(model, train, test)
    rmse = float(np.sqrt(np.mean((pred - test.csr.data) ** 2)))
    zero = float(np.sqrt(np.mean(test.csr.data**2)))
    assert rmse < 0.5 * zero


def test_inflation_is_added_and_nothing_derived_from_the_data_is_logged(caplog):
    ratings = _ratings()
    config = _config(eigen_inflation=True, failure_probability=0.1)
    with caplog.at_level(logging.DEBUG, logger="app.core.mf.dpfw"):
        model = train_dpfw(ratings, config)
    sigma = 4 * L**2 * config.noise_multiplier
    inflation = math.sqrt(sigma * math.log(N_ITEMS / 0.1)) * N_ITEMS**0.25
    assert np.all(model.scales >= inflation - 1e-9)
    plain = train_dpfw(ratings, replace(config, eigen_inflation=False))
    assert np.allclose(model.scales[0], plain.scales[0] + inflation)  # same first release, same seed
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "lambda" not in messages and "inflation" not in messages
    for value in np.concatenate([model.scales, plain.scales]):
        assert f"{value:.6g}" not in messages and f"{value:.3g}" not in messages
    assert model.metadata["eigen_inflation"] is True


# ---------------------------------------------------------------------------- artifact
def test_count_release_sensitivity_under_adding_a_maximal_user():
    from app.core.mf.dpfw import prepare_rows

    config = _config(max_ratings_per_user=5)
    small, large = _ratings(), _ratings(extra_user=True)
    counts = [
        np.bincount(prepare_rows(r, config, np.random.default_rng(1)).indices, minlength=N_ITEMS).astype(float)
        for r in (small, large)
    ]
    delta = np.linalg.norm(counts[1] - counts[0])
    assert delta <= math.sqrt(config.max_ratings_per_user) + 1e-12
    assert delta == pytest.approx(math.sqrt(config.max_ratings_per_user))  # the bound is attained
