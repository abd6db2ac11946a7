"""Known-answer tests for the batched kernels of app.core.mf.linalg."""

from __future__ import annotations

import numpy as np
import pytest

from app.core.mf.als import bucket_gram, make_plan
from app.core.mf.linalg import (
    add_to_diagonal,
    gather_rows,
    gram_and_rhs,
    positive_definite_mask,
    project_psd,
    psd_part,
    solve_noisy_systems,
    solve_positive_definite,
    symmetric_from_upper,
)


def _noisy_grams(rng: np.random.Generator, n: int, rank: int, noise: float) -> np.ndarray:
    x = rng.normal(size=(n, 3 * rank, rank)) / rank
    noise_part = rng.normal(0.0, noise, size=(n, rank, rank))
    return x.transpose(0, 2, 1) @ x + (noise_part + noise_part.transpose(0, 2, 1)) / 2


def test_symmetric_from_upper_equals_scattering_both_triangles():
    rng = np.random.default_rng(0)
    rank = 7
    rows, cols = np.triu_indices(rank)
    upper = rng.normal(size=(5, 3, len(rows)))
    want = np.empty((5, 3, rank, rank))
    want[..., rows, cols] = upper
    want[..., cols, rows] = upper
    assert np.array_equal(symmetric_from_upper(upper, rank), want)


def test_positive_definite_mask_matches_the_spectrum():
    rng = np.random.default_rng(1)
    grams = _noisy_grams(rng, 300, 6, noise=0.4)
    want = np.linalg.eigvalsh(grams).min(axis=1) > 1e-9
    assert 0 < want.sum() < len(want)  # both kinds present: the bisection is exercised
    assert np.array_equal(positive_definite_mask(grams), want)
    assert positive_definite_mask(grams[:0]).shape == (0,)


@pytest.mark.parametrize("rank", [1, 6, 64])
def test_psd_part_equals_clamping_the_full_spectrum(rank: int):
    rng = np.random.default_rng(6)
    grams = _noisy_grams(rng, 40, rank, noise=0.4)
    eigval, eigvec = project_psd(grams)
    want = np.matmul(eigvec * eigval[:, None, :], np.swapaxes(eigvec, 1, 2))
    got = psd_part(grams)
    assert np.allclose(got, want, rtol=1e-10, atol=1e-12 * np.abs(grams).max())
    assert np.linalg.eigvalsh(got).min() > -1e-10
    assert np.array_equal(psd_part(grams[:0]), grams[:0])


@pytest.mark.parametrize("shift", [0.0, 0.3])
@pytest.mark.parametrize("extra_kind", [None, "shared", "per_row"])
def test_noisy_solves_project_the_shifted_gram_where_the_system_is_not_pd(extra_kind, shift: float):
    rng = np.random.default_rng(2)
    n, rank = 200, 5
    grams = _noisy_grams(rng, n, rank, noise=0.5)
    original = grams.copy()
    rhs = rng.normal(size=(n, rank))
    ridge = rng.uniform(0.05, 0.6, size=n)
    extra = None
    if extra_kind == "shared":
        w = rng.normal(size=(4, rank))
        extra = 0.1 * w.T @ w
    elif extra_kind == "per_row":
        w = rng.normal(size=(n, 2, rank))
        extra = 0.1 * w.transpose(0, 2, 1) @ w
    got, n_projected = solve_noisy_systems(grams, rhs, ridge, extra, shift)
    assert np.array_equal(grams, original)
    unset_lower = grams + np.tril(rng.normal(size=grams.shape), -1)  # a release that did not mirror
    assert np.array_equal(solve_noisy_systems(unset_lower, rhs, ridge, extra, shift)[0], got)
    expected_projected, shifted_not_pd = 0, 0
    for j in range(n):
        e = 0 if extra is None else (extra if extra.ndim == 2 else extra[j])
        shifted = grams[j] + shift * np.eye(rank)
        direct = shifted + e + ridge[j] * np.eye(rank)
        if np.linalg.eigvalsh(direct).min() > 0:  # solvable as it is: no projection
            want = np.linalg.solve(direct, rhs[j])
        else:  # the definition: Π_PSD(Ã + sI) + E + ridge I
            eigval, eigvec = project_psd(shifted)
            want = np.linalg.solve((eigvec * eigval) @ eigvec.T + e + ridge[j] * np.eye(rank), rhs[j])
            expected_projected += 1
        shifted_not_pd += int(np.linalg.eigvalsh(shifted).min() <= 0)
        assert np.allclose(got[j], want, rtol=1e-8, atol=1e-8)
    assert n_projected == expected_projected > 0
    assert n_projected < shifted_not_pd  # fewer projections than a test of Ã + sI alone would make
    # other dtypes take the wrappers: the same solutions
    got32, projected32 = solve_noisy_systems(grams.astype(np.float32), rhs, ridge, extra, shift)
    assert projected32 >= 0 and np.allclose(got32, got, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("weighted", [False, True])
def test_float32_grams_stay_within_tolerance_of_float64(weighted: bool):
    rng = np.random.default_rng(3)
    n_rows, n_cols, rank = 50, 400, 64
    import scipy.sparse as sp

    csr = sp.random(n_rows, n_cols, density=0.3, random_state=4, format="csr")
    weights = rng.uniform(0.1, 1.0, size=csr.nnz) if weighted else None
    plan = make_plan(csr.indptr, csr.indices, csr.data, n_cols, weights)
    factors = rng.normal(size=(n_cols + 1, rank)) / np.sqrt(rank)
    factors[-1] = 0.0
    for bucket in plan.buckets:
        g64, b64 = bucket_gram(bucket, factors)
        g32, b32 = bucket_gram(bucket, factors.astype(np.float32))
        assert g32.dtype == np.float32
        scale = np.abs(g64).max()
        assert np.allclose(g32, g64, rtol=1e-5, atol=1e-5 * scale)
        assert np.allclose(b32, b64, rtol=1e-5, atol=1e-5 * np.abs(b64).max())
        # and against the definition
        assert (bucket.sqrt_weights is not None) == weighted
        sw = np.ones(bucket.cols.shape) if bucket.sqrt_weights is None else bucket.sqrt_weights
        x = factors[bucket.cols] * sw[:, :, None]
        assert np.allclose(g64, x.transpose(0, 2, 1) @ x, rtol=1e-12, atol=1e-12)
        assert np.allclose(b64, np.einsum("glr,gl->gr", x, sw * bucket.values), atol=1e-12)


def test_gram_and_rhs_of_gathered_rows():
    rng = np.random.default_rng(5)
    padded = np.vstack([rng.normal(size=(10, 3)), np.zeros((1, 3))])
    cols = np.array([[0, 4, 10], [9, 9, 2]])
    sw = np.array([[1.0, 0.5, 0.0], [2.0, 1.0, 1.0]])
    y = np.array([[1.0, -1.0, 0.0], [0.5, 2.0, 3.0]])
    gram, rhs = gram_and_rhs(gather_rows(padded, cols, sw), sw * y)
    for g in range(2):
        x = padded[cols[g]] * sw[g][:, None]
        assert np.allclose(gram[g], x.T @ x) and np.allclose(rhs[g], x.T @ (sw[g] * y[g]))


def test_add_to_diagonal_equals_adding_scaled_identities():
    rng = np.random.default_rng(7)
    matrices = rng.normal(size=(5, 4, 4))
    ridge = rng.uniform(size=5)
    want = matrices + ridge[:, None, None] * np.eye(4) + 0.5 * np.eye(4)
    add_to_diagonal(matrices, ridge[:, None])
    add_to_diagonal(matrices, 0.5)
    assert np.array_equal(matrices, want)


def test_positive_definite_solves_match_lu_and_fall_back_where_cholesky_fails():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(30, 12, 6))
    systems = x.transpose(0, 2, 1) @ x + 0.1 * np.eye(6)
    systems[3] = np.diag([1.0, -1.0, 2.0, 3.0, 4.0, 5.0])  # symmetric, invertible, not PD: the LU fallback
    rhs = rng.normal(size=(30, 6))
    want = np.linalg.solve(systems, rhs[:, :, None])[:, :, 0]
    assert np.allclose(solve_positive_definite(systems, rhs), want, rtol=1e-10, atol=1e-12)
    assert solve_positive_definite(systems[:0], rhs[:0]).shape == (0, 6)


@pytest.mark.parametrize("rank", [1, 5, 64])
def test_compiled_cholesky_loop_equals_scipys_wrappers_bit_for_bit(rank: int):
    """The compiled potrf/potrs loop reads the upper triangle, which scipy's ``potrf``/``posv``
    read as the lower one of the transposed matrix, and returns their numbers exactly; non-PD
    systems fail in both."""
    from scipy.linalg import lapack

    rng = np.random.default_rng(rank)
    shifts = np.linspace(-1.5, 1.5, 60)[:, None, None] / rank * np.eye(rank)  # some lose positive definiteness
    systems = _noisy_grams(rng, 60, rank, noise=0.1 / rank**1.5) + shifts
    systems[7] = -np.eye(rank)
    if rank > 1:
        systems[:, -1, 0] += 1e3  # the lower triangle is never read
    rhs = rng.normal(size=(60, rank))
    potrf, posv = lapack.get_lapack_funcs(("potrf", "posv"), (systems, rhs))
    want_ok = np.array([potrf(a.T, lower=True, clean=False)[1] == 0 for a in systems])
    assert 0 < want_ok.sum() < len(want_ok)
    assert np.array_equal(positive_definite_mask(systems), want_ok)
    got = solve_positive_definite(systems, rhs)
    for j in np.flatnonzero(want_ok):
        assert np.array_equal(got[j], posv(systems[j].T, rhs[j], lower=True)[1])
    # the float32 and non-contiguous batches take scipy's wrappers: same answers
    assert np.array_equal(positive_definite_mask(systems[::-1])[::-1], want_ok)
    assert np.array_equal(solve_positive_definite(systems[::-1], rhs[::-1])[::-1][want_ok], got[want_ok])


@pytest.mark.parametrize("rank", [1, 5, 64])
def test_compiled_psd_part_equals_the_wrappers_syevr_bit_for_bit(rank: int):
    """psd_part's compiled syevr loop gives the numbers of scipy's wrapper (the former code path)."""
    from scipy.linalg import lapack

    rng = np.random.default_rng(10 + rank)
    grams = _noisy_grams(rng, 30, rank, noise=0.4)
    syevr = lapack.get_lapack_funcs("syevr", (grams,))
    want = grams.copy()
    for k, a in enumerate(grams):
        floor = -float(np.abs(a).sum(axis=1).max()) - 1.0
        eigval, eigvec, found, _, info = syevr(a, compute_v=1, range="V", vl=floor, vu=0.0)
        assert info == 0
        if found:
            want[k] -= (eigvec[:, :found] * eigval[:found]) @ eigvec[:, :found].T
    assert not np.array_equal(want, grams)
    assert np.array_equal(psd_part(grams), want)
    assert np.array_equal(psd_part(grams[::-1])[::-1], want)  # non-contiguous: the wrapper itself
