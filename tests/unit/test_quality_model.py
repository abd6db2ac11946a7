"""The model refines a baseline: item biases, noise-aware shrinkage, the ranking objective's
popularity prior, and ε-aware defaults that are a pure function of public inputs."""

from __future__ import annotations

import inspect
import math
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from app.core.algorithms import get_algorithm, resolve_hyperparameters
from app.core.data.ratings import Ratings
from app.core.data.splits import heldout_users_split
from app.core.eval.metrics import ranking_metrics
from app.core.mf import defaults
from app.core.mf.dpals import DPALSConfig, calibrate, train_dpals, wiener_filter
from app.core.mf.foldin import fold_in_users, user_scores
from app.core.mf.model import PublicModel


def _popular_taste_data(seed: int = 0, n_users: int = 1500, n_items: int = 200) -> Ratings:
    """Zipf popularity plus a weak two-group taste: popularity is a strong free baseline."""
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, n_items + 1) ** 0.9
    group_items = rng.integers(0, 2, n_items)
    users, items, values = [], [], []
    for u in range(n_users):
        g = u % 2
        p = popularity * np.where(group_items == g, 1.5, 1.0)
        chosen = rng.choice(n_items, size=20, replace=False, p=p / p.sum())
        users += [u] * 20
        items += chosen.tolist()
        values += np.where(group_items[chosen] == g, 5.0, rng.integers(1, 6, 20)).tolist()
    return Ratings.from_arrays(users, items, np.asarray(values, float), item_ids=np.arange(n_items))


def _factor_scores(model: PublicModel, users: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return model.item_biases + users[rows] @ model.item_factors.T


def _popularity_scores(counts: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return np.tile(counts, (len(rows), 1))


@pytest.mark.parametrize("epsilon", [0.3, 1.0])
def test_ranking_at_small_epsilon_is_not_below_dp_popularity(epsilon: float):
    data = _popular_taste_data()
    split = heldout_users_split(data, 200, 200, seed=1)
    params, used = resolve_hyperparameters("dpals", {}, objective="ranking", epsilon=epsilon, delta=1e-6,
                                           rating_range=(0.0, 1.0), n_items=split.train.n_items)
    assert used
    algorithm = get_algorithm("dpals")
    recalls, popular = [], []
    for seed in range(3):
        config = algorithm.config_from_params({**params, "positive_threshold": 1.0, "seed": seed}, (0.0, 1.0))
        model = train_dpals(split.train, calibrate(epsilon, 1e-6, config))
        users = fold_in_users(model, split.test.query)
        scores = partial(_factor_scores, model, users)
        recalls.append(ranking_metrics(scores, split.test.target, split.test.query, 20)["recall@20"])
        counts = np.log(model.item_counts)
        popular.append(ranking_metrics(partial(_popularity_scores, counts), split.test.target,
                                       split.test.query, 20)["recall@20"])
    assert np.mean(recalls) >= np.mean(popular) - np.std(popular) - 1e-9


def test_predicted_ratings_stay_on_the_scale_without_clipping():
    data = _popular_taste_data(n_users=800)
    params, _ = resolve_hyperparameters("dpals", {}, objective=None, epsilon=1.0, delta=1e-6,
                                        rating_range=(1.0, 5.0), n_items=data.n_items)
    algorithm = get_algorithm("dpals")
    model = train_dpals(data, calibrate(1.0, 1e-6, algorithm.config_from_params({**params, "seed": 3}, (1.0, 5.0))))
    worst = []
    for u in range(0, data.n_users, 37):
        items, values = data.user_row(u)
        worst.append(np.abs(user_scores(model, items, values) - 3.0).max())
    assert max(worst) < 2.0 + 0.5  # unclipped predictions stay within half a star of the 1-5 scale


def test_wiener_filter_fades_noise_dominated_directions():
    eigval = np.array([[0.0, 0.1, 1.0, 100.0]])
    eigvec = np.eye(4)[None]
    rhs = np.ones((1, 4))
    attenuated, filtered = wiener_filter(eigval, eigvec, rhs, kappa=1.0)
    assert attenuated[0, 0] == 0 and filtered[0, 0] == 0  # no Gram mass: pure noise, dropped
    assert np.all(np.diff(filtered[0]) > 0)
    assert filtered[0, -1] == pytest.approx(100 / 101)  # well measured: nearly untouched
    same, unchanged = wiener_filter(eigval, eigvec, rhs, kappa=0.0)
    assert np.allclose(unchanged[0, 1:], 1.0)


def test_defaults_are_a_pure_function_of_public_inputs():
    signature = inspect.signature(defaults.default_hyperparameters)
    assert set(signature.parameters) == {"objective", "epsilon", "delta", "rating_range", "n_items", "max_users"}
    args = dict(objective="rating", epsilon=1.0, delta=1e-6, rating_range=(1.0, 5.0), n_items=3000)
    assert defaults.default_hyperparameters(**args) == defaults.default_hyperparameters(**args)
    # every default builds a valid config on both objectives and at every epsilon
    for objective in ("rating", "ranking"):
        for eps in (0.1, 0.5, 1, 2, 5, 10, 20, 50):
            params = defaults.default_hyperparameters(**{**args, "objective": objective, "epsilon": eps})
            DPALSConfig.from_dict({**params, "rating_range": (1.0, 5.0)})
    # clipping follows the scale: a 1-10 scale is the 1-5 rule stretched
    wide = defaults.default_hyperparameters(**{**args, "rating_range": (1.0, 10.0)})
    narrow = defaults.default_hyperparameters(**args)
    assert wide["clip_rating"] / narrow["clip_rating"] == pytest.approx(9 / 4)
    with pytest.raises(ValueError):
        defaults.default_hyperparameters(**{**args, "objective": "popularity"})


def test_given_hyperparameters_are_used_as_they_are():
    params, used = resolve_hyperparameters("dpals", {"rank": 3}, objective=None, epsilon=1.0, delta=1e-6,
                                           rating_range=(1.0, 5.0), n_items=10)
    assert params == {"rank": 3} and not used
    with pytest.raises(ValueError):
        resolve_hyperparameters("dpfw", {}, objective="ranking", epsilon=1.0, delta=1e-6,
                                rating_range=(1.0, 5.0), n_items=10)
    params, used = resolve_hyperparameters("onebit", {}, objective=None, epsilon=1.0, delta=1e-6,
                                           rating_range=(1.0, 5.0), n_items=10)
    assert params == {} and not used


def test_ranking_objective_trains_on_positives_only():
    data = _popular_taste_data(n_users=300)
    params, _ = resolve_hyperparameters("dpals", {}, objective="ranking", epsilon=5.0, delta=1e-6,
                                        rating_range=(1.0, 5.0), n_items=data.n_items)
    config = get_algorithm("dpals").config_from_params({**params, "seed": 0}, (1.0, 5.0))
    assert config.threshold == 4.0
    low = data.select(data.coo()[2] < 4.0)  # only ratings below the threshold: no positive at all
    model = train_dpals(low, calibrate(5.0, 1e-6, replace(config, frequent_fraction=1.0)))
    # no signal survives the filter: the factors carry (almost) nothing next to the prior
    assert np.abs(model.item_factors).max() < 0.5 * np.abs(model.item_biases).max() + 1e-12


def test_ranking_rule_laws_follow_epsilon_and_catalogue_size():
    def rule(eps: float, n_items: int) -> dict:
        return defaults.default_hyperparameters(objective="ranking", epsilon=eps, delta=1e-6,
                                                rating_range=(1.0, 5.0), n_items=n_items)

    small, large = rule(1.0, 3000), rule(20.0, 3000)
    assert small["popularity_prior"] > large["popularity_prior"] > 0  # the prior fades as the noise falls
    assert small["frequent_fraction"] < large["frequent_fraction"]  # more items carry signal
    assert rule(0.5, 3000)["count_noise_ratio"] < small["count_noise_ratio"] < large["count_noise_ratio"] == 2.0
    assert rule(5.0, 100)["reg_gravity"] < rule(5.0, 3000)["reg_gravity"]  # small dense catalogue: less gravity
    assert rule(5.0, 100)["frequent_fraction"] == 0.5  # never fewer than 50 trained items
    # where gravity is turned down the prior keeps a floor (rule 9: γ_B/B² for the released B, rule 8's
    # 4 at B = 10): a small dense catalogue ranks mostly by popularity; none at full gravity
    assert rule(20.0, 100)["prior_bound_floor"] / 10**2 == pytest.approx(4.0 * 0.9)
    assert rule(20.0, 1000)["prior_bound_floor"] == rule(20.0, 3000)["prior_bound_floor"] == 0.0
    assert rule(20.0, 1000)["popularity_prior"] == pytest.approx(0.1)
    assert rule(0.5, 3000)["rank"] == small["rank"] == 8 < rule(3.0, 3000)["rank"] < large["rank"] == 32
    assert small["defaults_rule"] == defaults.RULE_VERSION == 13
    # rule 10: one step at a released B ≤ 15·min(1, 1/ε) (fewer in a small catalogue)
    assert (rule(0.5, 3000)["few_steps_bound"], small["few_steps_bound"], small["few_steps"]) == (15, 15, 1)
    assert rule(2.0, 3000)["few_steps_bound"] == 8 and rule(5.0, 3000)["few_steps_bound"] == 3
    assert rule(0.5, 500)["few_steps_bound"] == 8 and rule(1.0, 100)["few_steps_bound"] == 2
    assert large["few_steps_bound"] == 1  # below any released B (bound_min 5): ε = 20 keeps its steps
    # rule 10's floors for the trained set: Gram SNR 1, and 3·max(1, ε) count-noise stds
    assert small["frequent_snr"] == large["frequent_snr"] == 1.0
    assert (rule(0.5, 3000)["frequent_count_sigmas"], small["frequent_count_sigmas"]) == (3.0, 3.0)
    # rule 11: the model in force's items stay trained from 2·max(1, ε) count-noise stds
    assert (rule(0.5, 3000)["keep_trained_sigmas"], small["keep_trained_sigmas"], large["keep_trained_sigmas"]) == (
        2.0, 2.0, 40.0)
    assert large["frequent_count_sigmas"] == 60.0
    # rule 12: an item trained by those floors alone enters the users' weights and solves by its Gram's SNR
    assert small["secondary_by_snr"] is large["secondary_by_snr"] is True
    # rule 6: the pooled item Grams at full gravity, fading with it in a small dense catalogue
    assert rule(5.0, 3000)["gram_pooling"] == rule(5.0, 1000)["gram_pooling"] == 10.0
    assert rule(5.0, 100)["gram_pooling"] == pytest.approx(1.0)


def test_rules_8_and_13_set_k_from_the_data_a_user_level_mean_and_a_bias_prior_that_follows_epsilon():
    def rule(objective: str, eps: float, rating_range: tuple[float, float] = (1.0, 5.0)) -> dict:
        return defaults.default_hyperparameters(objective=objective, epsilon=eps, delta=1e-6,
                                                rating_range=rating_range, n_items=1682)

    for objective, largest in (("rating", 240), ("ranking", 60)):
        params = rule(objective, 1.0)
        assert params["bound_quantile"] is not None and params["contribution_bound"] == largest
        assert 1 <= params["bound_min"] < largest
    assert rule("rating", 0.5)["bound_scale"] < rule("rating", 8.0)["bound_scale"]  # k grows with ε
    assert rule("rating", 1.0)["mean_mode"] == "dp_user"  # its noise does not grow with k
    # rule 13: the biases' prior, 0.125·h·√ε at 1,000 users, shrinks them harder at small ε; the run scales it
    # by the released user count (dpals.item_bias_prior)
    assert rule("rating", 0.5)["item_bias_prior_std"] < rule("rating", 2.0)["item_bias_prior_std"]
    assert rule("rating", 4.0)["item_bias_prior_std"] == pytest.approx(0.5)
    assert rule("rating", 4.0, (-10.0, 10.0))["item_bias_prior_std"] == pytest.approx(2.5)
    assert rule("rating", 1.0)["item_bias_prior_by_users"] is True
    # rule 13: the rating filter's strength 10/ε³ stops growing below ε = 1
    assert [rule("rating", eps)["noise_filter"] for eps in (0.1, 0.5, 1.0)] == [10.0, 10.0, 10.0]
    assert rule("rating", 2.0)["noise_filter"] == pytest.approx(1.25)
    assert "item_bias_prior_by_users" not in rule("ranking", 1.0)  # no biases in the ranking objective


def test_ranking_rule_takes_fewer_steps_for_few_declared_users():
    def steps(eps: float, max_users: int | None) -> tuple[int, int]:
        params = defaults.default_hyperparameters(objective="ranking", epsilon=eps, delta=1e-6,
                                                  rating_range=(1.0, 5.0), n_items=1682, max_users=max_users)
        return params["n_steps"], params["average_last"]

    # rule 5: two steps while eps * max_users < 3000 (ML-100K-sized at eps <= 2); rule 6: else four,
    # the last two released V's averaged
    assert [steps(eps, 1000) for eps in (0.5, 1.0, 2.0, 5.0, 20.0)] == [(2, 1)] * 3 + [(4, 2)] * 2
    assert steps(0.5, 10_000) == steps(0.5, None) == steps(1.0, None) == (4, 2)  # no bound declared: many users
    rating = defaults.default_hyperparameters(objective="rating", epsilon=1.0, delta=1e-6, rating_range=(1.0, 5.0),
                                              n_items=1682, max_users=1000)
    assert rating == defaults.default_hyperparameters(objective="rating", epsilon=1.0, delta=1e-6,
                                                      rating_range=(1.0, 5.0), n_items=1682)


def rule_for_rating() -> dict:
    return defaults.default_hyperparameters(objective="rating", epsilon=20.0, delta=1e-6, rating_range=(1.0, 5.0),
                                            n_items=1682)


def test_ranking_user_ridge_falls_with_epsilon_for_few_declared_users():
    def ridge(eps: float, max_users: int | None) -> float:
        return defaults.default_hyperparameters(objective="ranking", epsilon=eps, delta=1e-6, rating_range=(1.0, 5.0),
                                                n_items=1682, max_users=max_users)["reg_user"]

    # rule 7: 0.5 up to eps_0 = 5·(max_users/1000)^(1/3), then 0.5·(eps_0/eps)^1.5
    assert [ridge(eps, 1000) for eps in (0.5, 2.0, 5.0)] == [0.5] * 3
    assert ridge(10.0, 1000) == pytest.approx(0.5 / 2**1.5, abs=1e-6)
    assert ridge(20.0, 1000) == pytest.approx(0.0625)
    assert ridge(20.0, 1000) < ridge(20.0, 10_000) < ridge(20.0, 100_000) == 0.5
    assert ridge(10.0, 10_000) == ridge(20.0, None) == ridge(100.0, None) == 0.5  # no bound declared: many users
    assert ridge(7.0, 1000) < ridge(6.0, 1000) < 0.5  # smooth past eps_0, no step


def test_without_a_declared_bound_the_run_reads_rule_7s_ridge_from_the_released_user_total():
    def rule(eps: float, max_users: int | None) -> dict:
        return defaults.default_hyperparameters(objective="ranking", epsilon=eps, delta=1e-6, rating_range=(1.0, 5.0),
                                                n_items=1682, max_users=max_users)

    # rule 14: A = 0.5·(5/ε)^1.5, so that min(0.5, A·√(ñ/1000)) is rule 7's ridge for ñ declared users
    assert rule(20.0, None)["ridge_users_scale"] == pytest.approx(0.0625)
    assert rule(20.0, 1000)["ridge_users_scale"] == rule(20.0, 10_000)["ridge_users_scale"] == 0.0  # declared: rule 7
    for eps in (2.0, 10.0, 20.0):
        for users in (1000, 10_000):
            applied = min(0.5, rule(eps, None)["ridge_users_scale"] * math.sqrt(users / 1000))
            assert applied == pytest.approx(rule(eps, users)["reg_user"], abs=1e-6)
    assert "ridge_users_scale" not in rule_for_rating()


def test_ranking_filter_only_for_few_declared_users_at_small_epsilon():
    def phi(eps: float, max_users: int | None) -> float:
        return defaults.default_hyperparameters(objective="ranking", epsilon=eps, delta=1e-6, rating_range=(1.0, 5.0),
                                                n_items=1682, max_users=max_users)["noise_filter"]

    # rule 7: 0.003·max(0, 1 − eps·max_users/3000), fading linearly to none where rule 5's few-users regime ends
    assert [phi(eps, 1000) for eps in (0.5, 1.0, 2.0)] == pytest.approx([0.0025, 0.002, 0.001])
    assert phi(0.5, 1000) > phi(1.0, 1000) > phi(2.0, 1000) > phi(3.0, 1000) == 0.0
    assert phi(0.5, 10_000) == phi(0.1, None) == phi(20.0, 1000) == 0.0  # many users or no bound: no filter
    rating = defaults.default_hyperparameters(objective="rating", epsilon=20.0, delta=1e-6, rating_range=(1.0, 5.0),
                                              n_items=1682, max_users=1000)
    assert rating["reg_user"] == 0.05  # the rating rule does not read the bound


def test_rating_rule_calibrates_each_user_and_trains_a_small_catalogue_whole():
    def rule(n_items: int) -> dict:
        return defaults.default_hyperparameters(objective="rating", epsilon=5.0, delta=1e-6,
                                                rating_range=(-10.0, 10.0), n_items=n_items)

    assert rule(3000)["self_calibration"] and rule(3000)["frequent_fraction"] == 0.4
    assert rule(3000)["gram_pooling"] == rule(100)["gram_pooling"] == 1000.0  # rule 6: pooled item Grams
    assert rule(100)["frequent_fraction"] == 1.0 and rule(200)["frequent_fraction"] == 0.5


@pytest.mark.parametrize("objective", ["rating", "ranking"])
def test_dpcmf_defaults_weigh_public_sources_less_as_the_noise_falls(objective: str):
    def resolve(eps: float) -> dict:
        params, used = resolve_hyperparameters("dpcmf", {}, objective=objective, epsilon=eps, delta=1e-6,
                                               rating_range=(1.0, 5.0), n_items=3000)
        assert used
        return params

    small, large = resolve(1.0), resolve(20.0)
    assert small["alpha_metadata"] == pytest.approx(20 * large["alpha_metadata"]) and large["alpha_metadata"] > 0
    assert small["alpha_public_users"] > 0 and small["alpha_similarities"] > 0
    if objective == "ranking":  # rule 4: a genre row's ridge λ_F/α = 30·ε, re-derived for the rank law
        assert small["reg_feature"] / small["alpha_metadata"] == pytest.approx(30.0)
        assert large["reg_feature"] / large["alpha_metadata"] == pytest.approx(600.0)
    dpals_rule = defaults.default_hyperparameters(objective=objective, epsilon=1.0, delta=1e-6,
                                                  rating_range=(1.0, 5.0), n_items=3000)
    assert {k: small[k] for k in dpals_rule} == dpals_rule  # DPALS's rule plus the public side
    get_algorithm("dpcmf").config_from_params(small, (1.0, 5.0))  # a valid DP-CMF config


def test_rule_9_laws_in_the_released_bound_are_ranking_only():
    def rule(objective: str, eps: float, n_items: int = 1682, max_users: int | None = 10_000) -> dict:
        return defaults.default_hyperparameters(objective=objective, epsilon=eps, delta=1e-6, rating_range=(1.0, 5.0),
                                                n_items=n_items, max_users=max_users)

    # the small catalogue's prior floor moves into γ_B (read with the released B); none at full gravity
    assert rule("ranking", 20.0, n_items=100)["prior_bound_floor"] > 0 == rule("ranking", 20.0)["prior_bound_floor"]
    assert rule("ranking", 20.0, n_items=100)["popularity_prior"] < 1.0  # the rest: rule 3's 2/ε·(1000/n)^¼
    # the ridge may grow from rule 7's value up to its ε-free ceiling, never past it
    params = rule("ranking", 20.0)
    assert params["reg_user"] < params["ridge_bound_cap"] == 0.5 and params["ridge_bound_exponent"] == 0.5
    assert params["ridge_bound_reference"] == params["contribution_bound"] == 60  # rule 8's largest B
    for eps in (0.5, 20.0):
        knobs = {"prior_bound_floor", "ridge_bound_exponent", "ridge_bound_reference", "ridge_bound_cap"}
        assert not knobs & set(rule("rating", eps))
