"""Batched dense kernels of the ALS-type solvers: Gram formation, symmetric noise layout, solves.

Chien et al. 2021 (arXiv:2110.05638), Algorithm 1: every trained item j solves
    v_j = (Π_PSD(Ã_j) + λ0 K̃ + λ r_j I)⁻¹ b̃_j
with Ã_j the noisy Gram matrix. An r × r eigen-decomposition per item is the slow part of that
step; :func:`solve_noisy_systems` replaces it by one batched Cholesky test and a batched LU solve,
keeping the exact projection only for the items whose unprojected system is not positive
definite. Which system is solved depends only on released quantities (Ã_j, b̃_j, the DP
recounts behind r_j) and public terms, so the choice is post-processing and costs no privacy.

Gram matrices are formed as one batched matrix product per bucket of padded rows; the gathered
factors are multiplied through a transposed view (no copy: BLAS reads it column-major).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = [
    "gather_rows",
    "gram_and_rhs",
    "symmetric_from_upper",
    "positive_definite_mask",
    "solve_noisy_systems",
    "project_psd",
]


def gather_rows(padded: np.ndarray, cols: np.ndarray, sqrt_weights: np.ndarray | None) -> np.ndarray:
    """(g, L, r) rows ``padded[cols]``, each scaled by its sqrt weight when ``sqrt_weights`` is given."""
    x = np.take(padded, cols, axis=0)
    if sqrt_weights is not None:
        x *= sqrt_weights.astype(padded.dtype, copy=False)[:, :, None]
    return x


def gram_and_rhs(x: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Xᵀ X, Xᵀ y) for a batch: X is (g, L, r) (already weighted), ``targets`` y is (g, L).

    ``x.transpose(0, 2, 1)`` is a column-major view of each Xᵀ, which batched GEMM reads as is.
    """
    xt = x.transpose(0, 2, 1)
    gram = np.matmul(xt, x)
    rhs = np.matmul(xt, targets.astype(x.dtype, copy=False)[:, :, None])[:, :, 0]
    return gram, rhs


@lru_cache(maxsize=64)
def _upper_index(rank: int) -> np.ndarray:
    """(rank, rank) map from (i, j) to the position of (min(i, j), max(i, j)) in ``np.triu_indices`` order."""
    rows, cols = np.triu_indices(rank)
    index = np.empty((rank, rank), dtype=np.intp)
    index[rows, cols] = np.arange(len(rows))
    index[cols, rows] = np.arange(len(rows))
    index.setflags(write=False)
    return index


def symmetric_from_upper(upper: np.ndarray, rank: int) -> np.ndarray:
    """Symmetric (..., rank, rank) matrices from their upper triangles in ``np.triu_indices`` order.

    One gather; equal element for element to scattering ``upper`` into the upper and lower triangles.
    """
    return np.take(upper, _upper_index(rank), axis=-1)


def project_psd(matrices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Π_PSD by eigen-decomposition: returns (clamped eigenvalues, eigenvectors)."""
    eigval, eigvec = np.linalg.eigh(matrices)
    return np.maximum(eigval, 0.0), eigvec


def positive_definite_mask(systems: np.ndarray) -> np.ndarray:
    """Which of the symmetric ``systems`` (n, r, r) have a Cholesky factor (are numerically PD).

    One batched Cholesky; if it fails the batch is halved recursively, so f failures cost
    O(f log n) smaller factorisations.
    """
    n = len(systems)
    if n == 0:
        return np.zeros(0, dtype=bool)
    try:
        np.linalg.cholesky(systems)
        return np.ones(n, dtype=bool)
    except np.linalg.LinAlgError:
        if n == 1:
            return np.zeros(1, dtype=bool)
    half = n // 2
    return np.concatenate([positive_definite_mask(systems[:half]), positive_definite_mask(systems[half:])])


def solve_noisy_systems(
    grams: np.ndarray,
    rhs: np.ndarray,
    ridge: np.ndarray,
    extra: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """Solve Σ_j x_j = b_j for a batch of noisy Grams Ã_j; return (x, number of projected systems).

    Σ_j = Ã_j + E_j + ridge_j I when that is positive definite, else Π_PSD(Ã_j) + E_j + ridge_j I
    (positive definite for ridge_j > 0, since E_j, a sum of exact Gram terms, is PSD). ``extra``
    E is (r, r) or (n, r, r). The data-independent diagonal shift ridge_j = λ r_j (public λ, DP
    recounts) makes the unprojected system positive definite with high probability once it
    exceeds the noise's spectral edge ≈ 2σ√r; the exact projection (arXiv:2110.05638, Alg. 1)
    runs only for the remaining items. Post-processing of released and public quantities only.
    ``grams`` is overwritten.
    """
    rank = grams.shape[-1]
    system = grams
    if extra is not None:
        system += extra
    system += ridge[:, None, None] * np.eye(rank)
    ok = positive_definite_mask(system)
    if ok.all():
        return np.linalg.solve(system, rhs[:, :, None])[:, :, 0], 0
    out = np.empty(rhs.shape)
    if ok.any():
        out[ok] = np.linalg.solve(system[ok], rhs[ok][:, :, None])[:, :, 0]
    bad = np.flatnonzero(~ok)
    # Ã_j recovered by subtracting what was added (exact up to rounding; saves a batch copy)
    if len(bad):
        noisy = system[bad] - ridge[bad, None, None] * np.eye(rank)
        if extra is not None:
            noisy -= extra if extra.ndim == 2 else extra[bad]
        eigval, eigvec = project_psd(noisy)
        projected = np.matmul(eigvec * eigval[:, None, :], np.swapaxes(eigvec, 1, 2))
        if extra is not None:
            projected += extra if extra.ndim == 2 else extra[bad]
        projected += ridge[bad, None, None] * np.eye(rank)
        out[bad] = np.linalg.solve(projected, rhs[bad][:, :, None])[:, :, 0]
    return out, int(len(bad))
