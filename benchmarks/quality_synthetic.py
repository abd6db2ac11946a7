"""quality-synthetic: test RMSE vs epsilon on the DPALS paper's synthetic setup.

Setup (Chien et al. 2021, arXiv:2107.09802 Sec. 5; docs/algorithms.md §1): rank 5, m = 1000 items, n users, each entry
observed with p = 20 log(n) / m, orthonormal U*, V* scaled to unit rating std, plain Algorithm 1
(all items trained, uniform sampling, public mean 0). DPALS and non-private ALS run on the same
80/10/10 splits in the same run; "zero" is the predict-0 reference (RMSE ~ 1).

Hyper-parameters: the item ridge is chosen per (n, epsilon) on the *validation* split of a
separate tuning draw (seed 1000); the reported numbers are test RMSE on fresh draws.
"""

from __future__ import annotations

import time
from dataclasses import replace
from itertools import pairwise

import numpy as np

from app.core.data.ratings import Ratings
from app.core.data.splits import random_split
from app.core.data.synthetic import paper_synthetic
from app.core.mf.als import ALSConfig, train_als
from app.core.mf.dpals import DPALSConfig, calibrate, train_dpals
from benchmarks.evaluation import model_rmse
from benchmarks.harness import limit_threads, make_row, mean_std

SUITE = "quality-synthetic"
EPSILONS = (1.0, 5.0, 10.0, 20.0)
DELTA = 1e-5
SIZES = (5_000, 10_000, 20_000, 50_000)
SEEDS = (0, 1, 2)
TUNING_SEED = 1000
RIDGE_GRID = (50.0, 200.0, 800.0)
BLAS_THREADS = 2

ALS = ALSConfig(rank=5, n_iters=15, reg_item=0.5, item_reg_exponent=0.0, reg_user=0.5, user_reg_exponent=0.0)


def dpals_base(per_user: float) -> DPALSConfig:
    """Plain Algorithm 1 for this setup; k = the expected number of training ratings per user."""
    return DPALSConfig(
        rating_range=(-12.0, 12.0),  # public bound on |M_ij| (the data's max is ~8)
        rank=5, n_steps=2, reg_item=200.0, item_reg_exponent=0.0, reg_user=0.5, user_reg_exponent=0.0,
        contribution_bound=max(1, int(per_user)), contribution_mode="uniform", frequent_fraction=1.0,
        clip_user=1.0, clip_rating=3.0, mean_mode="public", public_mean=0.0,
        gram_noise_ratio=1.0, count_noise_ratio=20.0,  # counts only feed the (unused, μ = 0) ridge weights
    )


def _splits(n_users: int, seed: int) -> tuple[Ratings, Ratings, Ratings, float]:
    data = paper_synthetic(n_users, seed=seed)
    train, valid, test = random_split(data.ratings, (0.8, 0.1, 0.1), seed=seed)
    assert data.p is not None  # paper_synthetic records the observation probability it drew with
    return train, valid, test, data.p * 1000 * 0.8


def _dpals_rmse(config: DPALSConfig, epsilon: float, train: Ratings, test: Ratings) -> float:
    model = train_dpals(train, calibrate(epsilon, DELTA, config))
    return model_rmse(model, train, test)


def tune_ridge(n_users: int, epsilon: float) -> float:
    """Item ridge with the best validation RMSE on the tuning draw."""
    train, valid, _, per_user = _splits(n_users, TUNING_SEED)
    base = dpals_base(per_user)
    scores = {reg: _dpals_rmse(replace(base, reg_item=reg), epsilon, train, valid) for reg in RIDGE_GRID}
    return min(scores, key=scores.__getitem__)


def run(quick: bool) -> list[dict]:
    sizes = SIZES[:1] if quick else SIZES
    seeds = SEEDS[:1] if quick else SEEDS
    epsilons = (1.0, 20.0) if quick else EPSILONS
    rows: list[dict] = []
    with limit_threads(BLAS_THREADS):
        for n_users in sizes:
            ridges = {eps: (dpals_base(1).reg_item if quick else tune_ridge(n_users, eps)) for eps in epsilons}
            rows += _rows_for_size(n_users, seeds, epsilons, ridges)
    _print_monotonicity(rows)
    return rows


def _rows_for_size(n_users: int, seeds, epsilons, ridges: dict[float, float]) -> list[dict]:
    dataset = f"paper-synthetic-n{n_users}"
    als: list[float] = []
    zero: list[float] = []
    dp: dict[float, list[float]] = {eps: [] for eps in epsilons}
    als_seconds, dp_seconds = 0.0, {eps: 0.0 for eps in epsilons}
    for seed in seeds:
        train, _, test, per_user = _splits(n_users, seed)
        zero.append(float(np.sqrt(np.mean(test.csr.data**2))))
        start = time.perf_counter()
        als.append(model_rmse(train_als(train, ALS), train, test))
        als_seconds += time.perf_counter() - start
        for eps in epsilons:
            start = time.perf_counter()
            config = replace(dpals_base(per_user), reg_item=ridges[eps], seed=seed)
            dp[eps].append(_dpals_rmse(config, eps, train, test))
            dp_seconds[eps] += time.perf_counter() - start
    als_mean, als_std = mean_std(als)
    zero_mean, zero_std = mean_std(zero)
    rows = [
        make_row(SUITE, dataset, "als", "rmse", als_mean, std=als_std, seeds=list(seeds), seconds=als_seconds / len(seeds)),
        make_row(SUITE, dataset, "zero", "rmse", zero_mean, std=zero_std, seeds=list(seeds)),
    ]
    for eps in epsilons:
        mean, std = mean_std(dp[eps])
        rows.append(make_row(SUITE, dataset, "dpals", "rmse", mean, epsilon=eps, delta=DELTA, std=std,
                             seeds=list(seeds), baseline=als_mean, seconds=dp_seconds[eps] / len(seeds)))
        rows.append(make_row(SUITE, dataset, "dpals", "rmse_gap_vs_als", mean - als_mean, epsilon=eps,
                             delta=DELTA, seeds=list(seeds)))
    return rows


def _print_monotonicity(rows: list[dict]) -> None:
    """Report (not assert) whether the DPALS/ALS gap shrinks with epsilon and with n."""
    gaps = {(r["dataset"], r["epsilon"]): r["value"] for r in rows if r["metric"] == "rmse_gap_vs_als"}
    datasets = sorted({d for d, _ in gaps}, key=lambda d: int(d.rsplit("n", 1)[1]))
    epsilons = sorted({e for _, e in gaps})
    by_eps = all(
        all(gaps[(d, a)] >= gaps[(d, b)] for a, b in pairwise(epsilons)) for d in datasets
    )
    by_n = all(
        all(gaps[(a, e)] >= gaps[(b, e)] for a, b in pairwise(datasets)) for e in epsilons
    )
    print(f"[quality-synthetic] gap shrinks monotonically with epsilon: {by_eps}; with n: {by_n}")
