"""Issue 27, defaults rule 13: the item biases' prior std follows the released user count.

τ_b = min(Γ_b, τ·(Ñ/1000)^{1/4}) is post-processing of the user-level mean's released count: the
run's event and every release stay as they are; only the shrinkage of the released bias sums moves."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.core.data.ratings import Ratings
from app.core.mf.dpals import DPALSConfig, calibrate, dpals_event, item_bias_prior, shrink_item_biases, train_dpals
from app.core.privacy.releaser import audit_tap

BY_USERS = {"mean_mode": "dp_user", "item_bias_prior_by_users": True, "item_bias_prior_std": 0.2, "clip_bias": 1.0}


def _ratings(n_users: int, n_items: int = 40, seed: int = 0) -> Ratings:
    """Users rating 5–15 items each, with item offsets of std 0.5 around 3.5."""
    rng = np.random.default_rng(seed)
    offsets = rng.normal(0.0, 0.5, n_items)
    per_user = rng.integers(5, 16, n_users)
    users = np.repeat(np.arange(n_users), per_user)
    items = np.concatenate([rng.choice(n_items, n, replace=False) for n in per_user])
    values = np.clip(np.round(3.5 + offsets[items] + rng.normal(0.0, 0.8, len(items))), 1, 5)
    return Ratings.from_indices(users, items, values, user_ids=[f"u{i}" for i in range(n_users)],
                                item_ids=[f"i{j}" for j in range(n_items)])


def test_the_prior_grows_as_the_fourth_root_of_the_released_users_and_stops_at_the_clip():
    config = DPALSConfig(**BY_USERS, noise_multiplier=1e-3)
    assert item_bias_prior(config, 1000.0) == pytest.approx(0.2)
    assert item_bias_prior(config, 16_000.0) == pytest.approx(0.4)  # 16× the users: twice the prior std
    assert item_bias_prior(config, 1e12) == config.clip_bias  # never wider than a bias can be
    assert item_bias_prior(replace(config, item_bias_prior_by_users=False), 16_000.0) == 0.2  # off: as given


def test_a_noisy_count_below_three_noise_stds_is_read_at_that_floor():
    config = DPALSConfig(**BY_USERS, noise_multiplier=10.0)
    floor = 3.0 * config.noise_multipliers()["mean"]
    assert item_bias_prior(config, -500.0) == item_bias_prior(config, 0.0) == item_bias_prior(config, floor)
    assert item_bias_prior(config, floor) == pytest.approx(0.2 * (floor / 1000.0) ** 0.25)


def test_the_law_needs_the_user_level_means_count():
    with pytest.raises(ValueError, match="item_bias_prior_by_users"):
        DPALSConfig(**{**BY_USERS, "mean_mode": "dp"})
    with pytest.raises(ValueError, match="item_bias_prior_by_users"):
        DPALSConfig(**{**BY_USERS, "item_bias_prior_by_users": 1})
    DPALSConfig(**{**BY_USERS, "mean_mode": "public", "item_bias": False})  # no biases: nothing to read
    with pytest.raises(ValueError, match="user count"):
        item_bias_prior(DPALSConfig(**BY_USERS), None)


def test_the_shrinkage_reads_the_prior_it_is_given():
    config = DPALSConfig(item_bias_prior_std=0.5, item_bias_shrinkage=0.0)
    sums, counts = np.array([40.0]), np.array([100.0])
    # b̃ = S̃ / (c̃ + σ²/(c̃ τ²)): σ = 20, τ = 0.5 → 40 / (100 + 16); τ = 0.25 → 40 / (100 + 64)
    assert shrink_item_biases(sums, counts, 20.0, config)[0] == pytest.approx(40.0 / 116.0)
    assert shrink_item_biases(sums, counts, 20.0, config, 0.25)[0] == pytest.approx(40.0 / 164.0)


@pytest.mark.parametrize("n_users", [60, 960])
def test_a_run_shrinks_its_released_sums_with_the_prior_of_its_released_count(n_users: int):
    """Same keyed noise: the run with the law equals the run with the fixed prior its released count gives."""
    ratings = _ratings(n_users)
    config = calibrate(1.0, 1e-6, DPALSConfig(**BY_USERS, rank=2, n_steps=1, contribution_bound=15))
    with audit_tap() as tap:
        with_law = train_dpals(ratings, config)
    (released_users,) = tap.outputs["user_count"]
    tau = item_bias_prior(config, float(released_users))
    assert 0.0 < tau < config.clip_bias
    fixed = replace(config, item_bias_prior_by_users=False, item_bias_prior_std=tau)
    with_fixed = train_dpals(ratings, fixed)
    assert with_law.event == with_fixed.event == dpals_event(config)  # the same releases, the same event
    np.testing.assert_array_equal(with_law.item_biases, with_fixed.item_biases)
    # the published config holds the prior used, the law consumed: the two runs publish the same config
    assert (with_law.config["item_bias_prior_std"], with_law.config["item_bias_prior_by_users"]) == (tau, False)
    assert with_law.config == with_fixed.config
    other = train_dpals(ratings, replace(fixed, item_bias_prior_std=tau / 2))
    assert not np.array_equal(other.item_biases, with_law.item_biases)  # the prior does move the biases
