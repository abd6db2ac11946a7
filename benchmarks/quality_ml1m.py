"""quality-ml1m: DPALS next to non-private ALS on MovieLens-1M, in one run.

Data: ``../shared/data/ml-1m`` with its canonical splits (research use only; read at run time).

* Rating task (algorithms.md §1 protocol): canonical 80/10/10 split, delta = 1e-5. Hyper-parameters
  are chosen on the validation split (train on train, users folded in from train); the reported
  test RMSE uses users re-projected from train + validation, exactly as the privileged endpoint
  would. Untrained (infrequent) items are predicted by the user's mean. ``user-mean`` is that
  fallback alone.
* Ranking task: canonical held-out users (ratings >= 4 are positives), delta = 1/n with n the
  number of training users. Held-out users are folded in from their history only; Recall@20 and
  NDCG@20 with the history excluded, chosen on validation users, reported on test users.

The candidate configurations below came out of a random search scored on the validation split
(never on test); the suite re-selects among them on validation in every run.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from app.core.als import ALSConfig, train_als
from app.core.dpals import DPALSConfig, calibrate, train_dpals
from app.core.metrics import rating_rmse
from app.core.model import PublicModel
from app.core.ratings import Ratings
from app.core.splits import load_ml1m_ranking_split, load_ml1m_rating_split, merge
from benchmarks.evaluation import model_ranking, model_rmse
from benchmarks.harness import limit_threads, make_row, mean_std

SUITE = "quality-ml1m"
DATASET_RATING = "ml-1m-80-10-10"
DATASET_RANKING = "ml-1m-heldout-users"
EPSILONS = (1.0, 5.0, 10.0, 20.0)
RATING_DELTA = 1e-5
SEEDS = (0, 1, 2)
RATING_RANGE = (1.0, 5.0)
BLAS_THREADS = 2

_RATING_BASE = dict(rating_range=RATING_RANGE, init_scale=1.0, count_noise_ratio=2.0, user_centering=True,
                    contribution_mode="adaptive_weights", mean_mode="dp")
_RATING_SEARCH_BEST = [  # the winner of a 70-point random search at each epsilon, scored on validation
    dict(rank=16, reg_item=640.0, item_reg_exponent=0.5, frequent_fraction=0.7, contribution_bound=240,  # eps 20
         reg_user=0.002, user_reg_exponent=1.0, user_bias_shrinkage=10.0, n_steps=3, clip_rating=2.0,
         gram_noise_ratio=1.0),
    dict(rank=16, reg_item=1280.0, item_reg_exponent=0.0, frequent_fraction=0.7, contribution_bound=30,  # eps 10
         reg_user=0.002, user_reg_exponent=0.5, user_bias_shrinkage=10.0, n_steps=3, clip_rating=2.0,
         gram_noise_ratio=2.0),
    dict(rank=8, reg_item=1280.0, item_reg_exponent=0.0, frequent_fraction=0.7, contribution_bound=240,  # eps 5
         reg_user=0.05, user_reg_exponent=0.5, user_bias_shrinkage=30.0, n_steps=2, clip_rating=1.5,
         gram_noise_ratio=3.0),
    dict(rank=8, reg_item=640.0, item_reg_exponent=0.0, frequent_fraction=0.4, contribution_bound=240,  # eps 1
         reg_user=0.05, user_reg_exponent=0.5, user_bias_shrinkage=30.0, n_steps=3, clip_rating=1.5,
         gram_noise_ratio=2.0),
]
RATING_CANDIDATES: dict[float, list[dict[str, Any]]] = {eps: _RATING_SEARCH_BEST for eps in EPSILONS}
ALS_RATING_CANDIDATES = [
    dict(rank=16, n_iters=10, reg_item=10.0, reg_user=0.1, item_reg_exponent=1.0),
    dict(rank=32, n_iters=10, reg_item=20.0, reg_user=0.1, item_reg_exponent=1.0),
]

# positives-only data: no centring at all (a per-user mean of all-ones data would erase it)
_RANKING_BASE = dict(rating_range=(0.0, 1.0), mean_mode="public", public_mean=0.0, clip_rating=1.0,
                     user_centering=False, init_scale=1.0, count_noise_ratio=2.0, gram_noise_ratio=2.0)
_RANKING_GRID_BEST = [  # best of a small grid per epsilon, scored on validation users
    dict(rank=32, reg_gravity=0.5, reg_item=160.0, item_reg_exponent=0.5, frequent_fraction=0.1,
         contribution_bound=60, contribution_mode="tail", reg_user=0.5, user_reg_exponent=0.0, n_steps=2),
    dict(rank=32, reg_gravity=0.5, reg_item=40.0, item_reg_exponent=0.5, frequent_fraction=0.05,
         contribution_bound=60, contribution_mode="tail", reg_user=0.5, user_reg_exponent=0.0, n_steps=2),
]
RANKING_CANDIDATES: dict[float, list[dict[str, Any]]] = {eps: _RANKING_GRID_BEST for eps in EPSILONS}
ALS_RANKING_CANDIDATES = [
    dict(rank=32, n_iters=10, reg_gravity=0.5, reg_item=5.0, reg_user=0.5, item_reg_exponent=0.0,
         user_reg_exponent=0.0, global_mean=0.0),
    dict(rank=64, n_iters=10, reg_gravity=1.0, reg_item=5.0, reg_user=0.5, item_reg_exponent=0.0,
         user_reg_exponent=0.0, global_mean=0.0),
]


def _choose(candidates: list[dict], score: Callable[[dict], float], *, higher_is_better: bool) -> dict:
    scored = [(score(c), i) for i, c in enumerate(candidates)]
    best = max(scored) if higher_is_better else min(scored)
    return candidates[best[1]]


def _timed(fn: Callable[[], PublicModel]) -> tuple[PublicModel, float]:
    start = time.perf_counter()
    model = fn()
    return model, time.perf_counter() - start


def _dpals(train: Ratings, base: dict, params: dict, eps: float, delta: float, seed: int) -> PublicModel:
    return train_dpals(train, calibrate(eps, delta, DPALSConfig(**{**base, **params, "seed": seed})))


# ---------------------------------------------------------------------------- rating task
def rating_rows(quick: bool) -> list[dict]:
    train, valid, test = load_ml1m_rating_split()
    history = merge(train, valid)
    seeds = SEEDS[:1] if quick else SEEDS
    epsilons = (1.0, 20.0) if quick else EPSILONS

    def rmse_valid(model: PublicModel) -> float:
        return model_rmse(model, train, valid, clip=RATING_RANGE)

    als_params = ALS_RATING_CANDIDATES[0] if quick else _choose(
        ALS_RATING_CANDIDATES, lambda c: rmse_valid(train_als(train, ALSConfig(**c))), higher_is_better=False)
    als_scores, als_seconds = [], 0.0
    for seed in seeds:
        model, seconds = _timed(lambda: train_als(train, ALSConfig(**als_params, seed=seed)))
        als_scores.append(model_rmse(model, history, test, clip=RATING_RANGE))
        als_seconds += seconds
    als_mean, als_std = mean_std(als_scores)
    user_mean = rating_rmse(test, np.zeros(test.nnz), train=history, trained_mask=np.zeros(test.n_items, bool))
    rows = [
        make_row(SUITE, DATASET_RATING, "als", "rmse", als_mean, std=als_std, seeds=list(seeds),
                 seconds=als_seconds / len(seeds)),
        make_row(SUITE, DATASET_RATING, "user-mean", "rmse", user_mean),
    ]
    for eps in epsilons:
        candidates = RATING_CANDIDATES[eps][:1] if quick else RATING_CANDIDATES[eps]
        params = _choose(candidates, lambda c: rmse_valid(_dpals(train, _RATING_BASE, c, eps, RATING_DELTA, 0)),
                         higher_is_better=False)
        scores, seconds = [], 0.0
        for seed in seeds:
            model, took = _timed(lambda: _dpals(train, _RATING_BASE, params, eps, RATING_DELTA, seed))
            scores.append(model_rmse(model, history, test, clip=RATING_RANGE))
            seconds += took
        mean, std = mean_std(scores)
        rows.append(make_row(SUITE, DATASET_RATING, "dpals", "rmse", mean, epsilon=eps, delta=RATING_DELTA,
                             std=std, seeds=list(seeds), baseline=als_mean, seconds=seconds / len(seeds)))
    return rows


# ---------------------------------------------------------------------------- ranking task
def ranking_rows(quick: bool) -> list[dict]:
    split = load_ml1m_ranking_split()
    train = split.train
    delta = 1.0 / train.n_users
    seeds = SEEDS[:1] if quick else SEEDS
    epsilons = (1.0, 20.0) if quick else EPSILONS

    def recall(model: PublicModel, heldout) -> float:
        return model_ranking(model, heldout, 20)["recall@20"]

    als_params = ALS_RANKING_CANDIDATES[0] if quick else _choose(
        ALS_RANKING_CANDIDATES, lambda c: recall(train_als(train, ALSConfig(**c)), split.valid), higher_is_better=True)
    als_scores, als_seconds = [], 0.0
    for seed in seeds:
        model, seconds = _timed(lambda: train_als(train, ALSConfig(**als_params, seed=seed)))
        als_scores.append(recall(model, split.test))
        als_seconds += seconds
    als_mean, als_std = mean_std(als_scores)
    rows = [make_row(SUITE, DATASET_RANKING, "als", "recall@20", als_mean, std=als_std, seeds=list(seeds),
                     seconds=als_seconds / len(seeds))]
    for eps in epsilons:
        candidates = RANKING_CANDIDATES[eps][:1] if quick else RANKING_CANDIDATES[eps]
        params = _choose(candidates, lambda c: recall(_dpals(train, _RANKING_BASE, c, eps, delta, 0), split.valid),
                         higher_is_better=True)
        scores, seconds = [], 0.0
        for seed in seeds:
            model, took = _timed(lambda: _dpals(train, _RANKING_BASE, params, eps, delta, seed))
            scores.append(recall(model, split.test))
            seconds += took
        mean, std = mean_std(scores)
        rows.append(make_row(SUITE, DATASET_RANKING, "dpals", "recall@20", mean, epsilon=eps, delta=delta,
                             std=std, seeds=list(seeds), baseline=als_mean, seconds=seconds / len(seeds)))
    return rows


def run(quick: bool) -> list[dict]:
    with limit_threads(BLAS_THREADS):
        return rating_rows(quick) + ranking_rows(quick)
