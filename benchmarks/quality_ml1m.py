"""quality-ml1m: DPALS next to non-private ALS on MovieLens-1M, in one run.

Data: ``../shared/data/ml-1m`` with its canonical splits (research use only; read at run time).

* Rating task (docs/algorithms.md §1 protocol): canonical 80/10/10 split, delta = 1e-5. Hyper-parameters
  are chosen on the validation split (train on train, users folded in from train); the reported
  test RMSE uses users re-projected from train + validation, exactly as the privileged endpoint
  would. Untrained (infrequent) items are predicted by the user's mean. ``user-mean`` is that
  fallback alone.
* Ranking task: canonical held-out users (ratings >= 4 are positives), delta = 1/n with n the
  number of training users. Held-out users are folded in from their history only; Recall@20 and
  NDCG@20 with the history excluded, chosen on validation users, reported on test users.

The candidate configurations below came out of random searches scored on the validation split (never on
test); the suite re-selects among them on validation in every run. Candidates: the service's ε-aware
default, the default with one more step (and twice the contribution bound: twice the bound it releases
from the data), the default with the changes listed per ε (found by random searches around it, confirmed
on two more validation seeds), and earlier search winners. The pooled candidates (``gram_pooling``,
``average_last``: post-processing of the releases) came from one-factor variations and random searches
around the default on the validation splits at δ = 1e-4 (seeds 0-2 or 0-1), never on test. The last
ranking candidate at ε = 20 (rank 64, seven steps) is the refinement of the earlier one (ridge 160 →
120, gravity 0.3 → 0.4) by one-factor variations around it on validation, seeds 0-2 at δ = 1e-4:
Recall@20 0.3337 vs 0.3299.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from app.core.algorithms import resolve_hyperparameters
from app.core.data.ratings import Ratings
from app.core.data.splits import load_ml1m_ranking_split, load_ml1m_rating_split, merge
from app.core.eval.metrics import rating_rmse
from app.core.mf.als import ALSConfig, train_als
from app.core.mf.dpals import DPALSConfig, calibrate, train_dpals
from app.core.mf.model import PublicModel
from benchmarks.evaluation import model_ranking, model_rmse
from benchmarks.harness import limit_threads, make_row, mean_std

SUITE = "quality-ml1m"
DATASET_RATING = "ml-1m-80-10-10"
DATASET_RANKING = "ml-1m-heldout-users"
EPSILONS = (1.0, 5.0, 10.0, 20.0)
RATING_DELTA = 1e-5  # the session-1 tables' delta
RATING_DELTAS = (1e-4, RATING_DELTA)  # 1e-4: the published reference code's experiments
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
# changes to the ε-aware default for ε >= 5: no Wiener filter, more steps (the filter 10/ε³ is already
# faint there; more steps pay off on ML-1M's 6,040 users but not on ML-100K's 943, so not in the rule)
_RATING_UNFILTERED = dict(noise_filter=0.0, n_steps=5, contribution_bound=480)
# with the pooled item Grams and the mean of the last released V's (DPALS post-processing: gram_pooling,
# average_last), more steps pay off: each step's noise is averaged out instead of accumulating
_POOLED = dict(gram_pooling=1000.0)
_RATING_POOLED = dict(_POOLED, noise_filter=0.0, n_steps=8, average_last=4, contribution_bound=480,
                      frequent_fraction=0.5, bias_noise_ratio=0.8, gram_noise_ratio=2.5)
RATING_DEFAULT_CHANGES: dict[float, list[dict[str, Any]]] = {
    5.0: [dict(noise_filter=0.0, n_steps=4), dict(_POOLED, noise_filter=0.0, n_steps=8, average_last=4),
          dict(_POOLED, noise_filter=0.0, n_steps=6, average_last=3)],
    10.0: [_RATING_UNFILTERED, dict(noise_filter=0.0, n_steps=5, reg_item=320.0, clip_user=0.75,
                                    gram_noise_ratio=2.5), _RATING_POOLED],
    20.0: [_RATING_UNFILTERED, dict(noise_filter=0.0, n_steps=6, contribution_bound=480, frequent_fraction=0.5,
                                    bias_noise_ratio=0.8, gram_noise_ratio=2.5),
           _RATING_POOLED, dict(_RATING_POOLED, frequent_fraction=0.6),
           dict(_RATING_POOLED, gram_pooling=10.0, reg_item=320.0, frequent_fraction=0.6, bias_noise_ratio=1.2,
                item_reg_exponent=0.25)],
}
ALS_RATING_CANDIDATES = [
    dict(rank=16, n_iters=10, reg_item=10.0, reg_user=0.1, item_reg_exponent=1.0),
    dict(rank=32, n_iters=10, reg_item=20.0, reg_user=0.1, item_reg_exponent=1.0),
]

# positives-only data: no centring at all (a per-user mean of all-ones data would erase it)
_RANKING_BASE = dict(rating_range=(0.0, 1.0), mean_mode="public", public_mean=0.0, clip_rating=1.0,
                     user_centering=False, init_scale=1.0, count_noise_ratio=2.0, gram_noise_ratio=2.0,
                     objective="ranking", positive_threshold=1.0, item_bias=False)
_RANKING_GRID_BEST = [  # best of a small grid per epsilon, scored on validation users
    dict(rank=32, reg_gravity=0.5, reg_item=160.0, item_reg_exponent=0.5, frequent_fraction=0.1,
         contribution_bound=60, contribution_mode="tail", reg_user=0.5, user_reg_exponent=0.0, n_steps=2),
    dict(rank=32, reg_gravity=0.5, reg_item=40.0, item_reg_exponent=0.5, frequent_fraction=0.05,
         contribution_bound=60, contribution_mode="tail", reg_user=0.5, user_reg_exponent=0.0, n_steps=2),
]
RANKING_CANDIDATES: dict[float, list[dict[str, Any]]] = {eps: _RANKING_GRID_BEST for eps in EPSILONS}
# changes to the ε-aware default: the winners of random searches around it at ε = 10 and 20 (validation
# users, seed 0; each confirmed on seeds 1 and 2 of the validation split, never on test)
_RANKING_LONGER = dict(n_steps=5, clip_user=0.2, contribution_bound=60, reg_user=0.1, frequent_fraction=0.15)
_RANKING_WIDER = dict(n_steps=5, clip_user=0.2, contribution_bound=120, reg_user=0.25, frequent_fraction=0.2,
                      reg_gravity=1.0)
_RANKING_POOLED = dict(_RANKING_LONGER, **_POOLED, n_steps=6, average_last=4)
RANKING_DEFAULT_CHANGES: dict[float, list[dict[str, Any]]] = {
    1.0: [dict(_POOLED, n_steps=5, average_last=3), dict(_POOLED, n_steps=4, average_last=2)],
    5.0: [dict(_POOLED, n_steps=5, average_last=3), dict(_POOLED, n_steps=5, average_last=4)],
    10.0: [_RANKING_LONGER, _RANKING_WIDER, _RANKING_POOLED, dict(_RANKING_POOLED, frequent_fraction=0.2)],
    20.0: [_RANKING_LONGER, _RANKING_WIDER, _RANKING_POOLED, dict(_RANKING_POOLED, frequent_fraction=0.2),
           dict(_RANKING_POOLED, frequent_fraction=0.2, rank=64, n_steps=8, reg_user=0.05, gram_noise_ratio=1.5),
           dict(_RANKING_POOLED, rank=64, n_steps=7, reg_user=0.05, clip_user=0.15, frequent_fraction=0.2,
                reg_gravity=0.4, count_noise_ratio=3.0, reg_item=120.0)],
}
ALS_RANKING_CANDIDATES = [
    dict(rank=32, n_iters=10, reg_gravity=0.5, reg_item=5.0, reg_user=0.5, item_reg_exponent=0.0,
         user_reg_exponent=0.0, global_mean=0.0),
    dict(rank=64, n_iters=10, reg_gravity=1.0, reg_item=5.0, reg_user=0.5, item_reg_exponent=0.0,
         user_reg_exponent=0.0, global_mean=0.0),
]


@dataclass(frozen=True)
class _Task:
    """One evaluation protocol: what to train on, how validation and test are scored."""

    dataset: str
    metric: str
    higher_is_better: bool
    train: Ratings
    valid_score: Callable[[PublicModel], float]
    test_score: Callable[[PublicModel], float]
    dpals_base: dict[str, Any]
    deltas: tuple[float, ...]
    als_candidates: list[dict[str, Any]]
    dpals_candidates: dict[float, list[dict[str, Any]]]
    objective: str
    default_changes: dict[float, list[dict[str, Any]]]
    extra_scores: Callable[[PublicModel], dict[str, float]] = lambda model: {}


def _select_and_test(
    task: _Task, candidates: list[dict], make_model: Callable[[dict, int], PublicModel], seeds, quick: bool
) -> tuple[float, float | None, float, dict[str, list[float]]]:
    """Pick the candidate with the best validation score (seed 0), then test it on every seed.

    Returns (mean, std, seconds per training run, extra test scores per seed).
    """
    if quick or len(candidates) == 1:
        params = candidates[0]
    else:
        scored = [(task.valid_score(make_model(c, 0)), i) for i, c in enumerate(candidates)]
        params = candidates[(max(scored) if task.higher_is_better else min(scored))[1]]
    scores: list[float] = []
    seconds = 0.0
    extras: dict[str, list[float]] = {}
    for seed in seeds:
        start = time.perf_counter()
        model = make_model(params, seed)
        seconds += time.perf_counter() - start
        scores.append(task.test_score(model))
        for name, value in task.extra_scores(model).items():
            extras.setdefault(name, []).append(value)
    mean, std = mean_std(scores)
    return mean, std, seconds / len(seeds), extras


def _candidates(task: _Task, eps: float, delta: float) -> list[dict[str, Any]]:
    """The ε-aware default (the service's rule) first, the default with one more step (and with
    twice the contribution bound too), the default with each of the task's changes at ε, then the
    search winners. A change of the contribution bound scales the bound the default releases
    (:func:`_bound_change`)."""
    default, _ = resolve_hyperparameters("dpals", {}, objective=task.objective, epsilon=eps, delta=delta,
                                         rating_range=task.dpals_base["rating_range"], n_items=task.train.n_items)
    longer = {**default, "n_steps": default["n_steps"] + 1}
    wider = {**longer, **_bound_change(default, 2 * default["contribution_bound"])}
    changed = [{**default, **change, **_bound_change(default, change.get("contribution_bound")), **_ridge_change(change)}
               for change in task.default_changes.get(eps, [])]
    return [default, longer, wider, *changed] + task.dpals_candidates[eps]


def _ridge_change(change: dict[str, Any]) -> dict[str, Any]:
    """A candidate that sets the user ridge runs with that ridge: the default's rule-14 law, which would
    lower it to the ridge the released user total gives, is off for it."""
    return {"ridge_users_scale": 0.0} if "reg_user" in change else {}


def _bound_change(default: dict[str, Any], bound: int | None) -> dict[str, Any]:
    """A candidate's contribution bound as the defaults (rule 8) mean it: where the default releases
    its bound from the data (k = clamp(scale·q̃, bound_min, contribution_bound)), a candidate that sets
    ``bound`` in place of the default's largest k scales the released k by the same ratio (the
    changes were found when k was the bound itself; raising only the cap would leave k at the data's
    quantile and the change without effect)."""
    if bound is None or not default.get("bound_quantile"):
        return {} if bound is None else {"contribution_bound": bound}
    ratio = bound / default["contribution_bound"]
    return {"contribution_bound": bound, "bound_scale": round(default.get("bound_scale", 1.0) * ratio, 6)}


def task_rows(task: _Task, quick: bool) -> list[dict]:
    """Non-private ALS, then DPALS at each epsilon and delta, each selected on validation."""
    seeds = SEEDS[:1] if quick else SEEDS
    epsilons = (1.0, 20.0) if quick else EPSILONS
    deltas = task.deltas[:1] if quick else task.deltas
    als_mean, als_std, als_seconds, _ = _select_and_test(
        task, task.als_candidates, lambda c, seed: train_als(task.train, ALSConfig(**c, seed=seed)), seeds, quick
    )
    rows = [make_row(SUITE, task.dataset, "als", task.metric, als_mean, std=als_std, seeds=list(seeds),
                     seconds=als_seconds)]
    for delta in deltas:
        for eps in epsilons:
            mean, std, seconds, extras = _select_and_test(
                task, _candidates(task, eps, delta),
                partial(_dpals, task.train, task.dpals_base, eps, delta), seeds, quick,
            )
            rows.append(make_row(SUITE, task.dataset, "dpals", task.metric, mean, epsilon=eps, delta=delta,
                                 std=std, seeds=list(seeds), baseline=als_mean, seconds=seconds))
            for name, values in extras.items():
                algorithm, metric = name.split("/")
                m, sd = mean_std(values)
                rows.append(make_row(SUITE, task.dataset, algorithm, metric, m, epsilon=eps, delta=delta,
                                     std=sd, seeds=list(seeds)))
    return rows


def _dpals(train: Ratings, base: dict, eps: float, delta: float, params: dict, seed: int) -> PublicModel:
    return train_dpals(train, calibrate(eps, delta, DPALSConfig(**{**base, **params, "seed": seed})))


def rating_rows(quick: bool) -> list[dict]:
    """Rating task: RMSE, users re-projected from train + validation for the test."""
    train, valid, test = load_ml1m_rating_split()
    history = merge(train, valid)
    task = _Task(
        dataset=DATASET_RATING, metric="rmse", higher_is_better=False, train=train,
        valid_score=lambda model: model_rmse(model, train, valid, clip=RATING_RANGE),
        test_score=lambda model: model_rmse(model, history, test, clip=RATING_RANGE),
        dpals_base=_RATING_BASE, deltas=RATING_DELTAS,
        als_candidates=ALS_RATING_CANDIDATES, dpals_candidates=RATING_CANDIDATES, objective="rating",
        default_changes=RATING_DEFAULT_CHANGES,
        extra_scores=lambda model: {"dpals/rmse_unclipped": model_rmse(model, history, test)},
    )
    empty = np.zeros(test.n_items, dtype=bool)
    user_mean = rating_rmse(test, np.zeros(test.nnz), train=history, trained_mask=empty)
    train_mean = rating_rmse(test, np.full(test.nnz, history.csr.data.mean()), train=history)
    return task_rows(task, quick) + [make_row(SUITE, DATASET_RATING, "user-mean", "rmse", user_mean),
                                     make_row(SUITE, DATASET_RATING, "training-mean", "rmse", train_mean)]


def _popularity(model: PublicModel, heldout) -> float:
    """Recall@20 of ranking by the run's own DP counts (free post-processing of the release)."""
    ranked = replace(model, item_factors=np.zeros_like(model.item_factors), item_biases=np.log(model.item_counts),
                     trained_mask=np.ones(model.n_items, dtype=bool), config={**model.config, "objective": "ranking"})
    return model_ranking(ranked, heldout, 20)["recall@20"]


def ranking_rows(quick: bool) -> list[dict]:
    """Ranking task: Recall@20 of held-out users folded in from their history only."""
    split = load_ml1m_ranking_split()
    task = _Task(
        dataset=DATASET_RANKING, metric="recall@20", higher_is_better=True, train=split.train,
        valid_score=lambda model: model_ranking(model, split.valid, 20)["recall@20"],
        test_score=lambda model: model_ranking(model, split.test, 20)["recall@20"],
        dpals_base=_RANKING_BASE, deltas=(1e-4, 1.0 / split.train.n_users),
        als_candidates=ALS_RANKING_CANDIDATES, dpals_candidates=RANKING_CANDIDATES, objective="ranking",
        default_changes=RANKING_DEFAULT_CHANGES,
        extra_scores=lambda model: {"popularity/recall@20": _popularity(model, split.test)},
    )
    return task_rows(task, quick)


def run(quick: bool) -> list[dict]:
    with limit_threads(BLAS_THREADS):
        return rating_rows(quick) + ranking_rows(quick)
