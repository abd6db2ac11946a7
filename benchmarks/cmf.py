"""cmf: DP-CMF with public item data next to DPALS and non-private ALS on MovieLens-1M, in one run.

Public data (Curmei et al. 2023, arXiv:2309.11516; docs/algorithms.md §3):

* ``genres``: ML-1M's 18 genres from ``movies.dat`` as metadata tokens (binary rows);
* ``public-users``: a seeded random 10% of the training users opt in: their training ratings
  become public rows of S and are removed from the private data (``split_public_users``).

Every private model (DPALS and the DP-CMF variants) trains on the same private data: the training
users minus the public ones. Scores are on private users only (the public users' test ratings
are left out). ALS, the non-private reference, trains on all training users. Gap closed at each
epsilon = (DPALS - DP-CMF) / (DPALS - ALS) for RMSE, (DP-CMF - DPALS) / (ALS - DPALS) for Recall@20.

* Rating task: canonical 80/10/10 split, delta = 1e-5, RMSE, users folded in from train (validation)
  or train + validation (test), untrained items predicted by the user's mean (quality-ml1m's
  protocol). Also RMSE by item popularity: four quartiles of items by training count (head ->
  tail) and the items outside the DPALS frequent set of the same run (same seed: same set).
* Ranking task: canonical held-out users (ratings >= 4 positive, binary), delta = 1/n, Recall@20;
  DP-CMF uses the implicit variant (private w0 = reg_gravity, public w0_F).

Selection, all on validation (seed 0), never on test: DPALS's config among quality-ml1m's
candidates; then, with DPALS's config fixed (the paper's procedure, Sec. 4.1), each DP-CMF variant's
public-side parameters (alpha, lambda_F, w0_F) from a small grid. Test scores: mean over seeds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from app.core.data.datasets import load_ml1m
from app.core.data.ratings import Ratings
from app.core.data.splits import HeldoutSet, load_ml1m_ranking_split, load_ml1m_rating_split, merge
from app.core.eval.metrics import factor_predictions, rating_rmse
from app.core.mf.als import ALSConfig, train_als
from app.core.mf.dpcmf import DPCMFConfig, PublicData, calibrate, metadata_source, split_public_users, train_dpcmf
from app.core.mf.foldin import fold_in_users, user_offsets
from app.core.mf.model import PublicModel
from benchmarks.evaluation import model_ranking
from benchmarks.harness import limit_threads, make_row, mean_std
from benchmarks.quality_ml1m import (
    _RANKING_BASE,
    _RANKING_GRID_BEST,
    _RATING_BASE,
    _RATING_SEARCH_BEST,
    ALS_RANKING_CANDIDATES,
    ALS_RATING_CANDIDATES,
    RATING_DELTA,
    RATING_RANGE,
)

SUITE = "cmf"
EPSILONS = (1.0, 5.0, 10.0, 20.0)
SEEDS = (0, 1, 2)
PUBLIC_FRACTION = 0.1
PUBLIC_SEED = 0
BLAS_THREADS = 2
VARIANTS = ("dpals", "cmf-genres", "cmf-public-users", "cmf-both")
SOURCES = {"dpals": (), "cmf-genres": ("metadata",), "cmf-public-users": ("public_users",),
           "cmf-both": ("metadata", "public_users")}

# Public-side grids per variant and task (alpha_metadata, alpha_public_users, reg_feature, w0_F).
# The first point of each grid is the one --quick uses.
_RATING_GRIDS: dict[str, list[dict[str, float]]] = {
    "cmf-genres": [dict(alpha_metadata=a, reg_feature=f, public_unobserved_weight=0.1)
                   for a, f in itertools.product((300.0, 30.0, 100.0, 1000.0), (300.0, 100.0, 1000.0))],
    "cmf-public-users": [dict(alpha_public_users=a, reg_feature=f)
                         for a, f in itertools.product((100.0, 10.0, 30.0, 300.0, 1000.0), (300.0, 100.0, 1000.0))],
    "cmf-both": [dict(alpha_metadata=m, alpha_public_users=a, reg_feature=f, public_unobserved_weight=0.1)
                 for m, a, f in itertools.product((300.0, 100.0), (100.0, 10.0, 300.0), (300.0, 1000.0))],
}
_RANKING_GRIDS: dict[str, list[dict[str, float]]] = {
    "cmf-genres": [dict(alpha_metadata=a, reg_feature=f, public_unobserved_weight=w)
                   for a, f, w in itertools.product((10.0, 1.0, 100.0), (100.0, 10.0), (0.1, 1.0))],
    "cmf-public-users": [dict(alpha_public_users=a, reg_feature=f, public_unobserved_weight=w)
                         for a, f, w in itertools.product((100.0, 10.0, 300.0, 1000.0), (10.0, 100.0), (0.1, 1.0))],
    "cmf-both": [dict(alpha_metadata=m, alpha_public_users=a, reg_feature=f, public_unobserved_weight=0.1)
                 for m, a, f in itertools.product((10.0, 1.0), (100.0, 10.0, 300.0), (10.0, 100.0))],
}
# --quick trains quality-ml1m's candidate tuned for each epsilon without selecting
_QUICK_RATING = {20.0: 0, 10.0: 1, 5.0: 2, 1.0: 3}
_QUICK_RANKING = {20.0: 0, 10.0: 0, 5.0: 1, 1.0: 1}


@dataclass(frozen=True)
class _Task:
    """One protocol: private and full training data, public sources, validation and test scores."""

    dataset: str
    metric: str
    higher_is_better: bool
    private_train: Ratings
    full_train: Ratings
    public: dict[str, Any]  # source name -> PublicSource
    base: dict[str, Any]
    delta: float
    dpals_candidates: list[dict[str, Any]]
    als_candidates: list[dict[str, Any]]
    grids: dict[str, list[dict[str, float]]]
    quick_dpals: dict[float, int]
    valid_score: Callable[[PublicModel], float]
    test_score: Callable[[PublicModel], float]
    slices: Callable[[PublicModel, PublicModel], dict[str, float]] | None = None

    def better(self, a: float, b: float) -> bool:
        return a > b if self.higher_is_better else a < b


def _train(task: _Task, params: dict, eps: float, seed: int, variant: str) -> PublicModel:
    config = calibrate(eps, task.delta, DPCMFConfig(**{**task.base, **params, "seed": seed}))
    public = PublicData(tuple(task.public[s] for s in SOURCES[variant]))
    return train_dpcmf(task.private_train, config, public=public)


def _valid_score(task: _Task, eps: float, variant: str, fixed: dict, params: dict) -> float:
    """Validation score of ``variant`` trained (seed 0) on ``params`` over the ``fixed`` ones."""
    return task.valid_score(_train(task, {**fixed, **params}, eps, 0, variant))


def _best(task: _Task, candidates: list[dict], score: Callable[[dict], float], quick: bool) -> dict:
    """The candidate with the best validation score (the first one under --quick)."""
    if quick or len(candidates) == 1:
        return candidates[0]
    best, best_score = candidates[0], score(candidates[0])
    for c in candidates[1:]:
        s = score(c)
        if task.better(s, best_score):
            best, best_score = c, s
    return best


def _epsilon_rows(task: _Task, eps: float, seeds, quick: bool, als_mean: float) -> list[dict]:
    """DPALS, then each DP-CMF variant with DPALS's config fixed, selected on validation."""
    candidates = [task.dpals_candidates[task.quick_dpals[eps]]] if quick else task.dpals_candidates
    dpals = _best(task, candidates, partial(_valid_score, task, eps, "dpals", {}), quick)
    chosen = {"dpals": dpals}
    for variant in VARIANTS[1:]:
        chosen[variant] = {**dpals, **_best(task, task.grids[variant], partial(_valid_score, task, eps, variant, dpals), quick)}
    scores: dict[str, list[float]] = {v: [] for v in VARIANTS}
    slices: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for seed in seeds:
        models = {v: _train(task, chosen[v], eps, seed, v) for v in VARIANTS}
        for v, model in models.items():
            scores[v].append(task.test_score(model))
            if task.slices is not None:
                slices[v].append(task.slices(model, models["dpals"]))
    dpals_mean = float(np.mean(scores["dpals"]))
    rows = []
    for v in VARIANTS:
        mean, std = mean_std(scores[v])
        rows.append(make_row(SUITE, task.dataset, v, task.metric, mean, epsilon=eps, delta=task.delta, std=std,
                             seeds=list(seeds), baseline=als_mean))
        if v != "dpals":
            gap = als_mean - dpals_mean
            rows.append(make_row(SUITE, task.dataset, v, f"gap-closed({task.metric})", (mean - dpals_mean) / gap,
                                 epsilon=eps, delta=task.delta, seeds=list(seeds)))
        for name in (slices[v][0] if slices[v] else {}):
            m, s = mean_std([x[name] for x in slices[v]])
            rows.append(make_row(SUITE, task.dataset, v, f"{task.metric}[{name}]", m, epsilon=eps,
                                 delta=task.delta, std=s, seeds=list(seeds)))
    return rows


def task_rows(task: _Task, quick: bool) -> list[dict]:
    seeds = SEEDS[:1] if quick else SEEDS
    epsilons = (1.0, 20.0) if quick else EPSILONS
    als_params = _best(task, task.als_candidates,
                       lambda c: task.valid_score(train_als(task.full_train, ALSConfig(**c))), quick)
    als_scores = [task.test_score(train_als(task.full_train, ALSConfig(**als_params, seed=s))) for s in seeds]
    als_mean, als_std = mean_std(als_scores)
    rows = [make_row(SUITE, task.dataset, "als", task.metric, als_mean, std=als_std, seeds=list(seeds))]
    for eps in epsilons:
        rows += _epsilon_rows(task, eps, seeds, quick, als_mean)
    return rows


# ---------------------------------------------------------------------------- data
def _public_user_ids(users: np.ndarray) -> np.ndarray:
    """A seeded random PUBLIC_FRACTION of the users (they opt in to public ratings)."""
    n = int(round(PUBLIC_FRACTION * len(users)))
    return np.sort(np.random.default_rng(PUBLIC_SEED).choice(users, size=n, replace=False))


def _private_only(ratings: Ratings, public_ids: np.ndarray) -> Ratings:
    """``ratings`` without the public users' entries (same id spaces)."""
    rows, _, _ = ratings.coo()
    return ratings.select(~np.isin(ratings.user_ids[rows], public_ids))


def _genres(item_ids: np.ndarray):
    data = load_ml1m()
    if data.item_features is None:
        raise ValueError("ml-1m was loaded without its genres")
    by_id = dict(zip(data.ratings.item_ids.tolist(), data.item_features, strict=True))
    return metadata_source([by_id.get(i, ()) for i in item_ids.tolist()])


def _predictions(model: PublicModel, history: Ratings, test: Ratings) -> np.ndarray:
    """offset + u·v_j for every test entry (users folded in from ``history``)."""
    rows, _, _ = test.coo()
    return factor_predictions(test, fold_in_users(model, history), model.item_factors) + user_offsets(model, history)[rows]


def _popularity_slices(train: Ratings, history: Ratings, test: Ratings) -> Callable:
    """RMSE per item-popularity quartile (by training count, head -> tail) and outside DPALS's set."""
    counts = train.item_counts()
    order = np.argsort(-counts, kind="stable")
    quartile = np.empty(train.n_items, dtype=np.int64)
    quartile[order] = np.arange(train.n_items) * 4 // train.n_items
    _, cols, _ = test.coo()

    def slices(model: PublicModel, dpals_model: PublicModel) -> dict[str, float]:
        pred = _predictions(model, history, test)
        masks = {f"q{q + 1}{'-head' if q == 0 else '-tail' if q == 3 else ''}": quartile[cols] == q for q in range(4)}
        masks["outside-dpals-set"] = ~dpals_model.trained_mask[cols]
        return {name: rating_rmse(test.select(m), pred[m], train=history, trained_mask=model.trained_mask,
                                  clip=RATING_RANGE) for name, m in masks.items() if m.any()}

    return slices


def rating_task() -> _Task:
    train, valid, test = load_ml1m_rating_split()
    public_ids = _public_user_ids(train.user_ids)
    private_train, public_users = split_public_users(train, public_ids)
    history, valid_p, test_p = (_private_only(r, public_ids) for r in (train, valid, test))
    test_history = merge(history, valid_p)

    def rmse(model: PublicModel, hist: Ratings, target: Ratings) -> float:
        return rating_rmse(target, _predictions(model, hist, target), train=hist, trained_mask=model.trained_mask,
                           clip=RATING_RANGE)

    return _Task(
        dataset="ml-1m-80-10-10-private-users", metric="rmse", higher_is_better=False,
        private_train=private_train, full_train=train,
        public={"metadata": _genres(train.item_ids), "public_users": public_users},
        base=_RATING_BASE, delta=RATING_DELTA, dpals_candidates=_RATING_SEARCH_BEST,
        als_candidates=ALS_RATING_CANDIDATES, grids=_RATING_GRIDS, quick_dpals=_QUICK_RATING,
        valid_score=lambda m: rmse(m, history, valid_p), test_score=lambda m: rmse(m, test_history, test_p),
        slices=_popularity_slices(train, test_history, test_p),
    )


def ranking_task() -> _Task:
    split = load_ml1m_ranking_split()
    public_ids = _public_user_ids(split.train.user_ids)
    private_train, public_users = split_public_users(split.train, public_ids)

    def recall(model: PublicModel, held: HeldoutSet) -> float:
        return model_ranking(model, held, 20)["recall@20"]

    return _Task(
        dataset="ml-1m-heldout-users", metric="recall@20", higher_is_better=True,
        private_train=private_train, full_train=split.train,
        public={"metadata": _genres(split.train.item_ids), "public_users": public_users},
        base={**_RANKING_BASE, "implicit": True}, delta=1.0 / private_train.n_users,
        dpals_candidates=_RANKING_GRID_BEST, als_candidates=ALS_RANKING_CANDIDATES, grids=_RANKING_GRIDS,
        quick_dpals=_QUICK_RANKING,
        valid_score=lambda m: recall(m, split.valid), test_score=lambda m: recall(m, split.test),
    )


def run(quick: bool) -> list[dict]:
    with limit_threads(BLAS_THREADS):
        return task_rows(rating_task(), quick) + task_rows(ranking_task(), quick)
