"""Known-answer tests for the ALS solver, fold-in and top-N semantics."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.core.data.ratings import Ratings
from app.core.mf.als import ALSConfig, make_plan, solve_side, train_als
from app.core.mf.dpals import DPALSConfig, train_dpals
from app.core.mf.foldin import (
    fold_in,
    fold_in_state,
    fold_in_users,
    popular_items,
    recommend,
    similar_items,
    user_offset,
    user_offsets,
)


def _low_rank(n_users=120, n_items=80, rank=3, density=0.5, seed=0):
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=(n_users, rank)) @ rng.normal(size=(n_items, rank)).T + 3.0
    users, items = np.nonzero(rng.random((n_users, n_items)) < density)
    return truth, Ratings.from_arrays(users, items, truth[users, items])


@pytest.mark.parametrize("gram_dtype,rtol", [(np.float64, 1e-9), (np.float32, 1e-4)])
@pytest.mark.parametrize("rank", [4, 16])  # rows of ~9 entries: primal path at 4, dual path at 16
def test_batched_solver_matches_dense_least_squares(rank: int, gram_dtype, rtol: float):
    rng = np.random.default_rng(1)
    dense = (rng.random((40, 30)) < 0.3) * rng.normal(size=(40, 30))
    import scipy.sparse as sp

    csr = sp.csr_matrix(dense)
    factors = rng.normal(size=(30, rank))
    ridge = rng.uniform(0.5, 2.0, size=40)
    got = solve_side(make_plan(csr.indptr, csr.indices, csr.data, 30), factors, ridge, gram_dtype=gram_dtype)
    for u in range(40):
        cols = csr.indices[csr.indptr[u] : csr.indptr[u + 1]]
        x = factors[cols]
        want = np.linalg.solve(x.T @ x + ridge[u] * np.eye(rank), x.T @ csr.data[csr.indptr[u] : csr.indptr[u + 1]])
        assert np.allclose(got[u], want, rtol=rtol, atol=rtol)


def test_als_recovers_exact_low_rank_data_and_fold_in_matches():
    truth, ratings = _low_rank()
    # centring by the global mean leaves UVᵀ + constant: rank 3 + 1
    config = ALSConfig(rank=4, n_iters=40, reg_item=1e-6, reg_user=1e-6, item_reg_exponent=0, user_reg_exponent=0)
    model = train_als(ratings, config)
    users = np.array([fold_in(model, *ratings.user_row(u)) for u in range(ratings.n_users)])
    predicted = model.global_mean + users @ model.item_factors.T
    # unobserved entries too: the low-rank structure was found, not memorised
    assert np.sqrt(np.mean((predicted - truth) ** 2)) < 1e-2


def test_checkerboard_recommendations():
    # two communities: users 0-19 like items 0-9, users 20-39 like items 10-19
    rng = np.random.default_rng(2)
    users, items, values = [], [], []
    for u in range(40):
        liked = np.arange(10) if u < 20 else np.arange(10, 20)
        other = np.arange(10, 20) if u < 20 else np.arange(10)
        for i in rng.choice(liked, 6, replace=False):
            users.append(u)
            items.append(i)
            values.append(5.0)
        for i in rng.choice(other, 3, replace=False):
            users.append(u)
            items.append(i)
            values.append(1.0)
    ratings = Ratings.from_arrays(users, items, values)
    model = train_als(ratings, ALSConfig(rank=2, n_iters=15, reg_item=0.1, reg_user=0.1))
    for u in (0, 25):
        idx, scores = recommend(model, *ratings.user_row(u), 3)
        rated = set(ratings.user_row(u)[0].tolist())
        assert not rated & set(idx.tolist())
        assert np.all(np.diff(scores) <= 0)
        community = range(10) if u < 20 else range(10, 20)
        assert set(idx.tolist()) <= set(community)


def test_recommend_filters_and_returns_fewer_when_filtered():
    truth, ratings = _low_rank(n_items=12)
    model = train_als(ratings, ALSConfig(rank=2, n_iters=5))
    rated, values = ratings.user_row(0)
    unrated = np.setdiff1d(np.arange(12), rated)
    idx, _ = recommend(model, rated, values, 50)
    assert sorted(idx.tolist()) == sorted(unrated.tolist())
    idx, _ = recommend(model, rated, values, 50, exclude_idx=unrated[:2])
    assert len(idx) == len(unrated) - 2 and not set(unrated[:2]) & set(idx)
    idx, _ = recommend(model, rated, values, 50, allowed_idx=unrated[:3])
    assert sorted(idx.tolist()) == sorted(unrated[:3].tolist())
    with pytest.raises(ValueError):
        recommend(model, rated, values, 0)


def test_fold_in_rejects_bad_input_and_handles_empty_history():
    _, ratings = _low_rank()
    model = train_als(ratings, ALSConfig(rank=2, n_iters=2))
    assert np.all(fold_in(model, np.array([], dtype=int), np.array([])) == 0)
    with pytest.raises(ValueError):
        fold_in(model, np.array([0, 1]), np.array([1.0, np.nan]))
    with pytest.raises(ValueError):
        fold_in(model, np.array([0, 0]), np.array([1.0, 2.0]))
    with pytest.raises(ValueError):
        fold_in(model, np.array([10_000]), np.array([1.0]))
    with pytest.raises(ValueError, match="duplicate"):
        fold_in(model, np.array([7, 3, 9, 3, 1]), np.full(5, 2.0))  # not adjacent until sorted


@pytest.mark.parametrize("centring", [False, True])
def test_fold_in_state_is_the_embedding_and_offset_of_one_pass(centring: bool):
    """The serving path's (u, m̃ + b_u) in one pass equals fold_in and user_offset bit for bit."""
    _, ratings = _low_rank(n_items=50)
    clipped = ratings.with_values(np.clip(ratings.csr.data, 1, 5))
    model = train_dpals(clipped, DPALSConfig(rank=6, frequent_fraction=0.6, contribution_bound=8,
                                             noise_multiplier=0.5, user_centering=centring))
    for u in range(0, clipped.n_users, 11):
        items, values = clipped.user_row(u)
        vector, offset = fold_in_state(model, items[::-1], values[::-1])
        assert np.array_equal(vector, fold_in(model, items[::-1], values[::-1]))
        assert offset == user_offset(model, values[::-1], items[::-1])
    vector, offset = fold_in_state(model, np.array([], dtype=int), np.array([]))
    assert offset is None and not vector.any()


def test_similar_and_popular_items():
    _, ratings = _low_rank()
    model = train_als(ratings, ALSConfig(rank=3, n_iters=10))
    idx, scores = similar_items(model, 5, 4)
    assert 5 not in idx and len(idx) == 4 and np.all(scores <= 1 + 1e-9) and np.all(np.diff(scores) <= 0)
    idx, counts = popular_items(model, 3)
    assert np.array_equal(counts, np.sort(ratings.item_counts())[::-1][:3].astype(float))


def test_untrained_items_are_never_recommended_by_dpals():
    _, ratings = _low_rank(n_items=40)
    model = train_dpals(ratings.with_values(np.clip(ratings.csr.data, 1, 5)),
                        DPALSConfig(rank=2, frequent_fraction=0.25, contribution_bound=5, noise_multiplier=0.5))
    idx, _ = recommend(model, np.array([], dtype=int), np.array([]), 40)
    assert len(idx) == model.trained_mask.sum() and np.all(model.trained_mask[idx])


def test_ratings_validation():
    with pytest.raises(ValueError, match="NaN"):
        Ratings.from_arrays([0], [0], [np.nan])
    with pytest.raises(ValueError, match="NaN"):
        Ratings.from_arrays([0], [0], [np.inf])
    with pytest.raises(ValueError, match="range"):
        Ratings.from_arrays([0], [0], [9.0], rating_range=(1, 5))
    with pytest.raises(ValueError, match="duplicate"):
        Ratings.from_arrays([0, 0], [1, 1], [3.0, 4.0])
    with pytest.raises(ValueError, match="unknown item"):
        Ratings.from_arrays([0], ["x"], [3.0], item_ids=np.array(["a", "b"]))
    empty = Ratings.from_arrays(np.array([], int), np.array([], int), np.array([]), user_ids=np.array([]), item_ids=np.arange(3))
    assert empty.nnz == 0 and empty.n_items == 3
    with pytest.raises(ValueError, match="length"):
        Ratings.from_arrays([0, 1], [0], [3.0])
    with pytest.raises(ValueError, match="empty"):
        train_als(Ratings.from_arrays(np.array([], int), np.array([], int), np.array([])), ALSConfig())


@pytest.mark.parametrize("gravity,centring", [(0.0, False), (0.7, False), (0.0, True)])
def test_batched_fold_in_equals_the_privileged_solve(gravity: float, centring: bool):
    _, ratings = _low_rank(n_items=50)
    clipped = ratings.with_values(np.clip(ratings.csr.data, 1, 5))
    model = train_dpals(clipped, DPALSConfig(rank=6, frequent_fraction=0.6, contribution_bound=8,
                                             reg_gravity=gravity, noise_multiplier=0.5, user_centering=centring))
    batched = fold_in_users(model, clipped)
    offsets = user_offsets(model, clipped)
    for u in range(0, clipped.n_users, 7):
        items, values = clipped.user_row(u)
        assert np.allclose(batched[u], fold_in(model, items, values))
        assert offsets[u] == pytest.approx(user_offset(model, values, items))
    assert np.ptp(offsets) > 0 if centring else np.ptp(offsets) == 0


def test_user_centring_recovers_user_offsets():
    truth, ratings = _low_rank(rank=2)
    rng = np.random.default_rng(9)
    shift = rng.normal(0, 1.0, size=ratings.n_users)
    rows, cols, values = ratings.coo()
    shifted = ratings.with_values(values + shift[rows])
    config = ALSConfig(rank=3, n_iters=40, reg_item=1e-6, reg_user=1e-6, item_reg_exponent=0, user_reg_exponent=0,
                       user_centering=True, user_bias_shrinkage=0.0)
    model = train_als(shifted, config)
    users = fold_in_users(model, shifted)
    predicted = user_offsets(model, shifted)[:, None] + users @ model.item_factors.T
    assert np.sqrt(np.mean((predicted - (truth + shift[:, None])) ** 2)) < 0.05


@pytest.mark.parametrize("weighted,shared", [(False, False), (True, True)])
def test_conjugate_gradient_solves_converge_to_the_exact_ones(weighted: bool, shared: bool):
    from app.core.mf.als import solve_side_cg

    rng = np.random.default_rng(7)
    import scipy.sparse as sp

    csr = sp.random(60, 40, density=0.3, random_state=8, format="csr")
    weights = rng.uniform(0.2, 1.0, size=csr.nnz) if weighted else None
    plan = make_plan(csr.indptr, csr.indices, csr.data, 40, weights)
    rank = 6
    factors = rng.normal(size=(40, rank))
    ridge = rng.uniform(0.5, 2.0, size=60)
    g = rng.normal(size=(3, rank))
    extra = 0.2 * g.T @ g if shared else None
    exact = solve_side(plan, factors, ridge, extra, gram_dtype=np.float64)
    start = rng.normal(size=(60, rank))
    converged = solve_side_cg(plan, factors, ridge, start, steps=3 * rank, shared=extra)
    assert np.allclose(converged, exact, rtol=1e-3, atol=1e-3)
    few = solve_side_cg(plan, factors, ridge, start, steps=1, shared=extra)
    assert np.linalg.norm(few - exact) < np.linalg.norm(start - exact)  # one step already helps


def _numpy_cg(x: np.ndarray, y: np.ndarray, lam: float, shared: np.ndarray | None, u: np.ndarray,
              steps: int) -> np.ndarray:
    """The CG recurrence of solve_side_cg for one row, in float64 (the reference)."""
    def apply(p: np.ndarray) -> np.ndarray:
        return x.T @ (x @ p) + lam * p + (0.0 if shared is None else p @ shared)

    residual = x.T @ y - apply(u)
    direction, rs = residual.copy(), residual @ residual
    for _ in range(steps):
        ad = apply(direction)
        alpha = rs / max(direction @ ad, 1e-30)
        u, residual = u + alpha * direction, residual - alpha * ad
        rs_new = residual @ residual
        direction, rs = residual + rs_new / max(rs, 1e-30) * direction, rs_new
    return u


@pytest.mark.parametrize("weighted,shared,rank", [(False, False, 6), (True, True, 6), (False, False, 64)])
def test_compiled_cg_follows_the_recurrence_in_float32(weighted: bool, shared: bool, rank: int):
    """The compiled float32 CG (rows gathered once, the GIL released) is the recurrence of its
    docstring: equal to a float64 reference within float32 rounding, rows without entries zero."""
    import scipy.sparse as sp

    from app.core.mf.als import solve_side_cg

    rng = np.random.default_rng(11)
    csr = sp.random(50, 80, density=0.2, random_state=12, format="csr")
    csr.data[csr.indptr[7] : csr.indptr[8]] = 0.0  # row 7 without entries
    csr.eliminate_zeros()
    weights = rng.uniform(0.2, 1.0, size=csr.nnz) if weighted else None
    plan = make_plan(csr.indptr, csr.indices, csr.data, 80, weights)
    factors = rng.normal(size=(80, rank)) / np.sqrt(rank)
    ridge = rng.uniform(0.5, 2.0, size=50)
    g = rng.normal(size=(3, rank))
    extra = 0.2 * g.T @ g if shared else None
    start = rng.normal(size=(50, rank)).astype(np.float32)
    got = solve_side_cg(plan, factors, ridge, start, steps=4, shared=extra)
    assert not got[7].any()
    for i in range(50):
        lo, hi = csr.indptr[i], csr.indptr[i + 1]
        if lo == hi:
            continue
        sqrt_w = np.ones(hi - lo) if weights is None else np.sqrt(weights[lo:hi])
        x = factors[csr.indices[lo:hi]] * sqrt_w[:, None]
        want = _numpy_cg(x, sqrt_w * csr.data[lo:hi], ridge[i], extra, start[i].astype(np.float64), 4)
        assert np.allclose(got[i], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_cg_als_fits_low_rank_data_close_to_exact_als():
    truth, ratings = _low_rank()
    base = dict(rank=4, n_iters=15, reg_item=0.1, reg_user=0.1, item_reg_exponent=0, user_reg_exponent=0)
    errors = {}
    for solver in ("exact", "cg"):
        model = train_als(ratings, ALSConfig(**base, solver=solver))
        users = np.array([fold_in(model, *ratings.user_row(u)) for u in range(ratings.n_users)])
        predicted = model.global_mean + users @ model.item_factors.T
        errors[solver] = np.sqrt(np.mean((predicted - truth) ** 2))
    assert errors["exact"] < 0.05
    assert errors["cg"] < 1.5 * errors["exact"] + 0.01


def test_als_config_rejects_unknown_solvers():
    with pytest.raises(ValueError):
        ALSConfig(solver="lu")
    with pytest.raises(ValueError):
        ALSConfig(cg_steps=0)


def test_default_solver_is_cg_and_fits_as_the_exact_one():
    """ALS's default is warm-started CG (3 steps per row and iteration): on low-rank data its fit
    matches the exact solver's (it is a different solver: a test that could tell them apart)."""
    assert ALSConfig().solver == "cg"
    truth, ratings = _low_rank()
    config = ALSConfig(rank=4, n_iters=30, reg_item=0.01, reg_user=0.01, item_reg_exponent=0, user_reg_exponent=0)
    fits = []
    for solver in ("cg", "exact"):
        model = train_als(ratings, replace(config, solver=solver))
        predicted = model.global_mean + fold_in_users(model, ratings) @ model.item_factors.T
        fits.append(np.sqrt(np.mean((predicted - truth) ** 2)))
    assert fits[0] < 0.05 and abs(fits[0] - fits[1]) < 0.01


def test_solvers_write_into_a_given_buffer_exactly_what_they_return():
    """``out`` (DPALS passes a view of its padded user table): the same solutions, written in
    place, rows without entries zero; a buffer of the wrong shape or dtype is refused."""
    import scipy.sparse as sp

    from app.core.mf.als import solve_side_cg

    rng = np.random.default_rng(11)
    csr = sp.random(50, 30, density=0.2, random_state=12, format="csr")
    csr[7] = 0  # a row without entries
    csr.eliminate_zeros()
    plan = make_plan(csr.indptr, csr.indices, csr.data, 30)
    factors, ridge = rng.normal(size=(30, 5)), rng.uniform(0.5, 2.0, size=50)
    start = rng.normal(size=(50, 5)).astype(np.float32)
    for solve in (lambda **kw: solve_side(plan, factors, ridge, **kw),
                  lambda **kw: solve_side_cg(plan, factors, ridge, start, 3, **kw)):
        table = np.zeros((51, 5))
        assert solve(out=table[:-1]) is not None
        assert np.array_equal(table[:-1], solve()) and not table[7].any() and not table[-1].any()
        for bad in (np.zeros((50, 5), dtype=np.float32), np.zeros((49, 5))):
            with pytest.raises(ValueError, match="out must be"):
                solve(out=bad)


def test_user_factors_are_clipped_in_place_value_for_value():
    """DPALS clips U in its padded table block by block: the same values as ``clip_rows``,
    over more rows than one block, rows below, at and above the bound."""
    from app.core.mf.dpals import _NORM_BLOCK_ROWS, _clip_rows_in_place
    from app.core.privacy.sampling import clip_rows

    rng = np.random.default_rng(13)
    x = rng.normal(size=(2 * _NORM_BLOCK_ROWS + 17, 8)) * rng.uniform(0.0, 3.0, size=(2 * _NORM_BLOCK_ROWS + 17, 1))
    x[5] = 0.0
    x[6] = x[6] / np.linalg.norm(x[6])  # at the bound
    expected = clip_rows(x, 1.0)
    _clip_rows_in_place(x, 1.0)
    assert np.array_equal(x, expected)
    assert np.linalg.norm(x, axis=1).max() <= 1.0 + 1e-12
