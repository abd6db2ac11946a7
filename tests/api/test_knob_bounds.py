"""Every hyper-parameter that enters a sensitivity (or the count of releases) is range-checked
when the config is built, so a bad value is a clear 4xx at the API before anything is reserved,
never a run whose charged event is false. One case per bound."""

from __future__ import annotations

import math

import pytest

from app.core.algorithms import get_algorithm
from tests.api.conftest import Env, add_items

RANGE = (1.0, 5.0)
BAD = [
    # DPALS (also DP-CMF's private part): contribution bound k, clipping, noise, release count
    ("dpals", {"contribution_bound": 0}, "contribution_bound"),
    ("dpals", {"contribution_bound": 2.5}, "contribution_bound"),
    ("dpals", {"contribution_bound": True}, "contribution_bound"),
    ("dpals", {"n_steps": 0}, "n_steps"),
    ("dpals", {"clip_user": 0.0}, "clip_user"),
    ("dpals", {"clip_rating": -1.0}, "clip_rating"),
    ("dpals", {"clip_rating": math.inf}, "clip_rating"),
    ("dpals", {"noise_multiplier": 0.0}, "noise_multiplier"),
    ("dpals", {"gram_noise_ratio": math.nan}, "gram_noise_ratio"),
    ("dpals", {"gravity_noise_ratio": 0.0}, "gravity_noise_ratio"),
    ("dpals", {"count_noise_ratio": -2.0}, "count_noise_ratio"),
    ("dpals", {"mean_noise_ratio": 0.0}, "mean_noise_ratio"),
    ("dpals", {"bound_noise_ratio": 0.0}, "bound_noise_ratio"),
    ("dpals", {"bound_quantile": 1.5}, "bound_quantile"),
    ("dpals", {"bound_quantile": 0.5, "bound_min": 500}, "bound_min"),
    ("dpals", {"weight_exponent": 0.5}, "weight_exponent"),
    ("dpals", {"reg_gravity": -1.0}, "reg_gravity"),
    ("dpals", {"few_steps": 0}, "few_steps"),
    ("dpals", {"n_steps": 2, "few_steps": 3}, "few_steps"),
    ("dpals", {"few_steps_bound": -1}, "few_steps_bound"),
    ("dpals", {"few_steps_bound": 2.5}, "few_steps_bound"),
    ("dpals", {"later_noise_scale": 0.0}, "later_noise_scale"),
    ("dpals", {"frequent_snr": -1.0}, "frequent_snr"),
    ("dpals", {"frequent_count_sigmas": -3.0}, "frequent_count_sigmas"),
    ("dpals", {"rating_range": [0, 10]}, "rating_range"),
    ("dpcmf", {"contribution_bound": 0}, "contribution_bound"),
    ("dpcmf", {"clip_user": 0.0}, "clip_user"),
    # DPFW: row clip L (4L^2), the xi cap (sqrt(xi)), steps and Oja iterations (release counts)
    ("dpfw", {"row_clip": 0.0}, "row_clip"),
    ("dpfw", {"row_clip": math.inf}, "row_clip"),
    ("dpfw", {"max_ratings_per_user": 0}, "max_ratings_per_user"),
    ("dpfw", {"max_ratings_per_user": True}, "max_ratings_per_user"),
    ("dpfw", {"n_steps": 1}, "n_steps"),
    ("dpfw", {"oja_iterations": 0}, "oja_iterations"),
    ("dpfw", {"noise_multiplier": 0.0}, "noise_multiplier"),
    ("dpfw", {"eigenvalue_noise_ratio": -1.0}, "eigenvalue_noise_ratio"),
    ("dpfw", {"count_noise_ratio": math.nan}, "count_noise_ratio"),
    ("dpfw", {"eigen_inflation": "yes"}, "eigen_inflation"),
    # one-bit: k, C, grid, steps, epsilon, multipliers, alpha (zeta), ridge, rho floor, user_rows
    ("onebit", {"votes_per_user": 0}, "votes_per_user"),
    ("onebit", {"votes_per_user": 1.5}, "votes_per_user"),
    ("onebit", {"mechanism": "grap", "clamp": 0.0}, "clamp"),
    ("onebit", {"mechanism": "grap", "grid_steps": 0}, "grid_steps"),
    ("onebit", {"mechanism": "grap", "n_steps": 0}, "n_steps"),
    ("onebit", {"mechanism": "grap", "epsilon": math.inf}, "epsilon"),
    ("onebit", {"mechanism": "outp", "noise_multiplier": 0.0}, "noise_multiplier"),
    ("onebit", {"mechanism": "objp", "objp_output_noise_multiplier": -1.0}, "objp_output_noise_multiplier"),
    ("onebit", {"alpha": 0.0}, "alpha"),
    ("onebit", {"mechanism": "outp", "ridge": 0.0}, "ridge"),
    ("onebit", {"mechanism": "objp", "solver_tolerance": 1e-17}, "solver_tolerance"),
    ("onebit", {"mechanism": "outp", "solver_tolerance": 1e-17}, "solver_tolerance"),
    ("onebit", {"user_rows": 1}, "user_rows"),
    ("onebit", {"link": "cauchy"}, "link"),
]


@pytest.mark.parametrize("algorithm,params,match", BAD, ids=[f"{a}-{m}-{i}" for i, (a, _, m) in enumerate(BAD)])
def test_config_construction_refuses_the_bound(algorithm, params, match):
    with pytest.raises(ValueError, match=match):
        get_algorithm(algorithm).config_from_params(dict(params), RANGE)


JSON_BAD = [case for case in BAD  # JSON has no NaN or infinity: those are core-level cases only
            if all(not isinstance(v, float) or math.isfinite(v) for v in case[1].values())]


@pytest.mark.parametrize("algorithm,params,match", JSON_BAD,
                         ids=[f"{a}-{m}-{i}" for i, (a, _, m) in enumerate(JSON_BAD)])
def test_the_api_answers_422_and_reserves_nothing(sqlite_env: Env, algorithm, params, match):
    before = sqlite_env.count("ledger_entries")
    r = sqlite_env.client.post("/v1/admin/datasets/default/trainings", headers=sqlite_env.admin,
                               json={"algorithm": algorithm, "epsilon": 1.0, "hyperparameters": params})
    assert r.status_code == 422, r.text
    assert match in r.json()["error"]["message"]
    assert sqlite_env.count("ledger_entries") == before and sqlite_env.count("training_runs") == 0


# ----------------------------------------------------------------------------- upper bounds
# What one worker and the exact sampler can do: each knob past its bound is a 422 at the API
# before anything is recorded or reserved (the config's own checks cover the lower bounds above).
TOO_LARGE = [
    ("dpals", {"n_steps": 2**31}, "n_steps"),
    ("dpals", {"n_steps": 1001}, "n_steps"),
    ("dpals", {"rank": 2**63}, "rank"),
    ("dpals", {"rank": 513}, "rank"),
    ("dpals", {"contribution_bound": 10**9}, "contribution_bound"),
    ("dpals", {"count_noise_ratio": 1e11}, "count_noise_ratio"),
    ("dpals", {"gram_noise_ratio": 1e-11}, "gram_noise_ratio"),
    ("dpals", {"gravity_noise_ratio": 1001.0}, "gravity_noise_ratio"),
    ("dpals", {"mean_noise_ratio": 1e4}, "mean_noise_ratio"),
    ("dpals", {"bias_noise_ratio": 1e4}, "bias_noise_ratio"),
    ("dpals", {"bound_noise_ratio": 1e4}, "bound_noise_ratio"),
    ("dpals", {"bound_min": 10**9}, "bound_min"),
    ("dpals", {"ridge_bound_exponent": 1e9}, "ridge_bound_exponent"),
    ("dpals", {"ridge_bound_reference": 1e9}, "ridge_bound_reference"),
    ("dpals", {"ridge_bound_cap": 1e9}, "ridge_bound_cap"),
    ("dpals", {"prior_bound_floor": 1e11}, "prior_bound_floor"),
    ("dpals", {"few_steps_bound": 10**6}, "few_steps_bound"),
    ("dpals", {"few_steps": 1001}, "few_steps"),
    ("dpals", {"later_noise_scale": 1e4}, "later_noise_scale"),
    ("dpals", {"frequent_snr": 1e7}, "frequent_snr"),
    ("dpals", {"frequent_count_sigmas": 1e7}, "frequent_count_sigmas"),
    ("dpals", {"noise_multiplier": 1e7}, "noise_multiplier"),
    ("dpals", {"user_cg_steps": 10**6}, "user_cg_steps"),
    ("dpals", {"average_last": 10**6}, "average_last"),
    ("dpals", {"clip_user": 1e300}, "clip_user"),
    ("dpals", {"reg_item": 1e300}, "reg_item"),
    ("dpals", {"rating_range": [1.0, 1e300]}, "rating_range"),
    ("dpcmf", {"rank": 10_000}, "rank"),
    ("dpfw", {"oja_iterations": 10**7}, "oja_iterations"),
    ("dpfw", {"max_ratings_per_user": 10**9}, "max_ratings_per_user"),
    ("dpfw", {"dense_max_items": 10**6}, "dense_max_items"),
    ("dpfw", {"eigenvalue_noise_ratio": 1e6}, "eigenvalue_noise_ratio"),
    ("dpfw", {"nuclear_norm": 1e15}, "nuclear_norm"),
    ("onebit", {"votes_per_user": 10**9}, "votes_per_user"),
    ("onebit", {"mechanism": "grap", "grid_steps": 10**9}, "grid_steps"),
    ("onebit", {"mechanism": "grap", "epsilon": 1e3}, "epsilon"),
    ("onebit", {"mechanism": "objp", "objp_output_noise_multiplier": 1e9}, "objp_output_noise_multiplier"),
    ("onebit", {"user_rows": 2**40}, "user_rows"),
    ("dpals", {f"k{i}": 1 for i in range(65)}, "hyperparameters"),
    ("dpals", {"rank": [[1]]}, "rank"),
]


def _refused_before_anything_is_recorded(env: Env, algorithm: str, params: dict, match: str,
                                         epsilon: float = 1.0) -> dict:
    before = env.count("ledger_entries")
    r = env.client.post("/v1/admin/datasets/default/trainings", headers=env.admin,
                        json={"algorithm": algorithm, "epsilon": epsilon, "hyperparameters": params})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert match in error["message"] + " ".join(d.get("msg", "") + str(d.get("loc")) for d in error["details"] or []
                                                if isinstance(d, dict)), error
    assert env.count("ledger_entries") == before and env.count("training_runs") == 0
    return error


@pytest.mark.parametrize("algorithm,params,match", TOO_LARGE,
                         ids=[f"{a}-{m}-{i}" for i, (a, _, m) in enumerate(TOO_LARGE)])
def test_every_knob_past_its_upper_bound_is_422_and_reserves_nothing(sqlite_env: Env, algorithm, params, match):
    _refused_before_anything_is_recorded(sqlite_env, algorithm, params, match)


SPREAD = {"count_noise_ratio": 1e3, "gram_noise_ratio": 1e-3, "gravity_noise_ratio": 1e-3,
          "mean_noise_ratio": 1e-3, "bias_noise_ratio": 1e-3}


def test_a_run_the_sampler_cannot_draw_is_refused_before_the_reservation(env: Env):
    """Each knob within its bound, but the ratios' spread at a small epsilon puts the count
    release's multiplier near 1e9, and at rank 512 one user changes ~3e7 Gram coordinates: the
    exact discrete Gaussian's integer σ would pass 2^40. 422, nothing reserved, on both
    databases. The same knobs at rank 16 stay drawable (a coarser grid) and are accepted."""
    add_items(env, 24)
    error = _refused_before_anything_is_recorded(env, "dpals", {**SPREAD, "rank": 512}, "sampler", epsilon=0.01)
    assert error["code"] == "invalid_hyperparameters"
    r = env.client.post("/v1/admin/datasets/default/trainings", headers=env.admin,
                        json={"algorithm": "dpals", "epsilon": 0.01, "hyperparameters": SPREAD})
    assert r.status_code == 202, r.text


def test_the_upper_bounds_hold_on_postgresql_too(env: Env):
    for algorithm, params, match in TOO_LARGE[:3]:
        _refused_before_anything_is_recorded(env, algorithm, params, match)
