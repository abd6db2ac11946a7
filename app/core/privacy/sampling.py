"""Contribution bounding shared by the algorithms: per-user ≤ k sampling and row-norm clipping.

Both bound what one user (the privacy unit: a user and all of her ratings) can add to a released
statistic: sampling keeps at most k of her ratings (Chien et al. 2021, arXiv:2107.09802,
Algorithm 3; Jain, Thakkar & Thakurta 2018, arXiv:1712.09765, the per-user cap before Algorithm 1),
clipping scales her row to L2 norm at most c (Chien et al. 2021, Algorithm 1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from app.core.arrays import BoolArray, FloatArray, IntArray
from app.core.data.ratings import Ratings

__all__ = ["KeysOf", "clip_rows", "clip_scale", "lowest_k_per_row", "per_user_sample", "sort_pairs"]


_CHUNK = 1 << 20  # ratings per pass of the per-row selection: its temporaries stay O(chunk), not O(nnz)

KeysOf = Callable[[int, int], FloatArray]


def per_user_sample(ratings: Ratings, k: int, rng: np.random.Generator | KeysOf, *,
                    chunk: int = _CHUNK) -> BoolArray:
    """Boolean mask (CSR order) keeping at most k uniformly random ratings of each user.

    The keys are ``rng.random`` drawn chunk by chunk of whole users, in CSR order: the same
    stream as one draw for all ratings, at O(chunk) memory; or ``rng(start, stop)``, the keys of
    ratings [start, stop) in CSR order (keyed by user and item: ``app.core.privacy.keyed``).
    ``chunk`` (ratings per pass) exists for tests and tuning; the mask does not depend on it.
    """
    keys_of = rng if callable(rng) else (lambda start, stop: rng.random(stop - start))
    indptr = ratings.csr.indptr
    keep = np.ones(int(indptr[-1]), dtype=bool)
    for first, last in _row_chunks(indptr, chunk):
        start, stop = int(indptr[first]), int(indptr[last])
        rows = np.repeat(np.arange(last - first), np.diff(indptr[first : last + 1]))
        keep[start:stop] = _lowest_k_in_chunk(rows, keys_of(start, stop), k)
    return keep


def lowest_k_per_row(rows: IntArray, keys: FloatArray | KeysOf, k: int, *, chunk: int = _CHUNK) -> BoolArray:
    """Mask keeping, within each row, the k entries with the smallest keys.

    ``keys``: an array, or ``keys(start, stop)`` giving those of ``rows[start:stop]``, called
    once per chunk in increasing order (a caller that draws random keys draws them as it would
    in one go, without an O(nnz) key array). Sorted ``rows`` (CSR order) are handled a chunk of
    whole rows at a time; rows with at most k entries are kept whole, only the longer are sorted.
    ``chunk`` (entries per pass) exists for tests and tuning; the mask does not depend on it.
    """
    n = len(rows)
    if n == 0:  # no entries (an empty partition, an empty data set): nothing to select
        return np.ones(0, dtype=bool)
    if not bool(np.all(rows[1:] >= rows[:-1])):
        values = keys(0, n) if callable(keys) else keys
        return _lowest_k_in_chunk(rows, values, k)
    keep = np.ones(n, dtype=bool)
    ends = np.flatnonzero(rows[1:] != rows[:-1]) + 1
    bounds = np.concatenate([[0], ends, [n]])
    for first, last in _row_chunks(bounds, chunk):
        start, stop = int(bounds[first]), int(bounds[last])
        values = keys(start, stop) if callable(keys) else keys[start:stop]
        keep[start:stop] = _lowest_k_in_chunk(rows[start:stop] - rows[start], values, k)
    return keep


def _row_chunks(indptr: IntArray, chunk: int) -> Iterator[tuple[int, int]]:
    """(first row, end row) of consecutive whole rows holding about ``chunk`` entries each
    (``indptr``: the rows' start offsets and the total, CSR style); a longer row is a chunk alone."""
    n_rows = len(indptr) - 1
    first = 0
    while first < n_rows:
        last = int(np.searchsorted(indptr, indptr[first] + chunk, side="right")) - 1
        last = min(max(last, first + 1), n_rows)
        yield first, last
        first = last


def _lowest_k_in_chunk(rows: IntArray, keys: FloatArray, k: int) -> BoolArray:
    """:func:`lowest_k_per_row` on one block of rows (non-negative row numbers, any order)."""
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
