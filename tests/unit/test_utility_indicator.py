"""The utility indicator at publish time (post-processing of released counts): its count noise
std is the std the release actually draws, its verdict follows the released counts, and on a
seeded data set it calls a small-ε model noise-dominated and a large-ε one not."""

from __future__ import annotations

import numpy as np
import pytest

from app.core.algorithms import DatasetFacts, get_algorithm
from app.core.data.synthetic import production_synthetic
from app.core.mf import dpals, dpfw
from app.core.privacy.releaser import audit_tap
from app.core.utility import NOISE_DOMINATED_BELOW, NOISE_MARGIN, CountRelease, utility_indicator


def _ratings(seed: int = 0):
    return production_synthetic(n_users=3_000, n_items=1_500, n_ratings=90_000, seed=seed).ratings


def _released_noise(train, noise_off_name: str) -> np.ndarray:
    """The count release's noise: the same run with and without it (same seed, same sample)."""
    with audit_tap() as noisy:
        train()
    with audit_tap(noise_off_name) as clean:
        train()
    return noisy.outputs[noise_off_name][0] - clean.outputs[noise_off_name][0]


def test_dpals_count_noise_std_is_the_std_the_release_draws() -> None:
    ratings = _ratings()
    config = dpals.calibrate(1.0, 1e-6, dpals.DPALSConfig(rank=4, n_steps=1, seed=7, rating_range=(1.0, 5.0)))
    noise = _released_noise(lambda: dpals.train_dpals(ratings, config), "item_counts")
    want = dpals.count_noise_std(config)
    assert want == pytest.approx(np.sqrt(config.contribution_bound) * config.noise_multipliers()["counts"])
    assert np.std(noise) == pytest.approx(want, rel=0.08)  # 1,500 draws: ~2 % standard error


def test_dpfw_count_noise_std_is_the_std_the_release_draws() -> None:
    ratings = _ratings(1)
    config = dpfw.calibrate(1.0, 1e-6, dpfw.DPFWConfig(n_steps=2, seed=3, eigen_method="oja"), ratings.n_items)
    noise = _released_noise(lambda: dpfw.train_dpfw(ratings, config), "item_counts")
    assert np.std(noise) == pytest.approx(dpfw.count_noise_std(config), rel=0.08)


def test_indicator_counts_the_considered_items_whose_count_clears_the_margin() -> None:
    counts = np.array([1.0, 30.0, 31.0, 100.0, 500.0, 2.0])
    considered = np.array([True, True, True, True, False, False])
    got = utility_indicator(CountRelease(counts=counts, noise_std=10.0, considered=considered))
    assert NOISE_MARGIN == 3.0
    assert (got.considered_items, got.clearing_items) == (4, 2)  # 31 and 100 clear 30; 500 not considered
    assert got.clearing_share == 0.5 and not got.noise_dominated
    assert got.to_dict()["message"] is None


def test_indicator_is_noise_dominated_below_the_threshold_and_says_what_to_do() -> None:
    counts = np.r_[np.full(9, 100.0), np.full(91, 5.0)]  # 9 % clear
    got = utility_indicator(CountRelease(counts=counts, noise_std=10.0, considered=np.ones(100, dtype=bool)))
    assert got.clearing_share < NOISE_DOMINATED_BELOW and got.noise_dominated
    assert "ranks like popularity" in got.to_dict()["message"]
    none = utility_indicator(CountRelease(counts=counts, noise_std=1.0, considered=np.zeros(100, dtype=bool)))
    assert none.noise_dominated and none.clearing_share == 0.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_indicator_refuses_a_meaningless_noise_std(bad: float) -> None:
    with pytest.raises(ValueError):
        utility_indicator(CountRelease(counts=np.ones(3), noise_std=bad, considered=np.ones(3, dtype=bool)))


@pytest.mark.parametrize(("epsilon", "dominated"), [(0.2, True), (20.0, False)])
def test_default_model_on_a_seeded_data_set_is_noise_dominated_only_at_small_epsilon(epsilon: float,
                                                                                  dominated: bool) -> None:
    ratings = _ratings(2)
    algo = get_algorithm("dpals")
    facts_params = algo.default_hyperparameters(objective="rating", epsilon=epsilon, delta=1e-6,
                                                facts=_facts(ratings.n_items))
    assert facts_params is not None
    config = algo.calibrate(epsilon, 1e-6, algo.config_from_params({**facts_params, "seed": 11}, (1.0, 5.0)),
                            ratings.n_items)
    model = algo.train(ratings, config)
    release = algo.count_release(model)
    assert release is not None
    assert utility_indicator(release).noise_dominated is dominated


def _facts(n_items: int) -> DatasetFacts:
    return DatasetFacts(name="seeded", kind="ratings", rating_range=(1.0, 5.0), n_items=n_items, max_users=10_000)


def test_the_floors_items_are_not_counted_in_the_share() -> None:
    """Rules 10 and 11 train items because their released counts clear the noise: the indicator
    considers the trained items the frequent fraction or the SNR floor chose, so the share reads
    the noise, not the trained set."""
    ratings = production_synthetic(n_users=6_000, n_items=1_500, n_ratings=300_000, seed=3).ratings
    algo = get_algorithm("dpals")
    params = algo.default_hyperparameters(objective="ranking", epsilon=1.0, delta=1e-6, facts=_facts(ratings.n_items))
    assert params is not None and params["frequent_count_sigmas"] > 0
    config = algo.calibrate(1.0, 1e-6, algo.config_from_params({**params, "seed": 5}, (1.0, 5.0)), ratings.n_items)
    model = algo.train(ratings, config)
    release = algo.count_release(model)
    assert release is not None
    published = dpals.DPALSConfig.from_dict({**model.config, "seed": 0})
    core = dpals.core_items(model.item_counts, published)
    np.testing.assert_array_equal(release.considered, model.trained_mask & core)
    assert release.considered.sum() < model.trained_mask.sum()  # the σ floor trained more
    without_floor = algo.train(ratings, algo.calibrate(1.0, 1e-6, algo.config_from_params(
        {**params, "frequent_count_sigmas": 0.0, "seed": 5}, (1.0, 5.0)), ratings.n_items))
    np.testing.assert_array_equal(release.considered, without_floor.trained_mask)  # what the floor-free run trains
