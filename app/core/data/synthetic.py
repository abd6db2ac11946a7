"""Seeded synthetic rating data.

* :func:`paper_synthetic` - the DPALS paper's setup (Chien et al. 2021, arXiv:2107.09802, Sec. 5 "Synthetic data"):
  rank-5 ground truth M* = U* V*^T with U*, V* random orthonormal (QR of a Gaussian), every entry
  observed independently with probability p = 20 log(n) / m (natural log), scaled so that the
  observed ratings have standard deviation 1 (predicting the global average gives RMSE ~ 1).
* :func:`production_synthetic` - production-shaped data at scale (e.g. 150K users x 25K items x
  20M ratings in seconds): Zipf item popularity, Pareto user activity, rating = global mean + user
  bias + item bias + low-rank interaction + Gaussian noise, clipped to [1, 5] and (by default)
  rounded to 0.5 steps like MovieLens-20M. No (user, item) pair appears twice.

Both return :class:`SyntheticData`, which keeps the noise-free ground truth for tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from app.core.data.ratings import Ratings

__all__ = ["SyntheticData", "paper_synthetic", "production_synthetic"]

_CHUNK = 1 << 20


@dataclass(frozen=True)
class SyntheticData:
    """Ratings plus their ground truth ``offset + user_bias[u] + item_bias[i] + U[u] . V[i]``."""

    ratings: Ratings
    user_factors: np.ndarray
    item_factors: np.ndarray
    offset: float = 0.0
    user_bias: np.ndarray | None = None
    item_bias: np.ndarray | None = None
    p: float | None = None  # observation probability (paper setup only)

    def truth(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Noise-free value of the (row, col) index pairs (computed in chunks)."""
        return _truth(self.user_factors, self.item_factors, rows, cols, self.offset, self.user_bias, self.item_bias)


def _truth(
    U: np.ndarray,
    V: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    offset: float = 0.0,
    user_bias: np.ndarray | None = None,
    item_bias: np.ndarray | None = None,
) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    out = np.empty(len(rows), dtype=np.float64)
    for lo in range(0, len(rows), _CHUNK):
        r, c = rows[lo : lo + _CHUNK], cols[lo : lo + _CHUNK]
        out[lo : lo + _CHUNK] = np.einsum("ij,ij->i", U.take(r, axis=0), V.take(c, axis=0))
    out += offset
    if user_bias is not None:
        out += user_bias[rows]
    if item_bias is not None:
        out += item_bias[cols]
    return out


def _random_orthonormal(rng: np.random.Generator, n: int, r: int) -> np.ndarray:
    """n x r matrix with orthonormal columns: Q of the QR decomposition of a Gaussian matrix."""
    q, rr = np.linalg.qr(rng.standard_normal((n, r)))
    return q * np.sign(np.diag(rr))  # sign fix makes Q Haar-distributed


# ---------------------------------------------------------------------------- paper setup
def paper_synthetic(
    n_users: int, n_items: int = 1000, rank: int = 5, seed: int = 0, p: float | None = None
) -> SyntheticData:
    """The DPALS paper's synthetic matrix completion problem (Chien et al. 2021, Sec. 5).

    Entry (i, j) is observed with probability ``p`` (default 20 ln(n) / m). Ground truth
    M* = s U* V*^T with s chosen so the observed ratings have unit (population) std.
    """
    if n_users < 1 or n_items < 1 or rank < 1 or rank > min(n_users, n_items):
        raise ValueError(f"need 1 <= rank <= min(n_users, n_items), got n={n_users}, m={n_items}, r={rank}")
    if p is None:
        p = 20.0 * math.log(n_users) / n_items
    if not 0.0 < p <= 1.0:
        raise ValueError(f"observation probability p = {p:.4g} is outside (0, 1]; use more items or pass p")
    rng = np.random.default_rng(seed)
    U = _random_orthonormal(rng, n_users, rank)
    V = _random_orthonormal(rng, n_items, rank)
    rows_l, cols_l = [], []
    step = max(1, _CHUNK * 8 // n_items)
    for lo in range(0, n_users, step):
        r, c = np.nonzero(rng.random((min(step, n_users - lo), n_items)) < p)
        rows_l.append(r + lo)
        cols_l.append(c)
    rows = np.concatenate(rows_l).astype(np.int64)
    cols = np.concatenate(cols_l).astype(np.int64)
    if len(rows) < 2:
        raise ValueError("fewer than two entries observed; increase n_users, n_items or p")
    vals = _truth(U, V, rows, cols)
    scale = 1.0 / float(np.std(vals))
    vals *= scale
    U *= math.sqrt(scale)
    V *= math.sqrt(scale)
    ratings = Ratings.from_indices(
        rows, cols, vals, user_ids=np.arange(n_users, dtype=np.int64), item_ids=np.arange(n_items, dtype=np.int64)
    )
    return SyntheticData(ratings=ratings, user_factors=U, item_factors=V, p=float(p))


# ---------------------------------------------------------------------------- production shape
def _allocate(raw: np.ndarray, total: int, lo: int, hi: int, rng: np.random.Generator) -> np.ndarray:
    """Integer counts ~ proportional to ``raw``, each in [lo, hi], summing exactly to ``total``."""
    def counts_at(s: float) -> np.ndarray:
        return np.clip(np.floor(raw * s), lo, hi).astype(np.int64)

    a, b = 0.0, 1.0
    while counts_at(b).sum() < total:
        b *= 2.0
    for _ in range(100):
        mid = 0.5 * (a + b)
        if counts_at(mid).sum() <= total:
            a = mid
        else:
            b = mid
    counts = counts_at(a)
    rem = total - int(counts.sum())
    while rem > 0:  # hand out the rounding remainder, one rating per random user below the cap
        free = np.flatnonzero(counts < hi)
        pick = rng.choice(free, size=min(rem, len(free)), replace=False)
        counts[pick] += 1
        rem -= len(pick)
    return counts


def _alias_table(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker/Vose alias table: O(1) weighted draws (searchsorted on a CDF is ~5x slower at 20M)."""
    m = len(weights)
    prob = (weights * (m / weights.sum())).tolist()
    alias = list(range(m))
    small = [j for j, q in enumerate(prob) if q < 1.0]
    large = [j for j, q in enumerate(prob) if q >= 1.0]
    while small and large:
        s, g = small.pop(), large.pop()  # a small and a large column of the alias table
        alias[s] = g
        prob[g] -= 1.0 - prob[s]
        (small if prob[g] < 1.0 else large).append(g)
    for j in small + large:  # numerical leftovers are certain picks
        prob[j] = 1.0
    return np.asarray(prob), np.asarray(alias, dtype=np.int64)


def _weighted_draws(weights: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` i.i.d. indices with P(j) proportional to ``weights[j]``."""
    if size < 20 * len(weights):  # small draws: a CDF search is cheaper than building a table
        cdf = np.cumsum(weights)
        return np.asarray(np.minimum(np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right"), len(weights) - 1))
    prob, alias = _alias_table(weights)
    idx = rng.integers(0, len(weights), size)
    return np.where(rng.random(size) < prob[idx], idx, alias[idx])


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct values (sort + neighbour compare; faster than np.unique's hash path here)."""
    keys.sort()
    keep = np.empty(len(keys), dtype=bool)
    keep[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


def _sample_pairs(
    counts: np.ndarray, weights: np.ndarray, rng: np.random.Generator, max_rounds: int = 40
) -> np.ndarray:
    """Sorted-per-round unique keys ``user * m + item``: user u gets ``counts[u]`` distinct items.

    Round 0 draws ``counts[u]`` items per user with replacement from ``weights``, then keeps the
    distinct ones. Later rounds redraw only the shortfall, from progressively flatter weights
    (w ** 0.5**t), which approximates weighted sampling without replacement and converges fast even
    for heavy users. A rare leftover shortfall is filled uniformly from each user's unrated items.
    """
    n, m = len(counts), len(weights)
    users = np.arange(n, dtype=np.int64)
    chunks: list[np.ndarray] = []
    deficit = counts.astype(np.int64)
    for t in range(max_rounds):
        if not deficit.any():
            break
        draw_u = np.repeat(users, deficit)
        items = _weighted_draws(weights ** (0.5**t), len(draw_u), rng)
        keys = _sorted_unique(draw_u * m + items)
        for old in chunks:
            pos = np.minimum(np.searchsorted(old, keys), len(old) - 1)
            keys = keys[old[pos] != keys]
        if len(keys):
            chunks.append(keys)
        deficit -= np.bincount(keys // m, minlength=n)
    for u in np.flatnonzero(deficit):  # practically never reached
        have = np.concatenate([c[(c >= u * m) & (c < (u + 1) * m)] for c in chunks]) - u * m
        free = np.setdiff1d(np.arange(m), have)
        chunks.append(u * m + np.sort(rng.choice(free, size=int(deficit[u]), replace=False)))
    return np.concatenate(chunks)


def production_synthetic(
    n_users: int,
    n_items: int,
    n_ratings: int,
    rank: int = 16,
    seed: int = 0,
    noise: float = 0.5,
    *,
    item_exponent: float = 0.9,
    user_exponent: float = 1.2,
    min_user_ratings: int = 5,
    max_user_fraction: float = 0.3,
    global_mean: float = 3.5,
    bias_std: float = 0.35,
    signal_std: float = 0.8,
    discrete: bool = True,
) -> SyntheticData:
    """Production-shaped synthetic ratings on a 1..5 scale.

    Item popularity is Zipf: the item of popularity rank k (a random permutation of ids) has
    sampling weight (k+1)^-item_exponent. User activity is Pareto(user_exponent), scaled so the
    counts sum to exactly ``n_ratings``, each in [min_user_ratings, max_user_fraction * n_items].
    Value = global_mean + b_u + b_i + u.v + N(0, noise^2) with b ~ N(0, bias_std^2) and the
    interaction's std equal to ``signal_std``; clipped to [1, 5] and rounded to 0.5 steps when
    ``discrete`` (else continuous). ``truth()`` is the noise-free, unclipped value.
    """
    if min(n_users, n_items, rank) < 1 or n_ratings < 1:
        raise ValueError("n_users, n_items, n_ratings and rank must be positive")
    if noise < 0 or signal_std < 0 or bias_std < 0:
        raise ValueError("noise, signal_std and bias_std must be >= 0")
    hi = max(1, int(max_user_fraction * n_items))
    lo = min(min_user_ratings, hi)
    if not n_users * lo <= n_ratings <= n_users * hi:
        raise ValueError(
            f"{n_ratings} ratings cannot be spread over {n_users} users with {lo}..{hi} ratings each"
        )
    rng = np.random.default_rng(seed)
    item_weights = (rng.permutation(n_items) + 1.0) ** -item_exponent
    activity = rng.pareto(user_exponent, n_users) + 1.0
    counts = _allocate(activity, n_ratings, lo, hi, rng)
    keys = _sample_pairs(counts, item_weights, rng)
    rows, cols = keys // n_items, keys % n_items
    del keys

    a = (signal_std**2 / rank) ** 0.25  # factor entry std: Var(u.v) = rank * a^4
    U = rng.normal(0.0, a, (n_users, rank))
    V = rng.normal(0.0, a, (n_items, rank))
    ub = rng.normal(0.0, bias_std, n_users)
    ib = rng.normal(0.0, bias_std, n_items)
    vals = _truth(U, V, rows, cols, global_mean, ub, ib)
    vals += rng.normal(0.0, noise, len(vals)) if noise > 0 else 0.0
    if discrete:
        vals = np.round(vals * 2.0) / 2.0
    np.clip(vals, 1.0, 5.0, out=vals)
    ratings = Ratings.from_indices(
        rows, cols, vals, user_ids=np.arange(n_users, dtype=np.int64), item_ids=np.arange(n_items, dtype=np.int64)
    )
    return SyntheticData(ratings, U, V, global_mean, ub, ib)
