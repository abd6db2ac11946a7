"""quality-defaults: the service's default path next to the free baselines and a tuned grid.

What an admin's training request without hyper-parameters runs — the registry's
``resolve_hyperparameters`` (the ε-aware rule of ``app.core.mf.defaults``), ``config_from_params``
and ``calibrate`` — on three public data sets read from ``../shared/data`` at run time (research
use only; never copied into the repo), both objectives, at the service's default δ = 1e-6:

* rating objective: test RMSE (clipped to the scale, and unclipped: ``rmse_unclipped``) of the
  served prediction m̃ + b_u + b̃_j + u·v_j, users re-projected from train + validation. Rows
  ``training-mean`` and ``user-mean`` are the free baselines on the same split.
* ranking objective: Recall@20 of held-out users folded in from their history; ``popularity``
  ranks by the DP counts released by the same default run (free post-processing).
* ``dpals-tuned``: the best of a validation grid of 24 configurations around the default
  (rank, contribution bound and mode, clipping, ridge, frequent fraction, steps, filter), chosen
  on validation with seed 0 and tested on every seed — a yardstick, not something the service
  does (tuning on private data would cost budget).
* ``dpcmf-default`` (ML-1M, its 18 genres as public item metadata): the registry's DP-CMF default
  (DPALS's rule plus α per public source), same splits and scores.

Each data set declares the public bound ``max_users`` an admin would (the next power of ten at or
above its users: ML-100K 1,000, ML-1M 10,000, Jester-1 100,000); the rule reads it (rules 5 and 7:
steps, user ridge and Wiener filter of the ranking objective).

Splits: ML-1M canonical (80/10/10 and held-out users); ML-100K and Jester-1 seeded 80/10/10 and
held-out users (positives: ratings at or above lo + 0.75 (hi − lo)).

Sparsified variants (issue 27: the shapes real products have, where most users rate little):
``<set>-m<T>`` is the set with each user's training ratings subsampled to a median of T a user
(ML-1M and ML-100K at 10, 20 and 35; Jester-1 at 10) by :mod:`app.core.data.sparsify` with its fixed
public seed: validation ratings and held-out users' queries are thinned by each user's same ratio,
test ratings and ranking targets are untouched, every user and item is kept (so ``max_users`` is the
source's). Without ``../shared/data`` the suite stops with a message naming the missing path.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from app.core.algorithms import get_algorithm, resolve_hyperparameters
from app.core.data.datasets import DatasetUnavailable, load_dataset
from app.core.data.ratings import Ratings
from app.core.data.sparsify import sparsify_ranking_split, sparsify_rating_split
from app.core.data.splits import (
    HeldoutSplit,
    heldout_users_split,
    load_ml1m_ranking_split,
    load_ml1m_rating_split,
    merge,
    random_split,
)
from app.core.eval.metrics import rating_rmse
from app.core.mf.dpcmf import PublicData
from app.core.mf.model import PublicModel
from benchmarks.cmf import _genres
from benchmarks.evaluation import model_ranking, model_rmse
from benchmarks.harness import SuiteUnavailable, limit_threads, make_row, mean_std

SUITE = "quality-defaults"
DELTA = 1e-6
EPSILONS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0)
SEEDS = (0, 1, 2)
SOURCES = ("ml-1m", "ml-100k", "jester-1")
#: the sparsified variants: (source, target median of each user's training ratings)
SPARSIFIED = tuple((source, t) for source in ("ml-1m", "ml-100k") for t in (10, 20, 35)) + (("jester-1", 10),)
DATASETS = SOURCES + tuple(f"{source}-m{t}" for source, t in SPARSIFIED)
BLAS_THREADS = 2

# one-factor variations around the default: 24 configurations spanning the named knobs
_GRID: list[dict[str, Any]] = [
    {}, {"rank": 4}, {"rank": 32}, {"contribution_bound": 60}, {"contribution_bound": 120},
    {"contribution_mode": "uniform"}, {"contribution_mode": "tail"}, {"clip_rating_scale": 0.6},
    {"clip_rating_scale": 1.5}, {"reg_item": 160.0}, {"reg_item": 2560.0}, {"frequent_fraction": 0.3},
    {"frequent_fraction": 0.6}, {"n_steps_add": 1}, {"n_steps_add": -1}, {"noise_filter_scale": 0.1},
    {"noise_filter_scale": 10.0}, {"reg_user_scale": 0.1}, {"reg_user_scale": 10.0},
    {"bias_noise_ratio": 2.0}, {"item_reg_exponent": 0.5}, {"clip_user": 0.5},
    {"gram_noise_ratio": 1.0}, {"gram_noise_ratio": 4.0},
]


def _vary(params: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """Apply one grid change to resolved default parameters (scales are relative)."""
    out = dict(params)
    for key, value in change.items():
        if key == "clip_rating_scale":
            out["clip_rating"] = params["clip_rating"] * value
        elif key == "n_steps_add":  # exactly this many steps: rule 10's step law off
            out["n_steps"] = max(1, params["n_steps"] + value)
            out["few_steps_bound"] = 0
        elif key == "noise_filter_scale":  # a rule without the filter tries φ = 0.01·scale
            out["noise_filter"] = (params.get("noise_filter") or 0.01) * value
        elif key == "reg_user_scale":
            out["reg_user"] = params["reg_user"] * value
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class _Data:
    name: str
    rating_range: tuple[float, float]
    train: Ratings
    valid: Ratings
    test: Ratings
    ranking: HeldoutSplit
    max_users: int | None = None  # the admin-declared public bound on the number of users
    public: Callable[[Ratings], PublicData] | None = None  # the public item data DP-CMF gets (ML-1M: genres)
    ratings: Ratings | None = None  # every rating the splits were drawn from (the sparsifier's user counts)


def _genre_data(train: Ratings) -> PublicData:
    return PublicData((_genres(train.item_ids),))


def _declared_bound(n_users: int) -> int:
    """The bound an admin declares: the next power of ten at or above the data set's users."""
    return 10 ** math.ceil(math.log10(max(n_users, 1)))


def _load(name: str) -> _Data:
    """A data set of :data:`DATASETS` with its splits (``SuiteUnavailable`` without the data)."""
    try:
        for source, target in SPARSIFIED:
            if name == f"{source}-m{target}":
                return _sparsified(_load_source(source), name, target)
        return _load_source(name)
    except DatasetUnavailable as exc:
        raise SuiteUnavailable(f"quality-defaults reads the public rating data from ../shared/data: {exc}") from exc


def _load_source(name: str) -> _Data:
    if name == "ml-1m":
        train, valid, test = load_ml1m_rating_split()
        ranking = load_ml1m_ranking_split()
        return _Data(name, (1.0, 5.0), train, valid, test, ranking, _declared_bound(merge(train, valid).n_users),
                     public=_genre_data, ratings=merge(train, valid, test))
    data = load_dataset(name)
    lo, hi = data.rating_range
    train, valid, test = random_split(data.ratings, (0.8, 0.1, 0.1), seed=0)
    n_held = max(20, data.ratings.n_users // 10)
    ranking = heldout_users_split(data.ratings, n_held, n_held, seed=0, positive_threshold=lo + 0.75 * (hi - lo))
    return _Data(name, data.rating_range, train, valid, test, ranking, _declared_bound(data.ratings.n_users),
                 ratings=data.ratings)


def _sparsified(source: _Data, name: str, target: int) -> _Data:
    """``source`` with each user's training ratings subsampled to median ``target`` (same tests)."""
    assert source.ratings is not None
    train, valid, test = sparsify_rating_split(source.train, source.valid, source.test, target)
    return replace(source, name=name, train=train, valid=valid, test=test,
                   ranking=sparsify_ranking_split(source.ranking, source.ratings, target))


def _train(train: Ratings, params: dict[str, Any], eps: float, rating_range: tuple[float, float], seed: int,
           name: str = "dpals", public: PublicData | None = None) -> PublicModel:
    """Exactly the service's path: registry config, calibration to (ε, δ), training."""
    algorithm = get_algorithm(name)
    config = algorithm.config_from_params({**params, "seed": seed}, rating_range)
    config = algorithm.calibrate(eps, DELTA, config, train.n_items)
    if algorithm.data == "ratings+public":
        return algorithm.train(train, config, public=public)
    return algorithm.train(train, config)


def _defaults(objective: str, eps: float, data: _Data, train: Ratings, name: str = "dpals") -> dict[str, Any]:
    params, used = resolve_hyperparameters(name, {}, objective=objective, epsilon=eps, delta=DELTA,
                                           rating_range=data.rating_range, n_items=train.n_items,
                                           max_users=data.max_users)
    assert used
    return params


@dataclass(frozen=True)
class Plan:
    """What one run measures: ε grid, seeds, the tuning grid (empty: no ``dpals-tuned`` row) and
    whether DP-CMF's default runs where the data set has public item data."""

    epsilons: tuple[float, ...] = EPSILONS
    seeds: tuple[int, ...] = SEEDS
    grid: tuple[dict[str, Any], ...] = tuple(_GRID)
    cmf: bool = True


def _candidates(objective: str, eps: float, data: _Data, train: Ratings, plan: Plan,
                valid_score: Callable[[PublicModel], float], higher_is_better: bool, extra: dict[str, Any]):
    """(row name, params, fit) of the default, the tuned grid's winner (chosen on validation) and,
    where the data set has public item data, DP-CMF's default with it."""
    base = {**_defaults(objective, eps, data, train), **extra}
    rating_range = data.rating_range if objective == "rating" else (0.0, 1.0)
    fit = lambda p, seed: _train(train, p, eps, rating_range, seed)  # noqa: E731
    out = [("dpals-default", base, fit)]
    if plan.grid:
        out.append(("dpals-tuned", _tuned(list(plan.grid), base, fit, valid_score, higher_is_better), fit))
    if data.public is not None and plan.cmf:
        public = data.public(train)
        cmf = {**_defaults(objective, eps, data, train, "dpcmf"), **extra}
        out.append(("dpcmf-default", cmf, lambda p, seed: _train(train, p, eps, rating_range, seed, "dpcmf", public)))
    return out


def _tuned(grid: list[dict[str, Any]], base: dict[str, Any], fit: Callable[[dict[str, Any], int], PublicModel],
           valid_score: Callable[[PublicModel], float], higher_is_better: bool) -> dict[str, Any]:
    scored: list[tuple[float, int, dict[str, Any]]] = []
    for change in grid:
        params = _vary(base, change)
        score = valid_score(fit(params, 0))
        scored.append((score if higher_is_better else -score, len(scored), params))
    return max(scored, key=lambda t: (t[0], -t[1]))[2]


def _rating_rows(data: _Data, plan: Plan) -> list[dict]:
    history = merge(data.train, data.valid)
    lo, hi = data.rating_range
    empty = np.zeros(data.test.n_items, dtype=bool)
    user_mean = rating_rmse(data.test, np.zeros(data.test.nnz), train=history, trained_mask=empty)
    train_mean = rating_rmse(data.test, np.full(data.test.nnz, history.csr.data.mean()), train=history)
    rows = [make_row(SUITE, f"{data.name}-rating", "training-mean", "rmse", train_mean),
            make_row(SUITE, f"{data.name}-rating", "user-mean", "rmse", user_mean)]
    seeds = plan.seeds
    for eps in plan.epsilons:
        candidates = _candidates("rating", eps, data, data.train, plan,
                                 lambda m: model_rmse(m, data.train, data.valid, clip=(lo, hi)), False, {})
        for name, params, fit in candidates:
            clipped, unclipped, seconds = [], [], 0.0
            for seed in seeds:
                start = time.perf_counter()
                model = fit(params, seed)
                seconds += time.perf_counter() - start
                clipped.append(model_rmse(model, history, data.test, clip=(lo, hi)))
                unclipped.append(model_rmse(model, history, data.test))
            for metric, values in (("rmse", clipped), ("rmse_unclipped", unclipped)):
                mean, std = mean_std(values)
                rows.append(make_row(SUITE, f"{data.name}-rating", name, metric, mean, epsilon=eps, delta=DELTA,
                                     std=std, seeds=list(seeds), baseline=user_mean, seconds=seconds / len(seeds)))
    return rows


def _popularity_model(model: PublicModel) -> PublicModel:
    """Rank by the run's DP counts alone (free post-processing of the same release)."""
    return replace(model, item_factors=np.zeros_like(model.item_factors), item_biases=np.log(model.item_counts),
                   trained_mask=np.ones(model.n_items, dtype=bool),
                   config={**model.config, "objective": "ranking"})


def _ranking_rows(data: _Data, plan: Plan) -> list[dict]:
    split, seeds = data.ranking, plan.seeds
    rows = []
    # the split's train holds positives with value 1: the ranking objective's threshold is 1 there
    for eps in plan.epsilons:
        candidates = _candidates("ranking", eps, data, split.train, plan,
                                 lambda m: model_ranking(m, split.valid, 20)["recall@20"], True,
                                 {"positive_threshold": 1.0})
        popularity = []
        for name, params, fit in candidates:
            scores, seconds = [], 0.0
            for seed in seeds:
                start = time.perf_counter()
                model = fit(params, seed)
                seconds += time.perf_counter() - start
                scores.append(model_ranking(model, split.test, 20)["recall@20"])
                if name == "dpals-default":
                    popularity.append(model_ranking(_popularity_model(model), split.test, 20)["recall@20"])
            mean, std = mean_std(scores)
            rows.append(make_row(SUITE, f"{data.name}-ranking", name, "recall@20", mean, epsilon=eps, delta=DELTA,
                                 std=std, seeds=list(seeds), seconds=seconds / len(seeds)))
        mean, std = mean_std(popularity)
        rows.append(make_row(SUITE, f"{data.name}-ranking", "popularity", "recall@20", mean, epsilon=eps,
                             delta=DELTA, std=std, seeds=list(seeds)))
    return rows


def measure(names: tuple[str, ...], plan: Plan, *, threads: int = BLAS_THREADS,
            sink: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """The rows of ``plan`` on the data sets ``names``, one data set at a time (``sink`` gets each
    data set's rows as they are done)."""
    rows: list[dict] = []
    with limit_threads(threads):
        for name in names:
            data = _load(name)
            done = _rating_rows(data, plan) + _ranking_rows(data, plan)
            if sink is not None:
                sink(done)
            rows += done
    return rows


def run(quick: bool) -> list[dict]:
    if quick:  # ML-1M for the DP-CMF rows, ML-100K
        return measure(DATASETS[:2], Plan(epsilons=(1.0, 20.0), seeds=SEEDS[:1], grid=tuple(_GRID[:4])))
    return measure(DATASETS, Plan())
