"""Issue 27: the contribution bound from a DP quantile, and the user-level private mean.

Sensitivities are checked numerically on neighbouring data sets (one user added), the released k
and mean are checked to stay in their public ranges for any noise, and the run's event is checked
to be fixed before any data is read (only the noise scale follows the released k)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from dp_accounting import dp_event

from app.core.data.ratings import Ratings
from app.core.mf import dpals
from app.core.mf.dpals import (
    MEAN_INTERIOR,
    DPALSConfig,
    bound_statistic,
    calibrate,
    dpals_event,
    release_contribution_bound,
    train_dpals,
    user_mean_statistics,
)
from app.core.privacy import accounting
from app.core.privacy.keyed import KeyedRandomness
from app.core.privacy.quantiles import HISTOGRAM_SENSITIVITY, count_histogram, histogram_bins, histogram_quantile
from app.core.privacy.releaser import GaussianReleaser, audit_tap

LAW = {"bound_quantile": 0.5, "bound_scale": 2.0, "bound_min": 3, "contribution_bound": 40}


def _ratings(seed: int = 0, n_users: int = 80, n_items: int = 30) -> Ratings:
    rng = np.random.default_rng(seed)
    per_user = rng.integers(1, n_items, size=n_users)
    users = np.repeat(np.arange(n_users), per_user)
    items = np.concatenate([rng.choice(n_items, size=n, replace=False) for n in per_user])
    values = rng.integers(1, 6, size=len(users)).astype(float)
    return Ratings.from_indices(users, items, values, user_ids=np.array([f"u{i}" for i in range(n_users)]),
                                item_ids=np.arange(n_items))


def _with_user(ratings: Ratings, items: np.ndarray, values: np.ndarray) -> Ratings:
    """The neighbouring data set: ``ratings`` and one more user."""
    rows, cols, vals = ratings.coo()
    new = ratings.n_users
    return Ratings.from_indices(np.concatenate([rows, np.full(len(items), new)]), np.concatenate([cols, items]),
                                np.concatenate([vals, values]),
                                user_ids=np.concatenate([ratings.user_ids, ["extra"]]), item_ids=ratings.item_ids)


def _neighbours(n_items: int = 30) -> list[tuple[np.ndarray, np.ndarray]]:
    """Added users at the extremes: one rating, every item at the top, every item at the bottom."""
    every = np.arange(n_items)
    return [(np.array([0]), np.array([5.0])), (every, np.full(n_items, 5.0)), (every, np.full(n_items, 1.0)),
            (every, np.where(every % 2 == 0, 5.0, 1.0))]


# ------------------------------------------------------------------------------------ sensitivities
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_count_histogram_moves_by_at_most_its_sensitivity(seed: int):
    config = DPALSConfig(**LAW)
    base = _ratings(seed)
    before = bound_statistic(base.user_counts(), config)
    for items, values in _neighbours():
        after = bound_statistic(_with_user(base, items, values).user_counts(), config)
        change = after - before
        assert np.linalg.norm(change) == pytest.approx(HISTOGRAM_SENSITIVITY)  # exactly one bin, by one
        assert np.count_nonzero(change) == 1


def test_counts_past_the_top_share_the_last_bin():
    bins = histogram_bins(40)
    assert 2 ** (bins - 1) > 40 >= 2 ** (bins - 2)
    histogram = count_histogram(np.array([0, 1, 2, 3, 40, 10_000, 10**9]), bins)
    assert histogram.sum() == 6  # a user with no entries is in no bin
    assert histogram[-1] == 2 and histogram[0] == 1 and histogram[1] == 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_user_level_mean_moves_by_h_and_one_whatever_the_users_count(seed: int):
    config = DPALSConfig(rating_range=(1.0, 5.0))
    h = config.half_range
    base = _ratings(seed)
    total, count = user_mean_statistics(base, config.midpoint, h)
    worst = 0.0
    for items, values in _neighbours():
        t2, c2 = user_mean_statistics(_with_user(base, items, values), config.midpoint, h)
        assert c2 - count == 1
        worst = max(worst, abs(t2 - total))
        assert abs(t2 - total) <= h + 1e-12
    assert worst == pytest.approx(h)  # a user whose ratings are all at the top attains the bound


# ------------------------------------------------------------------------------------ the quantile
def test_the_quantile_of_a_noiseless_histogram_lies_in_the_true_quantiles_bin():
    counts = np.random.default_rng(3).lognormal(3.0, 1.0, size=5000).astype(int) + 1
    histogram = count_histogram(counts, histogram_bins(4096))
    for q in (0.25, 0.5, 0.75, 0.9):
        estimate, truth = histogram_quantile(histogram, q), float(np.quantile(counts, q))
        assert 2 ** math.floor(math.log2(truth)) <= estimate <= 2 ** (math.floor(math.log2(truth)) + 1)
    assert [histogram_quantile(histogram, q) for q in (0.1, 0.5, 0.9)] == sorted(
        histogram_quantile(histogram, q) for q in (0.1, 0.5, 0.9))
    assert math.isnan(histogram_quantile(np.array([-3.0, 1.0, 0.5]), 0.5))


@pytest.mark.parametrize("multiplier", [1e-3, 1.0, 1e3, 1e6])
def test_the_released_k_stays_in_the_public_range_for_any_noise(multiplier: float):
    config = replace(DPALSConfig(**LAW), noise_multiplier=multiplier)
    statistic = bound_statistic(_ratings(0).user_counts(), config)
    for seed in range(20):
        releaser = GaussianReleaser(None, KeyedRandomness(seed))
        k = release_contribution_bound(statistic, replace(config, seed=seed), releaser).contribution_bound
        assert isinstance(k, int) and config.bound_min <= k <= config.contribution_bound
        assert [name for name, _, _ in releaser.releases] == ["bound_histogram"]


def test_a_fixed_bound_releases_nothing_and_keeps_k():
    config = DPALSConfig(contribution_bound=17)
    releaser = GaussianReleaser(None, KeyedRandomness(0))
    assert release_contribution_bound(bound_statistic(np.array([3, 4]), config), config, releaser) is config
    assert releaser.releases == []


# ------------------------------------------------------------------------------------ the mean's bound
@pytest.mark.parametrize("n_users", [1, 3, 80])
def test_the_user_level_mean_stays_in_the_scales_interior(n_users: int):
    ratings = _ratings(0, n_users=n_users)
    lo, hi = 1.0, 5.0
    h = 0.5 * (hi - lo)
    for seed in range(10):
        config = DPALSConfig(mean_mode="dp_user", noise_multiplier=50.0, n_steps=1, rank=2, seed=seed)
        model = train_dpals(ratings, config)
        assert 3.0 - MEAN_INTERIOR * h <= model.global_mean <= 3.0 + MEAN_INTERIOR * h


def test_the_user_level_mean_estimates_the_mean_of_user_means_at_small_noise():
    ratings = _ratings(1)
    config = calibrate(1e4, 1e-6, DPALSConfig(mean_mode="dp_user", n_steps=1, rank=2))
    n = ratings.user_counts()
    rows = np.repeat(np.arange(ratings.n_users), n)
    truth = float(np.mean(np.bincount(rows, weights=ratings.csr.data) / n))
    assert train_dpals(ratings, config).global_mean == pytest.approx(truth, abs=0.01)


# ------------------------------------------------------------------------------------ the event
def test_the_event_is_fixed_before_any_read_and_the_noise_scale_follows_the_released_k():
    config = calibrate(2.0, 1e-6, DPALSConfig(**LAW, mean_mode="dp_user", n_steps=2, rank=3))
    shapes = []
    for seed in (0, 1):
        model = train_dpals(_ratings(seed), replace(config, seed=seed))
        assert model.event == dpals_event(config)  # the same event whatever the data and the k it set
        k = model.config["contribution_bound"]
        assert config.bound_min <= k <= config.contribution_bound
        releases = {r["name"]: r for r in model.metadata["releases"]}
        assert list(releases)[:3] == ["bound_histogram", "item_counts", "user_mean_sum"]
        assert releases["bound_histogram"]["l2_sensitivity"] == HISTOGRAM_SENSITIVITY
        assert releases["item_counts"]["l2_sensitivity"] == pytest.approx(math.sqrt(k))
        assert releases["user_mean_sum"]["l2_sensitivity"] == config.half_range
        assert releases["user_count"]["l2_sensitivity"] == 1.0
        multipliers = config.noise_multipliers()
        assert releases["bound_histogram"]["noise_multiplier"] == pytest.approx(multipliers["bound"])
        assert releases["item_counts"]["noise_multiplier"] == pytest.approx(multipliers["counts"])
        shapes.append(k)
    # the calibration is the same as a fixed k's with the histogram added, and costs the run a share
    fixed = calibrate(2.0, 1e-6, DPALSConfig(mean_mode="dp_user", n_steps=2, rank=3, contribution_bound=40))
    assert config.noise_multiplier > fixed.noise_multiplier


def test_ranking_runs_set_b_from_the_positives():
    ratings = _ratings(2, n_users=200)
    config = calibrate(50.0, 1e-6, DPALSConfig(objective="ranking", mean_mode="public", item_bias=False,
                                               user_centering=False, **LAW, rank=2, n_steps=1))
    model = train_dpals(ratings, config)
    positives = dpals.positives(ratings, config.threshold).user_counts()
    median = float(np.median(positives[positives > 0]))
    k = model.config["contribution_bound"]
    assert config.bound_min <= k <= config.contribution_bound
    assert k <= 2 * LAW["bound_scale"] * median + 1  # from the positives, not from every rating


@pytest.mark.parametrize("bad", [{"bound_quantile": 0.0}, {"bound_quantile": 1.0}, {"bound_quantile": 0.5, "bound_scale": 0.0},
                                 {"bound_quantile": 0.5, "bound_min": 50, "contribution_bound": 40},
                                 {"bound_noise_ratio": 0.0}, {"bound_min": 0}, {"mean_mode": "user"}])
def test_bad_bound_laws_are_refused(bad: dict):
    with pytest.raises(ValueError):
        DPALSConfig(**bad)


# ------------------------------------------------------------------------------------ rule 9: laws in the released B
def test_the_bound_laws_read_the_released_b_and_user_total():
    law = DPALSConfig(objective="ranking", mean_mode="public", item_bias=False, user_centering=False,
                      popularity_prior=1.0, prior_bound_floor=400.0, reg_user=0.2, ridge_bound_exponent=0.5,
                      ridge_bound_reference=60.0, ridge_bound_cap=0.5, contribution_bound=120)

    def applied(bound: int, users: float, **change) -> DPALSConfig:
        return dpals.apply_bound_laws(replace(law, contribution_bound=bound, **change), users)

    # the prior: γ + γ_B/B², larger for fewer positives a user; the knobs are consumed
    assert applied(10, 0.0).popularity_prior == pytest.approx(5.0)
    assert applied(5, 0.0).popularity_prior == pytest.approx(17.0)
    assert applied(20, 0.0).popularity_prior == pytest.approx(2.0)
    assert (applied(10, 0.0).prior_bound_floor, applied(10, 0.0).ridge_bound_exponent) == (0.0, 0.0)
    # the user ridge: grows with many users of few positives, up to the cap, never lowered
    assert applied(60, 1e5).reg_user == applied(90, 1e5).reg_user == 0.2  # B at or above B_ref: no change
    assert applied(13, 1000.0).reg_user == applied(13, 500.0).reg_user == 0.2  # few users: no change
    grown = 0.2 * 4.834 ** (0.5 * (math.sqrt(60 / 13) - 1.0))
    assert applied(13, 4834.0).reg_user == pytest.approx(grown) and 0.2 < grown < 0.5
    assert applied(22, 4834.0).reg_user < grown < applied(7, 4834.0).reg_user == 0.5  # capped
    assert applied(7, 4834.0, reg_user=0.8).reg_user == 0.8  # above the cap: left alone
    plain = DPALSConfig(objective="ranking", mean_mode="public", item_bias=False, user_centering=False)
    assert dpals.apply_bound_laws(plain, 1e6) is plain
    assert applied(13, 1e5, ridge_bound_reference=0.0).reg_user == 0.2  # any ridge knob at 0: no ridge law
    # extreme (admissible) knobs and totals reach the cap instead of overflowing a float
    assert applied(5, 1e300, ridge_bound_exponent=10.0, ridge_bound_reference=1e5).reg_user == 0.5
    assert applied(5, 1e300, ridge_bound_exponent=10.0, ridge_bound_reference=1e5, ridge_bound_cap=1e6).reg_user == 1e6
    assert applied(13, 4834.0, reg_user=0.0).reg_user == 0.0  # no ridge to grow


def test_rule_14_lowers_the_ridge_to_rule_7s_value_in_the_released_user_total():
    law = DPALSConfig(objective="ranking", mean_mode="public", item_bias=False, user_centering=False, reg_user=0.5,
                      ridge_users_scale=0.0625, **LAW)

    def ridge(users: float, noise: float = 1.0, **change) -> float:
        applied = dpals.apply_bound_laws(replace(law, **change), users, noise)
        assert applied.ridge_users_scale == 0.0  # consumed: the published config holds the ridge used
        return applied.reg_user

    assert ridge(4000.0) == pytest.approx(0.125)  # 0.0625·√4
    assert ridge(1e6) == 0.5  # never raised past the ridge given
    assert ridge(10.0, noise=1000.0) == ridge(3000.0) == pytest.approx(0.0625 * math.sqrt(3.0))  # floored at 3σ
    assert ridge(-50.0, noise=10.0) == pytest.approx(0.0625 * math.sqrt(0.03))
    assert ridge(4000.0, ridge_users_scale=0.0) == 0.5  # off
    # rule 9 raises from there, never lowers
    raised = ridge(4000.0, contribution_bound=13, ridge_bound_exponent=0.5, ridge_bound_reference=60.0,
                   ridge_bound_cap=0.5)
    assert raised == pytest.approx(min(0.5, 0.125 * 4.0 ** (0.5 * (math.sqrt(60 / 13) - 1.0))))
    with pytest.raises(ValueError, match="ridge_users_scale"):
        replace(law, bound_quantile=None)


def test_a_run_publishes_the_ridge_its_released_user_total_gave():
    ratings = _ratings(3, n_users=200)
    config = calibrate(20.0, 1e-6, DPALSConfig(objective="ranking", mean_mode="public", item_bias=False,
                                               user_centering=False, **LAW, rank=2, n_steps=1, reg_user=0.5,
                                               ridge_users_scale=0.2))
    with audit_tap() as tap:
        model = train_dpals(ratings, config)
    (histogram,) = tap.outputs["bound_histogram"]
    noise = config.noise_multipliers()["bound"] * math.sqrt(len(histogram))
    expected = min(0.5, 0.2 * math.sqrt(max(float(np.sum(histogram)), 3.0 * noise) / 1000.0))
    assert model.config["reg_user"] == pytest.approx(expected) and expected < 0.5
    assert model.config["ridge_users_scale"] == 0.0
    plain = train_dpals(ratings, replace(config, ridge_users_scale=0.0))
    assert model.event == plain.event and model.metadata["releases"] == plain.metadata["releases"]


def test_a_run_publishes_the_prior_it_scored_with_and_the_laws_add_no_release():
    ratings = _ratings(3, n_users=200)
    config = calibrate(5.0, 1e-6, DPALSConfig(objective="ranking", mean_mode="public", item_bias=False,
                                              user_centering=False, **LAW, rank=2, n_steps=1,
                                              popularity_prior=0.5))
    lawful = replace(config, prior_bound_floor=300.0, ridge_bound_exponent=0.5, ridge_bound_reference=40.0,
                     ridge_bound_cap=1.0)
    model, plain = train_dpals(ratings, lawful), train_dpals(ratings, config)
    k = model.config["contribution_bound"]
    assert k == plain.config["contribution_bound"]  # the same release, the same B
    assert model.config["popularity_prior"] == pytest.approx(0.5 + 300.0 / k**2)
    assert model.config["prior_bound_floor"] == 0.0 and model.config["reg_user"] == config.reg_user  # 200 users
    published = DPALSConfig.from_dict({**model.config, "seed": 0})
    assert np.allclose(model.item_biases, dpals.popularity_prior(model.item_counts, published))
    assert model.event == plain.event == dpals_event(lawful)
    assert model.metadata["releases"] == plain.metadata["releases"]


# ------------------------------------------------------------------------------------ rule 10: steps from the released B
def test_the_step_law_takes_fewer_steps_only_at_small_b_and_keeps_the_gaussian_composition():
    law = DPALSConfig(n_steps=4, average_last=2, few_steps_bound=10, few_steps=1, contribution_bound=10,
                      noise_multiplier=3.0, reg_gravity=0.5, bound_quantile=0.5, bound_min=2)
    fewer = dpals.apply_step_law(law)
    assert (fewer.n_steps, fewer.average_last, fewer.few_steps_bound) == (1, 1, 0)
    # Σ 1/z² after the bound: counts and recounts (z·2 each), mean sum and count (z·2), biases (z·2), and per
    # step gravity (z·2), Grams (z·1), linear terms (z): 5/4 + T·9/4 (over z²); one step keeps it at s² = 14/41
    scale = math.sqrt((5 / 4 + 9 / 4) / (5 / 4 + 4 * 9 / 4))
    assert fewer.later_noise_scale == pytest.approx(scale)
    kept = dpals.apply_step_law(replace(law, contribution_bound=11))  # B past the law's bound: T steps
    assert (kept.n_steps, kept.later_noise_scale, kept.few_steps_bound) == (4, 1.0, 0)
    assert dpals.apply_step_law(replace(law, few_steps=4)).n_steps == 4  # not fewer: nothing changes
    # the bound histogram (released before the law) keeps its multiplier; every later release's shrinks by s
    before, after = law.noise_multipliers(), fewer.noise_multipliers()
    assert after["bound"] == before["bound"]
    for name in ("counts", "mean", "bias", "gravity", "gram", "linear"):
        assert after[name] == pytest.approx(scale * before[name])
    reserved, executed = dpals_event(law), dpals_event(fewer)
    assert reserved != executed and accounting.same_gaussian_composition(reserved, executed)
    # one mechanism: the same RDP curve and the same privacy loss distribution
    assert np.allclose(accounting.rdp_curve(executed), accounting.rdp_curve(reserved), rtol=1e-12)
    assert accounting.epsilon_pld(executed, 1e-6) == pytest.approx(accounting.epsilon_pld(reserved, 1e-6), rel=1e-3)
    # a scale that is not √(T'/T) is another mechanism
    assert not accounting.same_gaussian_composition(reserved, dpals_event(replace(fewer, later_noise_scale=0.6)))


def test_gaussian_precision_counts_every_release_and_refuses_other_mechanisms():
    event = accounting.compose([accounting.gaussian(2.0), dp_event.SelfComposedDpEvent(accounting.gaussian(0.5), 3)])
    assert accounting.gaussian_precision(event) == pytest.approx(0.25 + 3 * 4.0)
    mixed = accounting.compose([accounting.gaussian(2.0), accounting.pure_dp(1.0)])
    assert accounting.gaussian_precision(mixed) is None
    assert not accounting.same_gaussian_composition(mixed, mixed)


@pytest.mark.parametrize("bound", [40, 3])  # the law always on (B ≤ 40), and on only at B = bound_min
def test_a_run_under_the_step_law_is_charged_the_reserved_event(bound: int):
    ratings = _ratings(4, n_users=200)
    config = calibrate(2.0, 1e-6, DPALSConfig(objective="ranking", mean_mode="public", item_bias=False,
                                              user_centering=False, **LAW, rank=2, n_steps=3, average_last=2,
                                              reg_gravity=0.3, few_steps_bound=bound, few_steps=1))
    model = train_dpals(ratings, config)
    k = model.config["contribution_bound"]
    steps = 1 if k <= bound else 3
    assert model.event == dpals_event(config)  # what was reserved, whichever branch ran
    assert model.config["n_steps"] == steps and model.config["few_steps_bound"] == 0
    assert model.config["average_last"] == min(2, steps)
    releases = model.metadata["releases"]
    assert sum(r["name"] == "item_grams" for r in releases) == steps
    scale = model.config["later_noise_scale"]
    assert (scale < 1.0) if steps == 1 else (scale == 1.0)
    for name, kind in (("item_grams", "gram"), ("item_counts", "counts"), ("bound_histogram", "bound")):
        release = next(r for r in releases if r["name"] == name)
        expected = config.noise_multipliers()[kind] * (1.0 if kind == "bound" else scale)
        assert release["noise_multiplier"] == pytest.approx(expected)


def test_releases_that_are_not_the_reserved_mechanism_fail_the_run():
    config = DPALSConfig(n_steps=2, noise_multiplier=2.0, few_steps_bound=40, few_steps=1, contribution_bound=40)
    assert dpals.apply_step_law(config).n_steps == 1
    executed = dpals.apply_step_law(config)

    def releases(scale: float) -> GaussianReleaser:
        releaser = GaussianReleaser(None, KeyedRandomness(0))
        for name in ("item_counts", "user_mean_sum", "user_count", "item_bias_sums", "item_recounts"):
            releaser.record(name, 1.0, 4.0 * scale)
        releaser.record("item_grams", 1.0, 2.0 * scale)
        releaser.record("item_linear", 1.0, 2.0 * scale)
        return releaser

    # Σ 1/z² = 5/16 + 2·2/4 reserved; 5/16 + 2/4 over s² in one step
    scale = math.sqrt((5 / 16 + 2 / 4) / (5 / 16 + 4 / 4))
    assert executed.later_noise_scale == pytest.approx(scale)
    assert dpals.checked_event(releases(scale), config, executed) == dpals_event(config)
    # one step at the reserved multipliers: less noise than the reserved two steps
    with pytest.raises(RuntimeError):
        dpals.checked_event(releases(1.0), config, replace(executed, later_noise_scale=1.0))
    with pytest.raises(RuntimeError):  # releases that are not the executed config's
        dpals.checked_event(releases(1.0), config, executed)


def test_the_trained_set_takes_every_item_whose_released_count_beats_its_gram_noise():
    counts = np.array([3.0, 90.0, 40.0, 12.0, 41.0, 7.0])
    assert dpals.frequent_items(counts, 0.2).tolist() == [1, 4]  # ⌈0.2·6⌉ = 2 largest
    assert dpals.frequent_items(counts, 0.2, 12.0).tolist() == [1, 2, 3, 4]  # and every count ≥ the floor
    assert dpals.frequent_items(counts, 0.5, 100.0).tolist() == [1, 2, 4]  # a high floor adds nothing
    config = DPALSConfig(rank=4, contribution_bound=9, noise_multiplier=2.0, gram_noise_ratio=1.5, frequent_snr=0.5)
    assert dpals.count_floor(config) == pytest.approx(0.5 * 4 * 3 * 3.0)  # snr·rank·√B·z_gram
    assert dpals.count_floor(replace(config, frequent_snr=0.0)) == math.inf
    # or every count that clears frequent_count_sigmas of the count release's noise std (√B·z·count ratio), if lower
    sigma = 3 * 2.0 * config.count_noise_ratio
    assert dpals.count_noise_std(config) == pytest.approx(sigma)
    assert dpals.count_floor(replace(config, frequent_count_sigmas=1.0)) == pytest.approx(sigma)
    assert dpals.count_floor(replace(config, frequent_count_sigmas=10.0)) == pytest.approx(18.0)  # the SNR floor
    assert dpals.count_floor(replace(config, frequent_snr=0.0, frequent_count_sigmas=3.0)) == pytest.approx(3 * sigma)


def test_a_run_with_the_count_floor_trains_more_items_for_the_same_releases():
    ratings = _ratings(5, n_users=400)
    config = calibrate(20.0, 1e-6, DPALSConfig(objective="ranking", mean_mode="public", item_bias=False,
                                               user_centering=False, **LAW, rank=2, n_steps=2,
                                               frequent_fraction=0.1))
    plain, floored = train_dpals(ratings, config), train_dpals(ratings, replace(config, frequent_snr=0.05))
    assert plain.event == floored.event == dpals_event(config)  # post-processing: nothing added to the event
    published = DPALSConfig.from_dict({**floored.config, "seed": 0})
    expected = dpals.frequent_items(floored.item_counts, published.frequent_fraction, dpals.count_floor(published))
    assert np.flatnonzero(floored.trained_mask).tolist() == expected.tolist()
    assert floored.trained_mask.sum() > plain.trained_mask.sum() == math.ceil(0.1 * ratings.n_items)


def test_items_the_model_in_force_trained_stay_trained_above_the_kept_floor():
    counts = np.array([3.0, 90.0, 40.0, 12.0, 41.0, 7.0])
    kept = np.array([True, False, False, True, False, True])
    assert dpals.frequent_items(counts, 0.2, kept=kept).tolist() == [1, 4]  # no floor for them: nothing kept
    assert dpals.frequent_items(counts, 0.2, kept=kept, kept_at=7.0).tolist() == [1, 3, 4, 5]  # 3 is below 7
    assert dpals.frequent_items(counts, 0.2, 40.0, kept, 7.0).tolist() == [1, 2, 3, 4, 5]
    config = DPALSConfig(rank=4, contribution_bound=9, noise_multiplier=2.0)
    assert dpals.kept_floor(config) == math.inf
    assert dpals.kept_floor(replace(config, keep_trained_sigmas=2.0)) == pytest.approx(2 * dpals.count_noise_std(config))
    assert dpals.kept_mask(np.array(["a", "b", "c"]), np.array(["c", "gone", "a"])).tolist() == [True, False, True]
    assert dpals.kept_mask(np.array(["a"]), None) is None


def test_a_run_keeps_the_given_items_above_the_floor_with_the_same_releases():
    """The kept items are post-processing of this run's count release and a published model: the
    event and every release are the run's without them; only the trained set grows."""
    ratings = _ratings(5, n_users=400)
    config = calibrate(20.0, 1e-6, DPALSConfig(objective="ranking", mean_mode="public", item_bias=False,
                                               user_centering=False, **LAW, rank=2, n_steps=2,
                                               frequent_fraction=0.1, keep_trained_sigmas=1.0))
    plain = train_dpals(ratings, config)
    kept_items = ratings.item_ids[~plain.trained_mask][::2]  # items the fraction leaves out
    keeping = train_dpals(ratings, config, kept_items=kept_items)
    assert keeping.event == plain.event == dpals_event(config)
    np.testing.assert_array_equal(keeping.item_counts, plain.item_counts)  # the same count release
    published = DPALSConfig.from_dict({**keeping.config, "seed": 0})
    kept = dpals.kept_mask(ratings.item_ids, kept_items)
    expected = dpals.frequent_items(keeping.item_counts, published.frequent_fraction, dpals.count_floor(published),
                                    kept, dpals.kept_floor(published))
    assert np.flatnonzero(keeping.trained_mask).tolist() == expected.tolist()
    assert keeping.trained_mask.sum() > plain.trained_mask.sum()  # some kept item cleared the floor


def test_secondary_items_are_those_a_floor_alone_trains_and_their_shares_follow_their_snr():
    """Rule 12: trained, but neither among the ⌈fraction·n⌉ largest released counts nor above the SNR
    floor; each takes s_j = min(1, c̃_j / (rank·√B·z_gram)), the rest 1."""
    counts = np.array([3.0, 90.0, 40.0, 12.0, 41.0, 7.0])
    config = DPALSConfig(rank=4, contribution_bound=9, noise_multiplier=2.0, frequent_fraction=0.2,
                         secondary_by_snr=True)
    unit = dpals.gram_snr_count(config)
    assert unit == pytest.approx(4 * 3 * config.noise_multipliers()["gram"])
    frequent = dpals.frequent_items(counts, 0.2, 10.0)  # the two largest, then the floor's 2 and 3
    assert frequent.tolist() == [1, 2, 3, 4]
    assert dpals.secondary_items(counts, frequent, config).tolist() == [False, True, True, False]
    np.testing.assert_allclose(dpals.secondary_shares(counts, frequent, config),
                               [1.0, min(1.0, 40.0 / unit), min(1.0, 12.0 / unit), 1.0])
    snr_at_40 = replace(config, frequent_snr=40.0 / unit)
    assert dpals.snr_floor(snr_at_40) == pytest.approx(40.0)
    assert dpals.secondary_items(counts, frequent, snr_at_40).tolist() == [False, False, True, False]
    assert dpals.secondary_items(counts, np.array([1, 4]), config) is None  # none trained by a floor alone
    assert dpals.secondary_shares(counts, np.array([1, 4]), config) is None
    assert dpals.secondary_items(counts, frequent, replace(config, secondary_by_snr=False)) is None  # off
    with pytest.raises(ValueError, match="secondary_by_snr"):
        replace(config, secondary_by_snr=1)


def test_secondary_items_take_their_share_of_the_weights_and_of_the_user_solves():
    """Rule 12 is post-processing of the count release: the same event, count release and trained set;
    the secondary items' total re-count statistic shrinks and the core's grows (their shares of each
    user's weights), and each user's solve reads a secondary item's factor as s_j·v_j."""
    ratings = _ratings(5, n_users=400)
    config = calibrate(1.0, 1e-6, DPALSConfig(objective="ranking", mean_mode="public", item_bias=False,
                                               user_centering=False, rank=2, n_steps=2, contribution_bound=40,
                                               frequent_fraction=0.1, frequent_count_sigmas=1e-9, frequent_snr=1.0))
    shared = replace(config, secondary_by_snr=True)
    plain, model = train_dpals(ratings, config), train_dpals(ratings, shared)
    assert model.event == plain.event == dpals_event(config)
    np.testing.assert_array_equal(model.item_counts, plain.item_counts)
    np.testing.assert_array_equal(model.trained_mask, plain.trained_mask)
    keyed = KeyedRandomness(3)
    preps = {on: dpals.preprocess(ratings, replace(config, secondary_by_snr=on), GaussianReleaser(None, keyed), keyed)
             for on in (False, True)}
    prep = preps[True]
    shares = dpals.secondary_shares(prep.item_counts, prep.frequent, shared)
    secondary = dpals.secondary_items(prep.item_counts, prep.frequent, shared)
    assert shares is not None and secondary is not None and 0 < secondary.sum() < len(secondary)
    assert np.all(shares[secondary] < 1) and np.all(shares[~secondary] == 1)
    bounded = {on: dpals.bound_contributions(ratings, replace(config, secondary_by_snr=on),
                                             dpals.PublicState(p.global_mean, p.item_counts, p.frequent, p.item_biases),
                                             keyed) for on, p in preps.items()}
    less, more = bounded[True].recount_statistic, bounded[False].recount_statistic
    assert less[secondary].sum() < more[secondary].sum() and less[~secondary].sum() > more[~secondary].sum()
    factors = np.random.default_rng(0).normal(size=(len(prep.frequent), shared.rank))
    reg = dpals.user_regularisation(shared)
    np.testing.assert_array_equal(dpals._user_step(prep, factors, shared, reg),
                                  dpals._user_step(prep, factors * shares[:, None], config, reg))
    assert not np.array_equal(dpals._user_step(prep, factors, shared, reg), dpals._user_step(prep, factors, config, reg))
