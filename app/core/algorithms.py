"""The private training algorithms the service can run, behind one interface.

Each entry knows how to build its config from public hyper-parameters, calibrate it to a target
(ε, δ), give the run's ``DpEvent`` before any data is read (for the ledger reservation), train,
store and load its public artifact, and score items for one user from that artifact plus the
user's own ratings (privileged post-processing).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
from dp_accounting import dp_event

from app.core import onebit
from app.core.mf import defaults, dpals, dpcmf, dpfw, foldin
from app.core.mf.artifact import load_model, save_model

__all__ = ["Algorithm", "ALGORITHMS", "SCORE_KINDS", "get_algorithm", "resolve_hyperparameters", "score_kind"]

Recommend = Callable[..., tuple[np.ndarray, np.ndarray]]
Score = Callable[[Any, np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Algorithm:
    """Uniform access to one algorithm (see the module docstring)."""

    name: str
    config_from_params: Callable[[dict[str, Any], tuple[float, float]], Any]
    config_from_dict: Callable[[dict[str, Any]], Any]
    public_config: Callable[[Any], dict[str, Any]]
    calibrate: Callable[[float, float, Any, int], Any]
    event: Callable[[Any, int], dp_event.DpEvent]
    event_parameters: Callable[[Any], dict[str, Any]]
    train: Callable[..., Any]
    save: Callable[[Any, Path], tuple[Path, str]]
    load: Callable[[Path, str | None], Any]
    recommend: Recommend
    score: Score  # every item's score for one user (the same solve as ``recommend``)
    data: str = "ratings"  # "ratings+public": ``train`` also takes ``public=`` (a dpcmf.PublicData)


# ---------------------------------------------------------------------------- DPALS
def _with_fixed_range(params: dict[str, Any], rating_range: tuple[float, float]) -> dict[str, Any]:
    if "rating_range" in params and [float(x) for x in params["rating_range"]] != list(rating_range):
        raise ValueError("rating_range is the data set's public range and cannot be overridden")
    return {**params, "rating_range": list(rating_range)}


def _dpals_config(params: dict[str, Any], rating_range: tuple[float, float]) -> dpals.DPALSConfig:
    return dpals.DPALSConfig.from_dict(_with_fixed_range(params, rating_range))


def _dpals_save(model: Any, path: Path) -> tuple[Path, str]:
    info = save_model(model, path)
    return info.npz_path, info.sha256


DPALS = Algorithm(
    name="dpals",
    config_from_params=_dpals_config,
    config_from_dict=dpals.DPALSConfig.from_dict,
    public_config=dpals.public_config,
    calibrate=lambda eps, delta, config, n_items: dpals.calibrate(eps, delta, config),
    event=lambda config, n_items: dpals.dpals_event(config),
    event_parameters=dpals.event_parameters,
    train=dpals.train_dpals,
    save=_dpals_save,
    load=lambda path, sha: load_model(path, expected_sha256=sha),
    recommend=foldin.recommend,
    score=foldin.user_scores,
)


# ---------------------------------------------------------------------------- DPFW
def _dpfw_config(params: dict[str, Any], rating_range: tuple[float, float]) -> dpfw.DPFWConfig:
    if "rating_range" in params:
        raise ValueError("DPFW takes no rating_range: users centre by their own mean")
    midpoint = 0.5 * (rating_range[0] + rating_range[1])  # public offset for users without ratings
    return dpfw.DPFWConfig.from_dict({"default_mean": midpoint, **params})


def _dpfw_calibrate(eps: float, delta: float, config: dpfw.DPFWConfig, n_items: int) -> dpfw.DPFWConfig:
    """Resolve "auto" against today's catalogue size first, so the reserved event never drifts."""
    resolved = replace(config, eigen_method=config.method(n_items))
    return dpfw.calibrate(eps, delta, resolved, n_items)


def _dpfw_save(model: Any, path: Path) -> tuple[Path, str]:
    npz_path, _, sha = dpfw.save_frank_wolfe(model, path)
    return npz_path, sha


DPFW = Algorithm(
    name="dpfw",
    config_from_params=_dpfw_config,
    config_from_dict=dpfw.DPFWConfig.from_dict,
    public_config=dpfw.public_config,
    calibrate=_dpfw_calibrate,
    event=lambda config, n_items: dpfw.dpfw_event(config, n_items),
    event_parameters=dpfw.event_parameters,
    train=dpfw.train_dpfw,
    save=_dpfw_save,
    load=lambda path, sha: dpfw.load_frank_wolfe(path, expected_sha256=sha),
    recommend=dpfw.recommend_dpfw,
    score=dpfw.replay_user,
)

# ---------------------------------------------------------------------------- DP-CMF
def _dpcmf_config(params: dict[str, Any], rating_range: tuple[float, float]) -> dpcmf.DPCMFConfig:
    return dpcmf.DPCMFConfig.from_dict(_with_fixed_range(params, rating_range))


DPCMF = Algorithm(
    name="dpcmf",
    config_from_params=_dpcmf_config,
    config_from_dict=dpcmf.DPCMFConfig.from_dict,
    public_config=dpcmf.public_config,
    calibrate=lambda eps, delta, config, n_items: dpcmf.calibrate(eps, delta, config),
    event=lambda config, n_items: dpcmf.dpcmf_event(config),
    event_parameters=dpcmf.event_parameters,
    train=dpcmf.train_dpcmf,
    save=_dpals_save,
    load=lambda path, sha: load_model(path, expected_sha256=sha),
    recommend=foldin.recommend,
    score=foldin.user_scores,
    data="ratings+public",
)

# ---------------------------------------------------------------------------- one-bit (votes)
def _onebit_config(params: dict[str, Any], rating_range: tuple[float, float]) -> onebit.OneBitConfig:
    if "rating_range" in params:
        raise ValueError("one-bit completion trains on +1/-1 votes and takes no rating_range")
    return onebit.OneBitConfig.from_dict(params)


ONEBIT = Algorithm(
    name="onebit",
    config_from_params=_onebit_config,
    config_from_dict=onebit.OneBitConfig.from_dict,
    public_config=onebit.public_config,
    calibrate=onebit.calibrate,
    event=onebit.onebit_event,
    event_parameters=onebit.event_parameters,
    train=onebit.train_onebit,
    save=onebit.save_onebit,
    load=lambda path, sha: onebit.load_onebit(path, sha),
    recommend=onebit.recommend_onebit,
    score=onebit.user_scores,
    data="votes",
)

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (DPALS, DPFW, DPCMF, ONEBIT)}

SCORE_KINDS = ("predicted_rating", "ranking_score", "p_thumbs_up")


def score_kind(name: str, model: Any) -> str:
    """What ``score`` means for a model of algorithm ``name``: a predicted rating on the data
    set's scale, a ranking score (higher is better, no scale), or P(thumbs up)."""
    if get_algorithm(name).data == "votes":
        return "p_thumbs_up"
    config = getattr(model, "config", {}) or {}
    return "ranking_score" if config.get("objective") == "ranking" else "predicted_rating"


# algorithms whose hyper-parameters the ε-aware rule (app.core.mf.defaults) can fill in
_DEFAULTED = ("dpals", "dpcmf")


def resolve_hyperparameters(
    name: str,
    params: dict[str, Any],
    *,
    objective: str | None,
    epsilon: float,
    delta: float,
    rating_range: tuple[float, float],
    n_items: int,
    max_users: int | None = None,
) -> tuple[dict[str, Any], bool]:
    """(hyper-parameters to run, whether the ε-aware defaults were used).

    With no hyper-parameters (``params`` empty) DPALS and DP-CMF get
    :func:`app.core.mf.defaults.default_hyperparameters` for the objective at (ε, δ), from public
    facts only; given hyper-parameters are used as they are (an ``objective`` argument is added).
    """
    get_algorithm(name)
    params = dict(params)
    in_params = params.pop("objective", None)
    if objective is not None and in_params is not None and in_params != objective:
        raise ValueError("objective is given twice with different values")
    objective = objective or in_params
    if objective is not None and name not in _DEFAULTED:
        raise ValueError(f"{name} has no objective choice (objectives apply to {', '.join(_DEFAULTED)})")
    if params or name not in _DEFAULTED:
        return ({**params, "objective": objective} if objective else dict(params)), False
    rule = defaults.default_cmf_hyperparameters if name == "dpcmf" else defaults.default_hyperparameters
    resolved = rule(
        objective=objective or "rating", epsilon=epsilon, delta=delta, rating_range=rating_range,
        n_items=n_items, max_users=max_users,
    )
    return resolved, True


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called ``name`` (``ValueError`` listing the available ones otherwise)."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; available: {sorted(ALGORITHMS)}") from None

