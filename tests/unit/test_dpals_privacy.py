"""Privacy tests for DPALS: sensitivities checked numerically, every noise draw accounted for."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from app.core.data.ratings import Ratings
from app.core.mf import dpals
from app.core.mf.als import iter_grams, quantised_factors
from app.core.mf.dpals import (
    DPALSConfig,
    PublicState,
    bound_contributions,
    calibrate,
    count_statistic,
    dpals_event,
    item_bias_statistic,
    mean_statistics,
    project_psd,
    rating_keys,
    shrink_item_biases,
    solve_side,
    train_dpals,
    user_regularisation,
)
from app.core.privacy import accounting
from app.core.privacy.discrete_noise import GridGaussian
from app.core.privacy.keyed import KeyedRandomness
from app.core.privacy.releaser import GaussianReleaser, symmetric_noise
from app.core.privacy.sampling import clip_rows, lowest_k_per_row, per_user_sample

K = 6  # contribution bound used throughout


def _base_ratings(seed: int = 0, n_users: int = 60, n_items: int = 25) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = rng.random((n_users, n_items)) < 0.4
    users, items = np.nonzero(mask)
    values = rng.integers(1, 6, size=len(users)).astype(float)
    return users, items, values


def _with_extreme_user(users, items, values, n_items: int, polarised: bool = False):
    """Neighbouring data set: one extra user (the last index) rating every item at the extremes.

    All 5s maximise the raw residuals; alternating 5s and 1s survive per-user centring.
    """
    new_user = users.max() + 1
    extra_items = np.arange(n_items)
    extreme = np.where(extra_items % 2 == 0, 5.0, 1.0) if polarised else np.full(n_items, 5.0)
    return (
        np.concatenate([users, np.full(n_items, new_user)]),
        np.concatenate([items, extra_items]),
        np.concatenate([values, extreme]),
    )


def _pair(mode: str, n_items: int = 25, polarised: bool = False):
    users, items, values = _base_ratings(n_items=n_items)
    item_ids = np.arange(n_items)
    small = Ratings.from_arrays(users, items, values, item_ids=item_ids, user_ids=np.arange(users.max() + 1))
    u2, i2, v2 = _with_extreme_user(users, items, values, n_items, polarised)
    large = Ratings.from_arrays(u2, i2, v2, item_ids=item_ids, user_ids=np.arange(u2.max() + 1))
    config = DPALSConfig(
        rating_range=(1.0, 5.0), rank=4, contribution_bound=K, contribution_mode=mode,
        frequent_fraction=0.8, clip_user=0.7, clip_rating=1.5, reg_gravity=0.3,
    )
    return small, large, config


def _upper(x: np.ndarray) -> np.ndarray:
    iu = np.triu_indices(x.shape[-1])
    return x[..., iu[0], iu[1]]


def test_count_and_mean_sensitivities_under_adding_a_maximal_user():
    small, large, config = _pair("uniform")
    stats = []
    for data in (small, large):
        _, cols, vals = data.coo()
        sample = per_user_sample(data, K, rating_keys(data, KeyedRandomness(5), 0))  # keyed by user id and item
        counts = count_statistic(cols[sample], None, data.n_items)
        stats.append((counts, *mean_statistics(vals[sample], config.midpoint, config.half_range), sample))
    (c0, s0, n0, m0), (c1, s1, n1, m1) = stats
    # the earlier users' samples are unchanged, so the difference is the new user's contribution
    assert np.array_equal(m1[: len(m0)], m0)
    assert np.linalg.norm(c1 - c0) <= math.sqrt(K) + 1e-12
    assert np.linalg.norm(c1 - c0) == pytest.approx(math.sqrt(K))  # the bound is attained
    assert abs(s1 - s0) <= K * config.half_range + 1e-12
    assert abs(s1 - s0) == pytest.approx(K * config.half_range)
    assert abs(n1 - n0) == K


@pytest.mark.parametrize("centring", [False, True])
def test_item_bias_sum_sensitivity_under_adding_a_maximal_user(centring: bool):
    small, large, config = _pair("uniform", polarised=True)
    config = replace(config, user_centering=centring, clip_bias=0.8)
    sums = []
    for data in (small, large):
        sample = per_user_sample(data, K, np.random.default_rng(5))
        sums.append(item_bias_statistic(data, sample, 3.0, config))
    delta = np.linalg.norm(sums[1] - sums[0])
    assert delta <= math.sqrt(K) * config.clip_bias + 1e-12
    assert delta >= 0.9 * math.sqrt(K) * config.clip_bias  # polarised extremes nearly attain it


def test_item_bias_shrinkage_pulls_noisy_rare_items_to_the_baseline():
    config = DPALSConfig(item_bias_shrinkage=5.0, item_bias_prior_std=0.5)
    counts = np.geomspace(1.0, 1e4, 50)
    noise_std = 20.0
    for draw in (1.0, 3.0):  # pure noise of 1 and 3 stds on every item
        shrunk = shrink_item_biases(np.full(50, draw * noise_std), counts, noise_std, config)
        # n + σ²/(nτ²) >= 2σ/τ: a noise-only bias never exceeds draw·τ_b/2, whatever the count
        assert np.all(np.abs(shrunk) <= draw * config.item_bias_prior_std / 2 + 1e-12)
        assert abs(shrunk[0]) < 0.1 * draw * config.item_bias_prior_std  # the rarest stay near the baseline
    signal = shrink_item_biases(0.4 * counts, counts, noise_std, config)  # true bias 0.4
    assert signal[-1] == pytest.approx(0.4, abs=0.01)  # well-measured items keep their bias


@pytest.mark.parametrize("centring", [False, True])
@pytest.mark.parametrize("mode", ["uniform", "tail", "adaptive_weights"])
def test_recount_gram_and_linear_sensitivities(mode: str, centring: bool):
    small, large, config = _pair(mode, polarised=centring)
    config = replace(config, user_centering=centring)
    rng_state = np.random.default_rng(11)
    counts = np.maximum(rng_state.normal(20, 5, size=small.n_items), 1.0)
    biases = np.random.default_rng(12).normal(0, 0.3, size=small.n_items)  # released b̃ (public)
    public = PublicState(global_mean=3.1, item_counts=counts, frequent=np.arange(0, small.n_items, 1)[:20],
                         item_biases=biases)
    item_factors = np.random.default_rng(3).normal(0, 0.5, size=(20, config.rank))  # public V
    user_reg = user_regularisation(config)
    out = []
    for data in (small, large):
        bounded = bound_contributions(data, config, public, KeyedRandomness(7))
        ridge = user_reg.ridge(bounded.user_plan.counts)
        users = clip_rows(solve_side(bounded.user_plan, item_factors, ridge, None), config.clip_user)
        grams = np.zeros((20, config.rank, config.rank))
        linear = np.zeros((20, config.rank))
        for rows, gram, b in iter_grams(bounded.item_plan, users):
            grams[rows], linear[rows] = gram, b
        out.append((bounded.recount_statistic, users.T @ users, grams, linear, users,
                    *_released_item_statistics(bounded, users, config)))
    (r0, k0, g0, l0, u0, q0, m0), (r1, k1, g1, l1, u1, q1, m1) = out
    assert np.allclose(u1[: len(u0)], u0)  # other users' embeddings do not depend on the new user
    assert np.linalg.norm(u1[-1]) == pytest.approx(config.clip_user)  # the new user is clipped
    sqrt_b = math.sqrt(K)
    assert np.linalg.norm(r1 - r0) <= sqrt_b + 1e-9
    assert np.linalg.norm(_upper(k1 - k0)) <= config.clip_user**2 + 1e-9
    gram_delta = np.linalg.norm(_upper(g1 - g0))
    linear_delta = np.linalg.norm(l1 - l0)
    assert gram_delta <= sqrt_b * config.clip_user**2 + 1e-9
    assert linear_delta <= sqrt_b * config.clip_user * config.clip_rating + 1e-9
    # a maximal user comes close to the bounds: the check is not vacuous
    assert gram_delta >= 0.5 * sqrt_b * config.clip_user**2
    assert linear_delta >= 0.3 * sqrt_b * config.clip_user * config.clip_rating
    # the statistics the release actually reads (quantised, exact sums) obey the same bounds
    released_gram_delta = np.linalg.norm(_upper(q1 - q0))
    released_linear_delta = np.linalg.norm(m1 - m0)
    assert 0.5 * sqrt_b * config.clip_user**2 <= released_gram_delta <= sqrt_b * config.clip_user**2 + 1e-12
    assert released_gram_delta == pytest.approx(gram_delta, rel=0.01)
    assert released_linear_delta <= sqrt_b * config.clip_user * config.clip_rating + 1e-9
    assert released_linear_delta == pytest.approx(linear_delta, rel=0.01)


def _released_item_statistics(bounded, users: np.ndarray, config: DPALSConfig) -> tuple[np.ndarray, np.ndarray]:
    """The item step's (Σ c x xᵀ, Σ c M x) per item, as ``_item_step`` forms them for its release."""
    plan = bounded.item_plan
    padded = np.vstack([users, np.zeros((1, config.rank))])
    factors = quantised_factors(padded, config.clip_user, weighted=any(b.sqrt_weights is not None for b in plan.buckets))
    grams, linear = np.zeros((plan.n_rows, config.rank, config.rank)), np.zeros((plan.n_rows, config.rank))
    for chunk in dpals._item_chunks(plan):
        items, gram, b = dpals._chunk_statistics(chunk, factors, config.rank, plan.counts, config.clip_rating)
        grams[items], linear[items] = np.triu(gram), b
    return grams, linear


class CountingRng:
    """Wraps a Generator and records every Gaussian draw (scale and size), children included:
    float draws (``normal``) and grid releases (exact discrete Gaussian, scale = sensitivity x
    multiplier, recorded by ``_record_grid_releases``)."""

    def __init__(self, seed: int | np.random.Generator, draws: list | None = None) -> None:
        self._rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        self.normal_draws: list[tuple[float, int]] = [] if draws is None else draws

    def spawn(self, n: int) -> list[CountingRng]:
        return [CountingRng(child, self.normal_draws) for child in self._rng.spawn(n)]

    def normal(self, loc=0.0, scale=1.0, size=None):
        out = self._rng.normal(loc, scale, size=size)
        self.normal_draws.append((float(scale), int(np.size(out))))
        return out

    def random(self, size=None):
        return self._rng.random(size)

    def integers(self, *args, **kwargs):
        return self._rng.integers(*args, **kwargs)

    def bytes(self, n: int) -> bytes:
        return self._rng.bytes(n)


def _record_grid_releases(monkeypatch: pytest.MonkeyPatch, draws: list | None = None) -> None:
    """Every discrete-Gaussian grid release records (sensitivity x multiplier, size) in ``draws``
    (None: on its rng's ``normal_draws``, for a :class:`CountingRng`): elementwise releases all
    their entries, symmetric ones each matrix's upper triangle; and V's keyed initialisation its
    float draws."""
    original, original_symmetric = GridGaussian.release, GridGaussian.release_symmetric
    original_init = KeyedRandomness.init_generator

    def record(rng, drawn):
        (rng.normal_draws if draws is None else draws).append(drawn)

    def release(self, rng, value):
        record(rng, (self.sensitivity * self.multiplier, int(np.size(value))))
        return original(self, rng, value)

    def release_symmetric(self, rng, value, out=None, mirror=True):
        rank = value.shape[-1]
        drawn = int(np.size(value)) // (rank * rank) * rank * (rank + 1) // 2
        record(rng, (self.sensitivity * self.multiplier, drawn))
        return original_symmetric(self, rng, value, out=out, mirror=mirror)

    monkeypatch.setattr(GridGaussian, "release", release)
    monkeypatch.setattr(GridGaussian, "release_symmetric", release_symmetric)
    if draws is not None:
        monkeypatch.setattr(KeyedRandomness, "init_generator", lambda self: CountingRng(original_init(self), draws))


@pytest.mark.parametrize("gravity", [0.0, 0.5])
def test_every_noise_draw_is_in_the_event(gravity: float, monkeypatch: pytest.MonkeyPatch):
    draws: list[tuple[float, int]] = []
    _record_grid_releases(monkeypatch, draws)
    users, items, values = _base_ratings(n_users=80, n_items=30)
    ratings = Ratings.from_arrays(users, items, values)
    # ratios chosen so that every release has its own noise scale
    config = DPALSConfig(rank=3, n_steps=3, contribution_bound=K, frequent_fraction=0.5, clip_user=0.9,
                         count_noise_ratio=1.7, reg_gravity=gravity, noise_multiplier=1.3, seed=2)
    model = train_dpals(ratings, config)
    init_draws = [d for d in draws if d[0] == config.init_scale]
    noise_draws = [d for d in draws if d[0] != config.init_scale]
    assert len(init_draws) == 1  # V's data-free initialisation
    releases = model.metadata["releases"]
    stds = {r["l2_sensitivity"] * r["noise_multiplier"] for r in releases}
    # every draw's scale belongs to a recorded release ...
    assert {scale for scale, _ in noise_draws} <= stds
    # ... and the recorded releases are exactly the event's Gaussian mechanisms
    assert accounting.count_gaussian_releases(model.event) == len(releases)
    assert model.event == dpals_event(config)
    # every trained item gets Gram and linear noise in every step
    n_trained = int(model.trained_mask.sum())
    by_name: dict[str, int] = {}
    for r in releases:
        by_name[r["name"]] = by_name.get(r["name"], 0) + 1
    assert by_name["item_grams"] == by_name["item_linear"] == config.n_steps
    assert by_name.get("gravity_gram", 0) == (config.n_steps if gravity else 0)
    gram_std = next(r["l2_sensitivity"] * r["noise_multiplier"] for r in releases if r["name"] == "item_grams")
    linear_std = next(r["l2_sensitivity"] * r["noise_multiplier"] for r in releases if r["name"] == "item_linear")
    for name, std in (("item_grams", gram_std), ("item_linear", linear_std)):
        assert {r["name"] for r in releases if r["l2_sensitivity"] * r["noise_multiplier"] == std} == {name}
    upper_triangle = config.rank * (config.rank + 1) // 2  # the released entries of each symmetric Ã_j
    assert sum(n for s, n in noise_draws if s == gram_std) == config.n_steps * n_trained * upper_triangle
    assert sum(n for s, n in noise_draws if s == linear_std) == config.n_steps * n_trained * config.rank


def test_event_fields_match_the_stated_multipliers():
    config = DPALSConfig(noise_multiplier=3.0, gram_noise_ratio=2.0, count_noise_ratio=1.5, mean_noise_ratio=4.0)
    event = dpals_event(config)
    pre = event.events[:-1]
    assert [e.noise_multiplier for e in pre] == [4.5, 12.0, 12.0, 6.0, 4.5]  # counts, mean x2, biases, recounts
    without_biases = dpals_event(replace(config, item_bias=False)).events[:-1]
    assert [e.noise_multiplier for e in without_biases] == [4.5, 12.0, 12.0, 4.5]
    steps = event.events[-1]
    assert steps.count == config.n_steps
    assert [e.noise_multiplier for e in steps.event.events] == [6.0, 3.0]


@pytest.mark.parametrize("epsilon,delta", [(1.0, 1e-5), (5.0, 1e-5), (20.0, 1e-6)])
def test_calibrate_round_trip(epsilon: float, delta: float):
    config = calibrate(epsilon, delta, DPALSConfig(n_steps=3, reg_gravity=0.2))
    achieved = accounting.epsilon_rdp(dpals_event(config), delta)
    assert achieved <= epsilon
    assert achieved == pytest.approx(epsilon, rel=1e-3)
    # a bit less noise would overspend
    less = replace(config, noise_multiplier=config.noise_multiplier * 0.99)
    assert accounting.epsilon_rdp(dpals_event(less), delta) > epsilon
    # PLD is tighter than RDP but of the same magnitude
    pld = accounting.epsilon_pld(dpals_event(config), delta)
    assert 0.7 * epsilon <= pld <= epsilon * 1.001


def test_rdp_and_pld_agree_with_the_exact_gaussian_formula():
    import dp_accounting

    sigma, delta = 2.0, 1e-6
    exact = dp_accounting.get_epsilon_gaussian(sigma, delta)
    event = accounting.gaussian(sigma)
    assert accounting.epsilon_pld(event, delta) == pytest.approx(exact, rel=0.01)
    assert exact <= accounting.epsilon_rdp(event, delta) <= 1.3 * exact


def test_clipping_and_psd_invariants():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 3, size=(200, 5))
    clipped = clip_rows(x, 1.5)
    norms = np.linalg.norm(clipped, axis=1)
    assert np.all(norms <= 1.5 + 1e-12)
    small = np.linalg.norm(x, axis=1) <= 1.5
    assert np.allclose(clipped[small], x[small])
    noise = symmetric_noise(rng, (50, 6, 6), 2.0)
    assert np.allclose(noise, np.swapaxes(noise, 1, 2))
    assert np.std(_upper(noise)) == pytest.approx(2.0, rel=0.1)
    eigval, eigvec = project_psd(noise)
    assert np.all(eigval >= 0)
    rebuilt = np.matmul(eigvec * eigval[:, None, :], np.swapaxes(eigvec, 1, 2))
    assert np.all(np.linalg.eigvalsh(rebuilt) >= -1e-9)


def test_seeded_determinism():
    users, items, values = _base_ratings()
    ratings = Ratings.from_arrays(users, items, values)
    config = DPALSConfig(rank=3, n_steps=2, contribution_bound=K, seed=4)
    a = train_dpals(ratings, config)
    b = train_dpals(ratings, config)
    c = train_dpals(ratings, replace(config, seed=5))
    assert np.array_equal(a.item_factors, b.item_factors)
    assert a.global_mean == b.global_mean
    assert not np.allclose(a.item_factors, c.item_factors)


@pytest.mark.parametrize("epsilon,delta", [(0.0, 1e-5), (-1.0, 1e-5), (float("nan"), 1e-5), (1.0, 0.0), (1.0, 1.0),
                                           (1.0, -0.1), (float("inf"), 1e-5)])
def test_bad_privacy_targets_raise(epsilon, delta):
    with pytest.raises(ValueError):
        calibrate(epsilon, delta, DPALSConfig())


def test_ratings_outside_the_declared_range_raise():
    ratings = Ratings.from_arrays([0, 1], [0, 1], [1.0, 7.0])
    with pytest.raises(ValueError, match="range"):
        train_dpals(ratings, DPALSConfig(rating_range=(1.0, 5.0)))


def test_empty_ratings_train_a_noise_only_model():
    """No refusal that depends on the data: an empty matrix still makes every release (noise
    only) and publishes a model whose event is the reserved one."""
    empty = Ratings.from_arrays(np.array([], dtype=int), np.array([], dtype=int), np.array([]),
                                item_ids=np.arange(5))
    config = DPALSConfig(rank=2, n_steps=2)
    model = train_dpals(empty, config)
    assert model.item_factors.shape == (5, 2) and np.all(np.isfinite(model.item_factors))
    assert model.event == dpals_event(config)


@pytest.mark.parametrize(
    "overrides",
    [
        {"rank": 0}, {"contribution_mode": "all"}, {"frequent_fraction": 0.0}, {"clip_user": 0.0},
        {"noise_multiplier": float("nan")}, {"rating_range": (5.0, 1.0)}, {"weight_exponent": 0.5},
        {"reg_item": 0.0}, {"user_cg_steps": -1}, {"user_cg_steps": 1.5}, {"user_cg_steps": True},
    ],
)
def test_bad_configs_raise(overrides):
    with pytest.raises(ValueError):
        DPALSConfig(**overrides)


def test_config_round_trips_and_rejects_unknown_keys():
    config = DPALSConfig(rank=7, contribution_mode="adaptive_weights")
    assert DPALSConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown"):
        DPALSConfig.from_dict({"rank": 3, "epsilon_bonus": 1})


def test_users_without_frequent_ratings_and_items_without_data_still_train():
    # user 3 rates only item 9, which has too few ratings to be frequent
    users = np.array([0, 0, 1, 1, 2, 2, 3])
    items = np.array([0, 1, 0, 1, 0, 1, 9])
    ratings = Ratings.from_arrays(users, items, np.array([5, 4, 4, 5, 3, 4, 2.0]), item_ids=np.arange(10))
    model = train_dpals(ratings, DPALSConfig(rank=2, contribution_bound=2, frequent_fraction=0.5, noise_multiplier=1.0))
    assert model.trained_mask.sum() == 5
    # trained items without any selected rating get noise, hence non-zero factors
    no_data = model.trained_mask & (ratings.item_counts() == 0)
    assert no_data.any() and np.all(np.linalg.norm(model.item_factors[no_data], axis=1) > 0)
    assert np.all(model.item_factors[~model.trained_mask] == 0)


def test_a_user_without_ratings_trains_and_folds_in_to_zero():
    users, items, values = _base_ratings(n_users=30, n_items=12)
    ids = np.arange(users.max() + 2)  # the last user id has no rating at all
    ratings = Ratings.from_arrays(users, items, values, user_ids=ids)
    assert ratings.user_counts()[-1] == 0
    model = train_dpals(ratings, DPALSConfig(rank=3, contribution_bound=4, noise_multiplier=1.0))
    from app.core.mf.foldin import fold_in_users, recommend

    assert np.all(fold_in_users(model, ratings)[-1] == 0)
    idx, _ = recommend(model, np.array([], dtype=int), np.array([]), 5)
    assert len(idx) == 5


def test_per_row_selection_matches_brute_force():
    rng = np.random.default_rng(0)
    rows = np.sort(rng.integers(0, 50, 2000))
    keys = rng.random(2000)
    kept = lowest_k_per_row(rows, keys, 7)
    for r in range(50):
        idx = np.flatnonzero(rows == r)
        assert set(np.flatnonzero(kept & (rows == r))) == set(idx[np.argsort(keys[idx])[:7]])


@pytest.mark.parametrize("gravity", [0.0, 0.3])
def test_cg_user_step_converges_to_the_exact_solves_and_warm_starts(gravity: float):
    users, items, values = _base_ratings()
    ratings = Ratings.from_arrays(users, items, values)
    exact_config = DPALSConfig(rank=4, contribution_bound=K, reg_gravity=gravity, user_cg_steps=0)
    rng = np.random.default_rng(3)
    prep = dpals.preprocess(ratings, exact_config, GaussianReleaser(None, KeyedRandomness(3)), KeyedRandomness(3))
    item_factors = rng.normal(size=(len(prep.frequent), 4))
    user_reg = user_regularisation(exact_config)
    exact = dpals._user_step(prep, item_factors, exact_config, user_reg)
    scale = np.abs(exact).max()
    # CG on an r-dimensional system is exact after r iterations (float32 products here)
    many = dpals._user_step(prep, item_factors, replace(exact_config, user_cg_steps=8), user_reg)
    assert np.allclose(many, exact, atol=1e-4 * scale)
    # started at the solution, one iteration stays there; from zeros, one does not get there
    one = replace(exact_config, user_cg_steps=1)
    assert np.allclose(dpals._user_step(prep, item_factors, one, user_reg, exact.astype(np.float32)), exact,
                       atol=1e-4 * scale)
    assert not np.allclose(dpals._user_step(prep, item_factors, one, user_reg), exact, atol=1e-2 * scale)


def test_per_row_selection_by_chunks_is_the_selection_in_one_pass():
    """Chunks of whole rows (sorted rows), keys drawn per chunk: the same mask as one global pass
    with one draw of all keys, rows longer than a chunk included."""
    from app.core.privacy import sampling

    rng = np.random.default_rng(1)
    rows = np.sort(np.concatenate([rng.integers(0, 300, 6000), np.full(700, 150)]))
    keys = np.random.default_rng(2).random(len(rows))
    reference = sampling._lowest_k_in_chunk(rows, keys, 5)
    assert np.array_equal(lowest_k_per_row(rows, keys, 5, chunk=64), reference)
    draw = np.random.default_rng(2)
    assert np.array_equal(lowest_k_per_row(rows, lambda start, stop: draw.random(stop - start), 5, chunk=64),
                          reference)
    shuffled = rng.permutation(len(rows))  # unsorted rows: one pass
    assert np.array_equal(lowest_k_per_row(rows[shuffled], keys[shuffled], 5, chunk=64), reference[shuffled])


def test_per_user_sample_by_chunks_draws_one_key_per_rating_in_csr_order():
    from app.core.privacy import sampling

    users, items, values = _base_ratings()
    data = Ratings.from_arrays(users, items, values)
    rows, _, _ = data.coo()
    reference = sampling._lowest_k_in_chunk(rows, np.random.default_rng(4).random(len(rows)), K)
    assert np.array_equal(per_user_sample(data, K, np.random.default_rng(4), chunk=7), reference)
    assert np.all(np.bincount(rows[reference]) <= K)
