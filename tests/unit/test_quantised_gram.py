"""The DPALS item Grams as exact sums of quantised rows (``app.core.mf.linalg``).

What the release's sensitivity argument needs, checked numerically: every quantised row stays
within its bound √w·Γ, the computed Gram is *exactly* the Gram of those rows (compared with int64
arithmetic), whatever the rows' order, and one row less changes it by exactly that row's outer
product. And what quality needs: the quantised Grams are close to the float64 ones."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from app.core.mf.als import bucket_gram, bucket_quantised_gram, make_plan, quantised_factors
from app.core.mf.linalg import exact_upper_gram_and_rhs, gram_quantum, quantise_gathered, quantise_table


def _factors(rng: np.random.Generator, n: int, rank: int, clip: float) -> np.ndarray:
    """Rows at the clip (the hardest case for the bound), inside it, tiny and zero; a zero row last."""
    u = rng.normal(size=(n, rank))
    u *= clip / np.linalg.norm(u, axis=1)[:, None]
    u[1::3] *= rng.uniform(0.0, 1.0, size=(len(u[1::3]), 1))
    u[2::7] *= 1e-6
    u[5::11] = 0.0
    return np.vstack([u, np.zeros((1, rank))])


def _integer_rows(x: np.ndarray) -> np.ndarray:
    assert np.array_equal(x, np.rint(x)), "quantised rows must be integers"
    return x.astype(np.int64)


@pytest.mark.parametrize("clip", [1.0, 0.3, 7.5])
@pytest.mark.parametrize("rank", [1, 7, 64, 128])
def test_quantum_is_a_power_of_two_and_rows_stay_within_the_clip(clip: float, rank: int):
    step = gram_quantum(clip)
    assert math.frexp(step)[0] == 0.5 and clip / 2048 < step <= clip / 1024
    rng = np.random.default_rng(rank)
    table = _factors(rng, 600, rank, clip)
    integers = quantise_table(table, clip)
    assert integers.dtype == np.int16
    rows = _integer_rows(integers)
    assert np.all(np.sqrt((rows**2).sum(axis=1)) * step <= clip)
    assert np.all(np.abs(rows - table / step) <= 1.0 + 1e-6)  # at most a quantum per coordinate (the clip margin: 1e-9)
    if rank > 1:  # (at rank 1 every row at the clip rounds the same way)
        assert np.median(np.abs(rows - table / step)) < 0.3  # mostly nearest rounding
    assert not rows[-1].any()
    # weighted rows: within √w·Γ; weights too small for any quantum give zero rows
    cols = rng.integers(0, len(table), size=(40, 9)).astype(np.int32)
    sqrt_w = rng.uniform(0.0, 4.0, size=cols.shape)
    sqrt_w[0, :3] = [1e-9, 0.0, 0.9 * step / clip]  # below one quantum of reach
    weighted_rows = _integer_rows(quantise_gathered(table, cols, sqrt_w, np.full(40, 9), clip))
    assert np.all(np.sqrt((weighted_rows**2).sum(axis=2)) * step <= sqrt_w * clip)
    assert np.all(np.abs(weighted_rows - table[cols] * sqrt_w[:, :, None] / step) <= 1.0 + 1e-6)
    assert not weighted_rows[0, :3].any()


def test_rounding_that_would_leave_the_clip_is_moved_towards_zero():
    """Rows exactly at the clip, each coordinate just above x.5 quanta: nearest rounding would
    lengthen every one; the quantised rows still fit."""
    rank, clip = 16, 1.0
    step = gram_quantum(clip)
    u = np.full((1, rank), 0.5 + 1e-3)
    u[0, 0] = math.sqrt((clip / step) ** 2 - (rank - 1) * u[0, 1] ** 2)
    table = np.vstack([u * step, np.zeros((1, rank))])
    assert np.linalg.norm(table[0]) == pytest.approx(clip, rel=1e-12)
    row = _integer_rows(quantise_table(table, clip)[0])
    assert (row**2).sum() <= (clip / step) ** 2
    assert np.abs(row - table[0] / step).max() < 1.0


def _reference_gram(x: np.ndarray, counts: np.ndarray, step: float) -> np.ndarray:
    rows = _integer_rows(x)
    exact = np.stack([np.triu(rows[j, : counts[j]].T @ rows[j, : counts[j]]) for j in range(len(rows))])
    return exact.astype(np.float64) * step * step  # int64 sums below 2^53 convert exactly


@pytest.mark.parametrize("rank", [3, 64, 128])
def test_grams_are_the_exact_grams_of_the_quantised_rows_in_any_order(rank: int):
    rng = np.random.default_rng(rank + 1)
    clip = 1.0
    step = gram_quantum(clip)
    table = _factors(rng, 3_000, rank, clip)
    table[:40] = 0.0  # rows on one coordinate: a block fills by that coordinate's load, 2^24
    table[:40, 0] = clip * rng.choice([-1.0, 1.0], size=40)
    cols = rng.integers(0, len(table), size=(7, 700)).astype(np.int32)
    cols[6, :300] = np.arange(300) % 40
    counts = np.array([700, 0, 1, 257, 513, 699, 600])
    sqrt_w = rng.uniform(0.0, 1.5, size=cols.shape)
    sqrt_w[6] = 1.0
    sqrt_w[5, ::50] = 90.0  # a few rows with coordinates above 2^12: summed in float64
    target_step = 2.0**-20
    targets = np.trunc(rng.normal(size=cols.shape) / target_step)  # integer targets, as bucket_quantised_gram's
    x = quantise_gathered(table, cols, sqrt_w, counts, clip)
    assert (np.abs(x) > 2**12).any()
    grams, rhs = exact_upper_gram_and_rhs(x, targets, counts, step, target_step)
    grams = np.triu(grams)  # the lower triangles are left unset
    assert np.array_equal(grams, _reference_gram(x, counts, step))
    # the right-hand sides: the exact int64 sums of the integer products, scaled once
    want_rhs = np.stack([targets[j, : counts[j]].astype(np.int64) @ x[j, : counts[j]].astype(np.int64)
                         for j in range(7)]).astype(np.float64) * (step * target_step)
    assert np.array_equal(rhs, want_rhs)
    # the int16 table's rows: the same Grams as the same rows in float32
    unweighted = np.take(quantise_table(table, clip), cols, axis=0)
    from_int16 = np.triu(exact_upper_gram_and_rhs(unweighted, targets, counts, step, target_step)[0])
    assert np.array_equal(from_int16, np.triu(exact_upper_gram_and_rhs(unweighted.astype(np.float32), targets, counts,
                                                                       step, target_step)[0]))
    assert np.array_equal(from_int16, _reference_gram(unweighted, counts, step))
    # any order of the rows: the same numbers, bit for bit (no rounding anywhere)
    order = np.stack([np.concatenate([rng.permutation(c), np.arange(c, 700)]) for c in counts])
    shuffled = np.take_along_axis(x, order[:, :, None], axis=1)
    shuffled_targets = np.take_along_axis(targets, order, axis=1)
    again, again_rhs = exact_upper_gram_and_rhs(shuffled, shuffled_targets, counts, step, target_step)
    assert np.array_equal(np.triu(again), grams)
    assert np.array_equal(again_rhs, rhs)
    # written in place into other rows of larger arrays: the same sums there, nothing else touched
    slots = np.array([9, 0, 4, 2, 7, 3, 5])
    into, into_rhs = np.full((10, rank, rank), np.nan), np.full((10, rank), np.nan)
    placed = exact_upper_gram_and_rhs(x, targets, counts, step, target_step, out=(into, into_rhs, slots))
    assert placed[0] is into and placed[1] is into_rhs
    assert np.array_equal(np.triu(into[slots]), grams) and np.array_equal(into_rhs[slots], rhs)
    untouched = np.setdiff1d(np.arange(10), slots)
    assert np.isnan(into[untouched]).all() and np.isnan(into_rhs[untouched]).all()
    # one row less: the Gram moves by exactly that row's outer product
    fewer, _ = exact_upper_gram_and_rhs(x[:1], targets[:1], np.array([699]), step, target_step)
    last = x[0, 699].astype(np.float64) * step
    assert np.array_equal(grams[0] - np.triu(fewer[0]), np.triu(np.outer(last, last)))


@pytest.mark.parametrize(("weighted", "rank"), [(False, 64), (True, 64), (True, 7), (False, 128)])
def test_bucket_grams_are_close_to_the_float64_products(weighted: bool, rank: int):
    """Quantisation moves each Gram entry by at most 2δ per unit of row weight, the Grams as a
    whole by well under 1 % (what quality sees), each right-hand side by at most a quantum per
    coordinate and rating."""
    rng = np.random.default_rng(rank)
    csr = sp.random(300, 500, density=0.05, random_state=rank, format="csr")
    weights = rng.uniform(0.1, 1.0, size=csr.nnz) if weighted else None
    plan = make_plan(csr.indptr, csr.indices, csr.data, 500, weights)
    table = _factors(rng, 500, rank, 1.0)
    factors = quantised_factors(table, 1.0, weighted=weighted)
    upper = np.triu_indices(rank)
    step, moved_total, total = gram_quantum(1.0), 0.0, 0.0
    for bucket in plan.buckets:
        full, full_rhs = bucket_gram(bucket, table)
        grams, rhs = bucket_quantised_gram(bucket, factors, plan.counts[bucket.rows], 1.0)
        sqrt_w = np.ones(bucket.cols.shape) if bucket.sqrt_weights is None else bucket.sqrt_weights
        used = np.arange(bucket.cols.shape[1])[None, :] < plan.counts[bucket.rows][:, None]
        reach = (sqrt_w * used).sum(axis=1)  # Σ_l √w_l·Γ (Γ = 1): the rows' largest coordinates
        gap = np.abs(grams[:, upper[0], upper[1]] - full[:, upper[0], upper[1]])
        assert np.all(gap <= 2.0 * step * (1.0 + 1e-6) * reach[:, None] + 1e-12)  # |xxᵀ − yyᵀ| <= δ(|x| + |y|)
        moved_total += float((gap**2).sum())
        total += float((full[:, upper[0], upper[1]] ** 2).sum())
        targets = sqrt_w * bucket.values
        # <= a quantum per coordinate and rating, plus the target's rounding (a quantum of Γ_M = 1
        # times the row's reach √w·Γ)
        moved = step * (1.0 + 1e-6) * np.abs(targets).sum(axis=1) + 2.0**-20 * reach
        assert np.all(np.abs(rhs - full_rhs) <= moved[:, None] + 1e-12)
    assert math.sqrt(moved_total / total) < 0.01


def test_an_unweighted_bucket_needs_the_quantised_table():
    csr = sp.random(20, 30, density=0.2, random_state=0, format="csr")
    plan = make_plan(csr.indptr, csr.indices, csr.data, 30)
    factors = quantised_factors(np.zeros((31, 4)), 1.0, weighted=True)
    with pytest.raises(ValueError, match="quantised_factors"):
        bucket_quantised_gram(plan.buckets[0], factors, plan.counts[plan.buckets[0].rows], 1.0)
    with pytest.raises(ValueError, match="clip"):
        gram_quantum(0.0)


def test_kernels_built_from_many_threads_at_once_are_built_once():
    """The solver threads of a fresh process ask for the compiled kernels together; their helpers
    are rebound to compiled functions while the first thread builds them (a second build used to
    compile a compiled function and fail). Every thread gets the one build (a second build would
    hand its caller another tuple) and the same quantised rows as a single thread."""
    from concurrent.futures import ThreadPoolExecutor

    from app.core.mf import linalg

    table = _factors(np.random.default_rng(0), 10, 4, 1.0)
    expected = quantise_table(table, 1.0)
    linalg._build_quantised_gram_kernels.cache_clear()  # a fresh process: nothing built yet
    with ThreadPoolExecutor(max_workers=8) as pool:
        kernels = list(pool.map(lambda _: linalg._quantised_gram_kernels(), range(16)))
    assert all(k is kernels[0] for k in kernels)
    linalg._build_quantised_gram_kernels.cache_clear()  # building again over the compiled helpers works too
    with ThreadPoolExecutor(max_workers=8) as pool:
        quantised = list(pool.map(lambda _: quantise_table(table, 1.0), range(16)))
    assert all(np.array_equal(q, expected) for q in quantised)
