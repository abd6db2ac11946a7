"""A private quantile of per-user counts: a Gaussian histogram on a public geometric grid.

Issue 27 sets the contribution bound k from the data instead of a constant fitted to one data
set. The statistic is a histogram of each user's number of entries over public power-of-two bins
(bin b holds counts in [2^b, 2^(b+1)), the last bin is open). Every user falls into exactly one bin,
so adding or removing one user changes one coordinate by 1: L1 = L2 sensitivity 1, whatever her
count (tested numerically in ``tests/unit/test_bound_from_data.py``). The histogram is released by
the Gaussian mechanism like every other DPALS release; the quantile read off it is post-processing.

The grid stops at a public top: counts at or above ``2^(n_bins − 1)`` share the last bin, so only
bins that can move the answer carry noise.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["HISTOGRAM_SENSITIVITY", "count_histogram", "histogram_bins", "histogram_quantile"]

HISTOGRAM_SENSITIVITY = 1.0
"""L2 sensitivity of :func:`count_histogram`: one user is one unit in one bin."""
_MAX_BINS = 24  # 2^23 entries a user: far beyond any bound a worker can train with


def histogram_bins(largest: float) -> int:
    """The number of bins needed to tell counts apart up to ``largest`` (public): the last bin opens at
    the first power of two above it."""
    if not (math.isfinite(largest) and largest >= 1):
        raise ValueError("largest must be finite and >= 1")
    return min(_MAX_BINS, int(math.floor(math.log2(largest))) + 2)


def count_histogram(per_user: np.ndarray, n_bins: int) -> np.ndarray:
    """How many users have a count in each power-of-two bin (users with no entries are in none).
    Integer-valued, so sums over partitions of the users are exact in any order."""
    counts = np.asarray(per_user)
    counts = counts[counts > 0]
    bins = np.minimum(np.floor(np.log2(counts)).astype(np.int64), n_bins - 1)
    return np.bincount(bins, minlength=n_bins).astype(np.float64)


def histogram_quantile(noisy: np.ndarray, q: float) -> float:
    """The q-quantile of the counts from a noisy histogram (post-processing), NaN when its noisy
    total is not positive.

    The cumulative sums of the raw noisy bins (negative bins are not clipped: clipping would bias
    the total upwards by the empty bins' noise) are made monotone; the answer interpolates
    geometrically inside the bin where they cross q·total, bin b spanning [2^b, 2^(b+1)).
    """
    if not 0 < q < 1:
        raise ValueError("q must lie in (0, 1)")
    cumulative = np.maximum.accumulate(np.cumsum(np.asarray(noisy, dtype=np.float64)))
    total = float(cumulative[-1])
    if not total > 0:
        return math.nan
    target = q * total
    b = int(np.searchsorted(cumulative, target, side="left"))
    before = float(cumulative[b - 1]) if b else 0.0
    mass = float(cumulative[b]) - before
    within = 0.0 if mass <= 0 else min(1.0, max(0.0, (target - before) / mass))
    return float(2.0 ** (b + within))
