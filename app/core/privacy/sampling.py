"""Contribution bounding shared by the algorithms: per-user ≤ k sampling and row-norm clipping.

Both bound what one user (the privacy unit: a user and all of her ratings) can add to a released
statistic: sampling keeps at most k of her ratings (Chien et al. 2021, arXiv:2107.09802,
Algorithm 3; Jain, Thakkar & Thakurta 2018, arXiv:1712.09765, the per-user cap before Algorithm 1),
clipping scales her row to L2 norm at most c (Chien et al. 2021, Algorithm 1).
"""

from __future__ import annotations

import numpy as np

from app.core.arrays import BoolArray, FloatArray, IntArray
from app.core.data.ratings import Ratings

__all__ = ["clip_rows", "clip_scale", "lowest_k_per_row", "per_user_sample", "sort_pairs"]


def per_user_sample(ratings: Ratings, k: int, rng: np.random.Generator) -> BoolArray:
    """Boolean mask (CSR order) keeping at most k uniformly random ratings of each user."""
    rows, _, _ = ratings.coo()
    return lowest_k_per_row(rows, rng.random(len(rows)), k)


def lowest_k_per_row(rows: IntArray, keys: FloatArray, k: int) -> BoolArray:
    """Mask keeping, within each row, the k entries with the smallest keys.

    Rows with at most k entries are kept whole; only the longer rows are sorted.
    """
    counts = np.bincount(rows) if len(rows) else np.zeros(0, dtype=np.int64)
    keep = np.ones(len(rows), dtype=bool)
    long_rows = np.flatnonzero(counts[rows] > k) if len(rows) else np.zeros(0, dtype=np.int64)
    if len(long_rows) == 0:
        return keep
    order = long_rows[sort_pairs(rows[long_rows], _ranks(keys[long_rows]))]
    sorted_rows = rows[order]
    starts = np.concatenate([[0], np.cumsum(np.bincount(sorted_rows))])[sorted_rows]
    keep[order[np.arange(len(order)) - starts >= k]] = False
    return keep


def _ranks(keys: FloatArray) -> IntArray:
    """0..n-1 ranks of ``keys`` (ties in an arbitrary but deterministic order)."""
    ranks = np.empty(len(keys), dtype=np.int64)
    ranks[np.argsort(keys)] = np.arange(len(keys))
    return ranks


def sort_pairs(major: IntArray, minor: IntArray) -> IntArray:
    """Argsort by (major, minor), non-negative integers, distinct pairs: one int64 sort."""
    span = int(minor.max()) + 1 if len(minor) else 1
    return np.argsort(major.astype(np.int64) * span + minor)


def clip_scale(norms: FloatArray, bound: float) -> FloatArray:
    """min(1, c/‖u‖) per row: the factor that clips a row of norm ``norms`` to ``bound``."""
    return np.asarray(np.minimum(1.0, bound / np.maximum(norms, 1e-300)))


def clip_rows(x: FloatArray, bound: float) -> FloatArray:
    """clip(u, c) = u·min(1, c/‖u‖) per row (the paper prints max: a typo)."""
    return np.asarray(x * clip_scale(np.linalg.norm(x, axis=1), bound)[:, None])
