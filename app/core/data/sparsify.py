"""Sparsified variants of a rating data set: each user's training ratings subsampled to a target median.

The ε-aware defaults must fit the shapes real products have, where most users rate little
(issue 27: the public sets the laws were derived on have medians of 50–76 training ratings a
user). A variant keeps every user and item and thins each user's training row *proportionally*:
user u with n_u training ratings keeps

    m_u = min(n_u, ceil(f · n_u))        (at least one rating for every user who had one)

chosen uniformly at random with a fixed public seed, where the one fraction f is the smallest
(on a 2^-20 grid) whose kept counts have median >= the target; a monotone map of the counts, so
the shape of the count distribution (its heavy tail) is kept and only its scale moves. Other
parts of the user's history (validation ratings, a held-out user's query) are thinned by the
same per-user ratio, ceil(m_u · c / n_u) of c; test ratings and ranking targets are never
touched, so every variant is scored on the same held-out data as its source.
"""

from __future__ import annotations

import numpy as np

from app.core.data.ratings import Ratings
from app.core.data.splits import HeldoutSet, HeldoutSplit

__all__ = ["SPARSIFY_SEED", "kept_counts", "subsample_rows", "thin_like", "sparsify_rating_split",
           "sparsify_ranking_split"]

SPARSIFY_SEED = 27  # public: the issue that asked for the variants
_GRID = 2**20  # f = a / 2^20: integer arithmetic, so the kept counts are exact on every platform


def _scaled(counts: np.ndarray, a: int) -> np.ndarray:
    """min(n, ceil(a n / 2^20)) in exact integer arithmetic."""
    scaled: np.ndarray = np.minimum(counts, -(-(counts * a) // _GRID))
    return scaled


def kept_counts(counts: np.ndarray, target_median: float) -> np.ndarray:
    """m_u = min(n_u, ceil(f n_u)) with the smallest f on the 2^-20 grid whose median over users
    with n_u >= 1 is at least ``target_median`` (f = 1, nothing dropped, when the counts' own median
    is at or below the target). Users without ratings keep none."""
    counts = np.asarray(counts, dtype=np.int64)
    if target_median < 1:
        raise ValueError("the target median must be >= 1")
    rated = counts[counts > 0]
    if len(rated) == 0 or float(np.median(rated)) <= target_median:
        return counts.copy()
    lo, hi = 1, _GRID  # median(_scaled(rated, hi)) > target >= ... find the smallest a reaching it
    while lo < hi:
        mid = (lo + hi) // 2
        if float(np.median(_scaled(rated, mid))) >= target_median:
            hi = mid
        else:
            lo = mid + 1
    return _scaled(counts, lo)


def subsample_rows(ratings: Ratings, keep: np.ndarray, seed: int) -> Ratings:
    """``keep[u]`` of user u's ratings, chosen uniformly at random (same id spaces)."""
    keep = np.asarray(keep, dtype=np.int64)
    if keep.shape != (ratings.n_users,):
        raise ValueError("keep needs one count per user")
    rows, _, _ = ratings.coo()  # CSR order: rows ascending
    order = np.lexsort((np.random.default_rng(seed).random(len(rows)), rows))
    rank = np.empty(len(rows), dtype=np.int64)
    rank[order] = np.arange(len(rows)) - np.searchsorted(rows, rows[order], side="left")
    return ratings.select(rank < keep[rows])


def thin_like(part: Ratings, kept: np.ndarray, counts: np.ndarray, seed: int) -> Ratings:
    """``part`` thinned by each user's ratio kept/counts: ceil(kept_u c_u / n_u) of her c_u ratings
    (rows of ``part`` are the users of ``kept`` and ``counts``)."""
    c = part.user_counts().astype(np.int64)
    n = np.maximum(np.asarray(counts, dtype=np.int64), 1)
    return subsample_rows(part, np.minimum(c, -(-(np.asarray(kept, dtype=np.int64) * c) // n)), seed)


def sparsify_rating_split(train: Ratings, valid: Ratings, test: Ratings, target_median: float,
                          seed: int = SPARSIFY_SEED) -> tuple[Ratings, Ratings, Ratings]:
    """(train, valid, test) with each user's training ratings subsampled to median ``target_median``
    and her validation ratings by the same ratio; ``test`` is returned as it is."""
    counts = train.user_counts()
    kept = kept_counts(counts, target_median)
    rng = np.random.SeedSequence([seed, int(round(target_median * 1000))]).spawn(2)
    streams = [int(s.generate_state(1)[0]) for s in rng]
    return subsample_rows(train, kept, streams[0]), thin_like(valid, kept, counts, streams[1]), test


def sparsify_ranking_split(split: HeldoutSplit, ratings: Ratings, target_median: float,
                           seed: int = SPARSIFY_SEED) -> HeldoutSplit:
    """The held-out-users split with every user's history thinned: the kept ratio m_u / n_u comes
    from each user's ratings in ``ratings`` (the data set the split was drawn from; median
    ``target_median``) and is applied to her positives in ``split.train`` and to a held-out
    user's query. Targets are untouched."""
    counts = ratings.user_counts()
    kept = kept_counts(counts, target_median)
    by_id = {uid: k for k, uid in enumerate(ratings.user_ids.tolist())}
    children = np.random.SeedSequence([seed, int(round(target_median * 1000)), 1]).spawn(3)
    streams = [int(s.generate_state(1)[0]) for s in children]

    def thin(part: Ratings, stream: int) -> Ratings:
        rows = np.fromiter((by_id[u] for u in part.user_ids.tolist()), dtype=np.int64, count=part.n_users)
        return thin_like(part, kept[rows], counts[rows], stream)

    def held(part: HeldoutSet, stream: int) -> HeldoutSet:
        return HeldoutSet(query=thin(part.query, stream), target=part.target)

    return HeldoutSplit(train=thin(split.train, streams[0]), valid=held(split.valid, streams[1]),
                        test=held(split.test, streams[2]))
