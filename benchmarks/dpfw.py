"""dpfw: private Frank-Wolfe (Jain et al. 2018) next to DPALS and non-private ALS.

1. Paper synthetic (Chien et al. 2021, arXiv:2107.09802 Sec. 5; docs/algorithms.md §1): rank 5, m = 1000 items, n users,
   80/10/10 random split, delta = 1e-5. Test RMSE vs epsilon for dpfw, dpals (quality-synthetic's
   plain Algorithm-1 config and ridge tuning), non-private ALS and predicting zero. Checks the
   DPALS paper's claims: DPALS >= 7x better than DPFW at n = 50K, DPFW at epsilon = 1 no better
   than zero (printed, not asserted).
2. Jester-1 (all 100 jokes) and MovieLens-1M restricted to its 400 most rated items (popularity
   counted on the *training split only*; the selection itself is not charged to the budget, as in
   the papers' "top-400" setups): RMSE vs epsilon, delta = 1e-6, dpfw/dpals/als in one run.
   Jester uses a seeded 80/10/10 random split, ML-1M the canonical split. Test users are replayed
   from train + validation ratings.
3. Private Oja vs the exact top eigenvector of the noiseless first-step W = Σ A_iᵀA_i (Lanczos on
   Aᵀ(A v)), at n = 400, 4,000 and 20,000 items: |cos| to the exact vector, relative Rayleigh gap
   and seconds per eigen-step; dense noisy eigh where it fits (not at 20,000: a row records the
   memory it would need).

All hyper-parameters (k, L, T, ξ for DPFW; the candidates of DPALS and ALS) are chosen on the
validation split (of a separate tuning draw for the synthetic data); test numbers are reported.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
import scipy.sparse.linalg as spla

from app.core.data.datasets import DatasetUnavailable, load_jester1
from app.core.data.ratings import Ratings
from app.core.data.splits import load_ml1m_rating_split, merge, random_split
from app.core.data.synthetic import paper_synthetic
from app.core.eval.metrics import rmse
from app.core.mf.als import ALSConfig, train_als
from app.core.mf.dpals import DPALSConfig, train_dpals
from app.core.mf.dpals import calibrate as calibrate_dpals
from app.core.mf.dpfw import (
    DPFWConfig,
    gram_product,
    predict_dpfw,
    prepare_rows,
    top_eigenvector_dense,
    top_eigenvector_oja,
    train_dpfw,
)
from app.core.mf.dpfw import (
    calibrate as calibrate_dpfw,
)
from app.core.mf.model import PublicModel
from app.core.privacy.releaser import GaussianReleaser
from benchmarks.evaluation import model_rmse
from benchmarks.harness import format_table, limit_threads, make_row, mean_std
from benchmarks.quality_synthetic import ALS as SYNTHETIC_ALS
from benchmarks.quality_synthetic import RIDGE_GRID, dpals_base

SUITE = "dpfw"
BLAS_THREADS = 2
SYN_EPSILONS = (1.0, 5.0, 10.0, 20.0)
SYN_DELTA = 1e-5
SYN_SIZES = (5_000, 10_000, 20_000, 50_000)
SYN_SEEDS = (0, 1, 2)
TUNING_SEED = 1000
REAL_EPSILONS = (1.0, 5.0, 10.0, 20.0)
REAL_DELTA = 1e-6
OJA_SIZES = (400, 4_000, 20_000)

# DPFW grid, relative to a public unit (typical size of one centred rating): L = L_rel·unit·sqrt(ξ),
# k = k_rel·unit·sqrt(m·n) (the nuclear norm of an m × n matrix of unit-std entries of rank ~1).
DPFW_GRID = [dict(k_rel=k_rel, n_steps=t, xi=30, l_rel=0.7) for k_rel in (0.5, 1.5) for t in (4, 10)]
DPFW_GRID.append(dict(k_rel=1.0, n_steps=5, xi=80, l_rel=1.0))
DPFW_QUICK = dict(k_rel=1.0, n_steps=5, xi=80, l_rel=1.0)


def dpfw_config(params: dict[str, Any], unit: float, n_users: int, n_items: int, seed: int = 0) -> DPFWConfig:
    xi = int(min(params["xi"], n_items))
    return DPFWConfig(
        nuclear_norm=params["k_rel"] * unit * math.sqrt(n_users * n_items), n_steps=int(params["n_steps"]),
        row_clip=params["l_rel"] * unit * math.sqrt(xi), max_ratings_per_user=xi, eigen_method="auto",
        noise_multiplier=1.0, seed=seed,
    )


def _dpfw_rmse(params, unit, eps, delta, train: Ratings, history: Ratings, test: Ratings, seed: int = 0) -> tuple[float, float]:
    config = calibrate_dpfw(eps, delta, dpfw_config(params, unit, train.n_users, train.n_items, seed), train.n_items)
    start = time.perf_counter()
    model = train_dpfw(train, config)
    seconds = time.perf_counter() - start
    return rmse(predict_dpfw(model, history, test), test.csr.data), seconds


def _tune_dpfw(unit, eps, delta, train, valid, quick: bool) -> dict[str, Any]:
    if quick:
        return DPFW_QUICK
    scores = [(_dpfw_rmse(p, unit, eps, delta, train, train, valid)[0], i) for i, p in enumerate(DPFW_GRID)]
    return DPFW_GRID[min(scores)[1]]


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


# ---------------------------------------------------------------------------- 1. paper synthetic
def _syn_splits(n_users: int, seed: int):
    data = paper_synthetic(n_users, seed=seed)
    train, valid, test = random_split(data.ratings, (0.8, 0.1, 0.1), seed=seed)
    assert data.p is not None  # paper_synthetic records the observation probability it drew with
    return train, valid, test, data.p * 1000 * 0.8


def synthetic_rows(quick: bool) -> list[dict]:
    sizes = SYN_SIZES[:1] if quick else SYN_SIZES
    seeds = SYN_SEEDS[:1] if quick else SYN_SEEDS
    epsilons = (1.0, 20.0) if quick else SYN_EPSILONS
    rows: list[dict] = []
    for n_users in sizes:
        dataset = f"paper-synthetic-n{n_users}"
        tuning = None if quick else _syn_splits(n_users, TUNING_SEED)
        fw_params = {eps: _tune_dpfw(1.0, eps, SYN_DELTA, tuning[0] if tuning else None,
                                     tuning[1] if tuning else None, quick) for eps in epsilons}
        ridges = {eps: dpals_base(1).reg_item if quick else _tune_ridge(tuning, eps) for eps in epsilons}
        res: dict[str, list[float]] = {}
        secs: dict[str, float] = {}
        for seed in seeds:
            train, _, test, per_user = _syn_splits(n_users, seed)
            res.setdefault("zero", []).append(float(np.sqrt(np.mean(test.csr.data**2))))
            model, took = _timed(partial(train_als, train, SYNTHETIC_ALS))
            res.setdefault("als", []).append(model_rmse(model, train, test))
            secs["als"] = secs.get("als", 0.0) + took
            for eps in epsilons:
                value, took = _dpfw_rmse(fw_params[eps], 1.0, eps, SYN_DELTA, train, train, test, seed)
                res.setdefault(f"dpfw@{eps}", []).append(value)
                secs[f"dpfw@{eps}"] = secs.get(f"dpfw@{eps}", 0.0) + took
                config = replace(dpals_base(per_user), reg_item=ridges[eps], seed=seed)
                model, took = _timed(partial(_calibrated_dpals, train, eps, SYN_DELTA, config))
                res.setdefault(f"dpals@{eps}", []).append(model_rmse(model, train, test))
                secs[f"dpals@{eps}"] = secs.get(f"dpals@{eps}", 0.0) + took
        size_rows = _result_rows(dataset, res, secs, seeds, epsilons, SYN_DELTA, ("zero", "als"))
        print(format_table(size_rows), flush=True)
        rows += size_rows
        for eps in epsilons:
            print(f"[dpfw] {dataset} eps={eps}: dpfw params {fw_params[eps]}, dpals ridge {ridges[eps]}")
    _print_claims(rows)
    return rows


def _tune_ridge(tuning, eps: float) -> float:
    """quality-synthetic's DPALS item-ridge search, on this suite's tuning draw (validation RMSE)."""
    train, valid, _, per_user = tuning
    score = {reg: model_rmse(train_dpals(train, calibrate_dpals(eps, SYN_DELTA, replace(dpals_base(per_user), reg_item=reg))),
                             train, valid) for reg in RIDGE_GRID}
    return min(score, key=score.__getitem__)


def _result_rows(dataset, res, secs, seeds, epsilons, delta, baselines) -> list[dict]:
    rows = []
    als_mean = mean_std(res["als"])[0]
    for name in baselines:
        mean, std = mean_std(res[name])
        rows.append(make_row(SUITE, dataset, name, "rmse", mean, std=std, seeds=list(seeds),
                             seconds=secs[name] / len(seeds) if name in secs else None))
    for eps in epsilons:
        for algo in ("dpfw", "dpals"):
            key = f"{algo}@{eps}"
            mean, std = mean_std(res[key])
            rows.append(make_row(SUITE, dataset, algo, "rmse", mean, epsilon=eps, delta=delta, std=std,
                                 seeds=list(seeds), baseline=als_mean, seconds=secs[key] / len(seeds)))
    return rows


def _print_claims(rows: list[dict]) -> None:
    """The DPALS paper's two claims about DPFW, confirmed or refuted with this run's numbers."""
    value = {(r["dataset"], r["algorithm"], r["epsilon"]): r["value"] for r in rows}
    datasets = sorted({r["dataset"] for r in rows}, key=lambda d: int(d.rsplit("n", 1)[1]))
    for d in datasets:
        eps_list = sorted(e for (dd, a, e) in value if dd == d and a == "dpfw")
        ratios = {e: value[(d, "dpfw", e)] / value[(d, "dpals", e)] for e in eps_list}
        als = value[(d, "als", None)]
        excess = {e: (value[(d, "dpfw", e)] - als) / max(value[(d, "dpals", e)] - als, 1e-12) for e in eps_list}
        print(f"[dpfw] {d}: RMSE ratio dpfw/dpals " + ", ".join(f"eps {e:g}: {r:.2f}" for e, r in ratios.items())
              + "; excess-over-ALS ratio " + ", ".join(f"eps {e:g}: {r:.1f}" for e, r in excess.items()))
        if 1.0 in eps_list:
            fw, zero = value[(d, "dpfw", 1.0)], value[(d, "zero", None)]
            print(f"[dpfw] {d}: DPFW at eps=1 RMSE {fw:.4f} vs predict-zero {zero:.4f}: "
                  f"{'beats zero' if fw < zero else 'no better than zero'}")
    big = [d for d in datasets if d.endswith("n50000")]
    for d in big:
        eps_list = sorted(e for (dd, a, e) in value if dd == d and a == "dpfw")
        ok = all(value[(d, "dpfw", e)] >= 7 * value[(d, "dpals", e)] for e in eps_list)
        print(f"[dpfw] claim 'DPALS >= 7x better than DPFW (RMSE) at n=50K at every eps': {ok}")


# ---------------------------------------------------------------------------- 2. real data
def _restrict(ratings: Ratings, items: np.ndarray) -> Ratings:
    """The ratings of ``items`` only, in a new item space holding just those ids."""
    rows, cols, vals = ratings.coo()
    keep = np.isin(cols, items)
    return Ratings.from_arrays(ratings.user_ids[rows[keep]], ratings.item_ids[cols[keep]], vals[keep],
                               user_ids=ratings.user_ids, item_ids=ratings.item_ids[np.sort(items)])


def _ml1m_top400():
    train, valid, test = load_ml1m_rating_split()
    top = np.argsort(-train.item_counts(), kind="stable")[:400]  # training-split popularity only
    return tuple(_restrict(r, top) for r in (train, valid, test))


def _jester():
    return random_split(load_jester1().ratings, (0.8, 0.1, 0.1), seed=0)


_DPALS_BASE: dict[str, Any] = dict(contribution_mode="adaptive_weights", user_centering=True, mean_mode="dp",
                                   frequent_fraction=1.0)
_JESTER_DPALS: list[dict[str, Any]] = [  # a small search on the Jester validation split (eps 20 and 1)
    dict(rank=8, reg_item=640.0, item_reg_exponent=0.0, contribution_bound=100, reg_user=5.0, user_reg_exponent=1.0,
         user_bias_shrinkage=10.0, n_steps=3, clip_rating=8.0),
    dict(rank=8, reg_item=640.0, item_reg_exponent=0.0, contribution_bound=100, reg_user=1.0, user_reg_exponent=1.0,
         user_bias_shrinkage=10.0, n_steps=3, clip_rating=8.0, clip_user=3.0),
]
_ML_DPALS: list[dict[str, Any]] = [  # quality-ml1m's validation winners at eps 20 and eps 1
    dict(rank=16, reg_item=640.0, item_reg_exponent=0.5, contribution_bound=240, reg_user=0.002, user_reg_exponent=1.0,
         user_bias_shrinkage=10.0, n_steps=3, clip_rating=2.0, gram_noise_ratio=1.0),
    dict(rank=8, reg_item=640.0, item_reg_exponent=0.0, contribution_bound=240, reg_user=0.05, user_reg_exponent=0.5,
         user_bias_shrinkage=30.0, n_steps=3, clip_rating=1.5, gram_noise_ratio=2.0),
]
_JESTER_ALS: list[dict[str, Any]] = [
    dict(rank=8, n_iters=10, reg_item=5.0, reg_user=20.0, item_reg_exponent=1.0, user_reg_exponent=1.0),
    dict(rank=8, n_iters=10, reg_item=1.0, reg_user=5.0, item_reg_exponent=1.0, user_reg_exponent=1.0),
]
_ML_ALS: list[dict[str, Any]] = [
    dict(rank=16, n_iters=10, reg_item=10.0, reg_user=0.1, item_reg_exponent=1.0, user_centering=True),
    dict(rank=32, n_iters=10, reg_item=20.0, reg_user=0.1, item_reg_exponent=1.0, user_centering=True),
]


def _dpals_real(params: dict, rating_range, eps: float, train: Ratings, seed: int = 0):
    config = DPALSConfig(rating_range=rating_range, seed=seed, **{**_DPALS_BASE, **params})
    return train_dpals(train, calibrate_dpals(eps, REAL_DELTA, config))


def _dpals_real_valid_rmse(rating_range, eps: float, train: Ratings, valid: Ratings, params: dict) -> float:
    return model_rmse(_dpals_real(params, rating_range, eps, train), train, valid)


def _als_valid_rmse(train: Ratings, valid: Ratings, params: dict) -> float:
    return model_rmse(train_als(train, ALSConfig(**params)), train, valid)


def _calibrated_dpals(train: Ratings, eps: float, delta: float, config: DPALSConfig) -> PublicModel:
    return train_dpals(train, calibrate_dpals(eps, delta, config))


def real_rows(quick: bool) -> list[dict]:
    sets = [  # name, loader, public rating range, public unit of a centred rating, ALS and DPALS candidates
        ("jester-1-80-10-10", _jester, (-10.0, 10.0), 5.0, _JESTER_ALS, _JESTER_DPALS),
        ("ml-1m-top400-80-10-10", _ml1m_top400, (1.0, 5.0), 1.0, _ML_ALS, _ML_DPALS),
    ]
    epsilons = (20.0,) if quick else REAL_EPSILONS
    rows: list[dict] = []
    for dataset, load, rating_range, unit, als_grid, dpals_grid in sets:
        try:
            train, valid, test = load()
        except DatasetUnavailable as exc:
            print(f"[dpfw] skipping {dataset}: {exc}")
            continue
        history = merge(train, valid)
        res: dict[str, list[float]] = {}
        secs: dict[str, float] = {}
        als_grid = als_grid[:1] if quick else als_grid
        best = min(als_grid, key=partial(_als_valid_rmse, train, valid))
        model, secs["als"] = _timed(partial(train_als, train, ALSConfig(**best)))
        res["als"] = [model_rmse(model, history, test)]
        res["user-mean"] = [float(np.sqrt(np.mean((predict_user_mean(history, test) - test.csr.data) ** 2)))]
        for eps in epsilons:
            fw = _tune_dpfw(unit, eps, REAL_DELTA, train, valid, quick)
            value, secs[f"dpfw@{eps}"] = _dpfw_rmse(fw, unit, eps, REAL_DELTA, train, history, test)
            res[f"dpfw@{eps}"] = [value]
            grid = dpals_grid[:1] if quick else dpals_grid
            dp = min(grid, key=partial(_dpals_real_valid_rmse, rating_range, eps, train, valid))
            model, secs[f"dpals@{eps}"] = _timed(partial(_dpals_real, dp, rating_range, eps, train))
            res[f"dpals@{eps}"] = [model_rmse(model, history, test)]
            print(f"[dpfw] {dataset} eps={eps}: dpfw params {fw}; dpals candidate {dpals_grid.index(dp)}")
        set_rows = _result_rows(dataset, res, secs, [0], epsilons, REAL_DELTA, ("user-mean", "als"))
        print(format_table(set_rows), flush=True)
        rows += set_rows
    return rows


def predict_user_mean(history: Ratings, test: Ratings) -> np.ndarray:
    counts = history.user_counts()
    sums = np.bincount(history.coo()[0], weights=history.csr.data, minlength=history.n_users)
    means = np.where(counts > 0, sums / np.maximum(counts, 1), float(history.csr.data.mean()))
    return means[test.coo()[0]]


# ---------------------------------------------------------------------------- 3. Oja vs exact
def oja_rows(quick: bool) -> list[dict]:
    """First-step eigenvector of W at a realistic (eps 10) and a tiny-noise (eps 1000) budget."""
    sizes = OJA_SIZES[:2] if quick else OJA_SIZES
    dense_limit = 400 if quick else 4_000
    rows: list[dict] = []
    for n_items in sizes:
        rows += _oja_rows_for_size(n_items, dense_limit)
    return rows


def _eigen_step(method: Callable[..., Any], prep: Any, a: np.ndarray, config: DPFWConfig) -> Any:
    """One noisy top-eigenvector step with a fixed-seed releaser (the caller times it)."""
    return method(prep, a, config, GaussianReleaser(np.random.default_rng(1)))


def _oja_rows_for_size(n_items: int, dense_limit: int) -> list[dict]:
    rows: list[dict] = []
    n_users, n_steps, per_user = 20_000, 10, 60
    data = paper_synthetic(n_users, n_items=n_items, seed=0, p=min(1.0, per_user / n_items))
    dataset = f"synthetic-m{n_users}-n{n_items}"
    base = DPFWConfig(nuclear_norm=1.0, n_steps=n_steps, row_clip=math.sqrt(per_user), max_ratings_per_user=per_user,
                      eigen_method="oja", oja_iterations=20, seed=0)
    prep = prepare_rows(data.ratings, base, np.random.default_rng(0))
    a = -prep.target
    op = spla.LinearOperator((n_items, n_items), matvec=lambda v: gram_product(prep, a, np.ravel(v)), dtype=np.float64)
    (lam, vec), exact = _timed(lambda: spla.eigsh(op, k=1, which="LA", tol=1e-10))
    lam1, v1 = float(lam[0]), vec[:, 0]
    rows.append(make_row(SUITE, dataset, "exact-lanczos", "seconds_per_step", exact, seconds=exact))

    def measure(name: str, eps: float, fn: Callable[[], Any]) -> None:
        (v, _lam2, _sigma), took = _timed(fn)
        gap = (lam1 - float(v @ gram_product(prep, a, v))) / lam1
        for metric, value in (("abs_cos_to_exact", abs(float(v @ v1))), ("rayleigh_rel_gap", gap), ("seconds_per_step", took)):
            rows.append(make_row(SUITE, dataset, name, metric, value, epsilon=eps, delta=SYN_DELTA, seconds=took))

    oja_variants: tuple[tuple[str, dict[str, Any]], ...] = (
        ("oja-paper-eta", {}), ("oja-power-eta", {"oja_learning_rate": 1e6}))
    for eps in (10.0, 1000.0):
        for name, overrides in oja_variants:
            config = calibrate_dpfw(eps, SYN_DELTA, replace(base, **overrides))
            measure(name, eps, partial(_eigen_step, top_eigenvector_oja, prep, a, config))
        dense = calibrate_dpfw(eps, SYN_DELTA, replace(base, eigen_method="dense"))
        if n_items <= dense_limit:
            measure("dense", eps, partial(_eigen_step, top_eigenvector_dense, prep, a, dense))
        print(f"[dpfw] {dataset} eps={eps}: top eigenvalue {lam1:.4g}; noise std dense "
              f"{dense.noise_multiplier * 4 * base.row_clip**2:.4g}, "
              f"per Oja product {config.noise_multiplier * 4 * base.row_clip**2:.4g}", flush=True)
    if n_items > dense_limit:
        need = 3 * n_items**2 * 8 / 2**30  # W, its noise and eigh's workspace, float64
        print(f"[dpfw] dense eigh skipped at n={n_items}: needs ~{need:.1f} GiB and ~n^3 = {n_items**3:.1e} flops per step")
        rows.append(make_row(SUITE, dataset, "dense-skipped", "memory_gib_needed", need))
    return rows


def run(quick: bool) -> list[dict]:
    with limit_threads(BLAS_THREADS):
        return real_rows(quick) + oja_rows(quick) + synthetic_rows(quick)
