"""Privileged scoring: one user's embedding from the public model plus that user's ratings only.

Joint DP (Chien et al., arXiv:2107.09802, Def. 3 and Fig. 1, after Kearns et al. 2014; docs/algorithms.md
§0): u_i is a function of the published model and user i's own data, and is returned only to
user i, so computing it is post-processing of the public release and costs no privacy budget.
The solve is the user step of training:
    u = (V_Hᵀ V_H + ridge(c) I + λ0 VᵀV)⁻¹ V_Hᵀ (clip(r_H − m̃ − b_u − b̃_H, ±Γ_M))   O(|H| r² + r³)
with H the user's rated items that belong to the trained set, b̃ the DP item biases and b_u the
user's own shrunken offset; the predicted rating of item j is m̃ + b_u + b̃_j + u·v_j.

Also the non-private item-side helpers: similar items (cosine on V) and DP-popular items.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from app.core.data.ratings import Ratings
from app.core.mf.als import make_plan, solve_side
from app.core.mf.model import PublicModel

__all__ = [
    "candidate_items", "fold_in", "fold_in_state", "fold_in_users", "user_offset", "user_offsets", "predict_ratings",
    "score_items", "user_scores", "objective_view", "is_ranking", "recommend", "top_n", "top_n_allowed", "best_positions",
    "on_scale", "ranked",
    "similar_items", "popular_items",
    "self_calibrated_solve", "self_calibrated_batch", "self_calibrating", "leave_one_out_press",
]


@lru_cache(maxsize=8)
def _gravity_matrix(model: PublicModel) -> np.ndarray:
    """λ0·VᵀV over the published factors (cached per model object)."""
    v = model.item_factors
    return np.asarray(model.user_reg.gravity * (v.T @ v))


def _as_index_array(item_idx: np.ndarray, n_items: int) -> np.ndarray:
    idx = np.asarray(item_idx, dtype=np.int64).reshape(-1)
    if len(idx) and (idx.min() < 0 or idx.max() >= n_items):
        raise ValueError("item index out of range")
    ordered = np.sort(idx)  # a sort and a neighbour test: a fraction of np.unique's cost at ~10^2 ratings
    if np.any(ordered[1:] == ordered[:-1]):
        raise ValueError("duplicate items in the user's ratings")
    return idx


def user_offset(model: PublicModel, values: np.ndarray, item_idx: np.ndarray | None = None) -> float:
    """m̃ + b_u: the DP mean plus the user's own (shrunken) offset, from all of her ratings.

    b_u is fitted to her residuals after the DP item biases b̃_j of the rated items ``item_idx``
    (required when the model has item biases).
    """
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    residual = values - model.global_mean - _rated_biases(model, item_idx, len(values))
    bias = model.user_reg.user_bias(np.sum(residual), len(values))
    return float(model.global_mean + bias)


def _rated_biases(model: PublicModel, item_idx: np.ndarray | None, n: int) -> np.ndarray:
    biases = centring_biases(model)
    if item_idx is None:
        if np.any(biases):
            raise ValueError("the model has item biases: pass the rated items' indices")
        return np.zeros(n)
    return biases[np.asarray(item_idx, dtype=np.int64).reshape(-1)]


def is_ranking(model: PublicModel) -> bool:
    return model.config.get("objective") == "ranking"


def centring_biases(model: PublicModel) -> np.ndarray:
    """The item biases a user's ratings are centred by before her solve: the DP biases of a
    rating model; none for a ranking model, whose biases are a popularity prior added at scoring."""
    return np.zeros(model.n_items) if is_ranking(model) else model.item_biases


def fold_in(model: PublicModel, item_idx: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The user's embedding (zero when none of their rated items is in the trained set)."""
    return fold_in_state(model, item_idx, values)[0]


def fold_in_state(model: PublicModel, item_idx: np.ndarray,
                  values: np.ndarray) -> tuple[np.ndarray, float | None]:
    """(u, m̃ + b_u): :func:`fold_in`'s embedding and the :func:`user_offset` its solve centred
    by (None without ratings: the predictions start from m̃), both from one pass over the data."""
    idx = _as_index_array(item_idx, model.n_items)
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if len(values) != len(idx):
        raise ValueError("item indices and values differ in length")
    if not np.all(np.isfinite(values)):
        raise ValueError("ratings contain NaN or infinite values")
    offset = user_offset(model, values, idx) if len(values) else None
    return _solve_user(model, idx, values, model.global_mean if offset is None else offset), offset


def _solve_user(model: PublicModel, idx: np.ndarray, values: np.ndarray, offset: float) -> np.ndarray:
    """The user solve on her rated items that are in the trained set, centred by ``offset``."""
    keep = model.trained_mask[idx]
    idx, values = idx[keep], values[keep]
    if len(idx) == 0:
        return np.zeros(model.rank)
    centred = _clip_centred(model, values - offset - centring_biases(model)[idx])
    x = model.item_factors[idx]
    ridge = float(model.user_reg.ridge(np.array([len(idx)]))[0])
    gravity = _gravity_matrix(model) if model.user_reg.gravity else None
    if self_calibrating(model):
        return self_calibrated_solve(x, centred, ridge, gravity)
    system = x.T @ x + ridge * np.eye(model.rank)
    if gravity is not None:
        system += gravity
    return np.linalg.solve(system, x.T @ centred)


# extra ridge tried by the self-calibration, in units of the mean eigenvalue of the user's system
CALIBRATION_RIDGES = (0.0, 1 / 64, 1 / 16, 1 / 4, 1.0, 4.0, 16.0)
# Issue 27: the weak candidates (below WEAK_RIDGE) count only for a user with at least
# RELIABLE_RATINGS_PER_DIM ratings per dimension of the model. With about a dozen ratings the
# smallest leave-out error over many ridges is an optimistic pick that favours the weakest ridge by
# chance (Jester-1 thinned to a median of 10 ratings a user, rank 8, ε = 8: validation RMSE 4.89
# with them, 4.69 without; the user mean 4.79), while a user with many ratings may need them (a
# strong signal would be shrunk); on ML-1M, ML-100K and full Jester-1 dropping them for everyone
# moved RMSE by at most 0.0007 at ε = 2, 8 and 20.
WEAK_RIDGE = 1 / 4
RELIABLE_RATINGS_PER_DIM = 4
MIN_CALIBRATION_RATINGS = 3  # fewer ratings: the plain solve (a leave-out needs something left)


def self_calibrating(model: PublicModel) -> bool:
    """Whether the model's fold-in picks each user's ridge from her own ratings (rating objective)."""
    return bool(model.config.get("self_calibration")) and not is_ranking(model)


def self_calibrated_solve(x: np.ndarray, y: np.ndarray, ridge: float, shared: np.ndarray | None) -> np.ndarray:
    """The user's embedding with her ridge chosen by exact leave-one-out on her own ratings.

    Per-user self-calibration (privileged post-processing, free): candidates are
    the model's ridge plus t·ḡ (t in :data:`CALIBRATION_RIDGES`, ḡ the mean eigenvalue of
    XᵀX + λ0 K; t below :data:`WEAK_RIDGE` only with :data:`RELIABLE_RATINGS_PER_DIM` ratings per
    dimension) and u = 0 (the user's baseline alone). With A = XᵀX + S + λI, the leave-one-out
    residual of rating i is (y_i − ŷ_i)/(1 − x_iᵀA⁻¹x_i) (Sherman–Morrison; Allen 1974, the PRESS
    statistic), so every candidate costs O(n r) after one r×r eigen-decomposition; the candidate
    with the smallest sum of squared leave-out residuals wins (ties: the smaller ridge).
    """
    solved: np.ndarray = self_calibrated_batch(x[None], y[None], np.array([ridge]), shared)[0]
    return solved


def self_calibrated_batch(x: np.ndarray, y: np.ndarray, ridge: np.ndarray, shared: np.ndarray | None) -> np.ndarray:
    """:func:`self_calibrated_solve` for g users at once: ``x`` (g, L, r) and ``y`` (g, L) padded
    with zero rows (which change neither a solve nor a leave-out residual), ``ridge`` (g,)."""
    rank = x.shape[-1]
    system = np.matmul(np.swapaxes(x, 1, 2), x)
    if shared is not None:
        system = system + shared
    eigval, eigvec = np.linalg.eigh(system)
    eigval = np.maximum(eigval, 0.0)
    ridges = ridge[:, None] + np.asarray(CALIBRATION_RIDGES)[None, :] * np.maximum(eigval.mean(axis=1), 1e-12)[:, None]
    press, coef = _leave_one_out(np.matmul(x, eigvec), eigval, y, ridges)
    n_rated = np.count_nonzero(x.any(axis=2), axis=1)
    weak = np.asarray(CALIBRATION_RIDGES) < WEAK_RIDGE
    press[np.ix_(n_rated < RELIABLE_RATINGS_PER_DIM * rank, weak)] = np.inf  # too few ratings to trust them
    best = np.argmin(press, axis=1)
    chosen = np.take_along_axis(coef, best[:, None, None], axis=2)[:, :, 0]
    users = np.matmul(eigvec, chosen[:, :, None])[:, :, 0]
    baseline = np.sum(y**2, axis=1) < press[np.arange(len(best)), best]
    users[baseline] = 0.0
    few = n_rated < MIN_CALIBRATION_RATINGS
    if few.any():  # a leave-out needs something left: the plain solve
        plain = system[few] + ridge[few, None, None] * np.eye(rank)
        users[few] = np.linalg.solve(plain, np.matmul(np.swapaxes(x[few], 1, 2), y[few][:, :, None]))[:, :, 0]
    result: np.ndarray = users
    return result


def leave_one_out_press(x: np.ndarray, y: np.ndarray, ridges: np.ndarray, shared: np.ndarray | None = None) -> np.ndarray:
    """Σ_i (y_i − x_iᵀu_{−i})² of the ridge solve u = (XᵀX + S + λI)⁻¹Xᵀy, one value per λ in ``ridges``."""
    system = x.T @ x if shared is None else x.T @ x + shared
    eigval, eigvec = np.linalg.eigh(system)
    ridges = np.asarray(ridges, dtype=np.float64)[None, :]
    press: np.ndarray = _leave_one_out((x @ eigvec)[None], np.maximum(eigval, 0.0)[None], y[None], ridges)[0][0]
    return press


def _leave_one_out(projected: np.ndarray, eigval: np.ndarray, y: np.ndarray,
                   ridges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(PRESS (g, K), solutions in each eigenbasis (g, r, K)) from P = XQ (g, L, r), the eigenvalues
    (g, r) of each system, targets (g, L) and K candidate ridges per user (g, K)."""
    inverse = 1.0 / (eigval[:, :, None] + ridges[:, None, :])
    coef = np.matmul(np.swapaxes(projected, 1, 2), y[:, :, None]) * inverse
    leverage = np.matmul(projected**2, inverse)
    residual = (y[:, :, None] - np.matmul(projected, coef)) / np.maximum(1.0 - leverage, 1e-9)
    return np.sum(residual**2, axis=1), coef


def _clip_centred(model: PublicModel, centred: np.ndarray) -> np.ndarray:
    clip = model.config.get("clip_rating")
    return centred if clip is None else np.clip(centred, -clip, clip)


def user_offsets(model: PublicModel, ratings: Ratings) -> np.ndarray:
    """:func:`user_offset` for every row of ``ratings`` (global mean for users without ratings)."""
    rows, cols, values = ratings.coo()
    residual = values - model.global_mean - centring_biases(model)[cols]
    sums = np.bincount(rows, weights=residual, minlength=ratings.n_users)
    return model.global_mean + model.user_reg.user_bias(sums, ratings.user_counts())


def fold_in_users(model: PublicModel, ratings: Ratings) -> np.ndarray:
    """:func:`fold_in` for every row of ``ratings`` at once (evaluation; same maths, batched).

    ``ratings`` must use the model's item id order (its columns index ``model.item_factors``).
    """
    if ratings.n_items != model.n_items or not np.array_equal(ratings.item_ids, model.item_ids):
        raise ValueError("ratings must share the model's item id space")
    rows, cols, values = ratings.coo()
    offsets = user_offsets(model, ratings)
    keep = model.trained_mask[cols]
    rows, cols = rows[keep], cols[keep]
    centred = _clip_centred(model, values[keep] - offsets[rows] - centring_biases(model)[cols])
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=ratings.n_users))])
    gravity = _gravity_matrix(model) if model.user_reg.gravity else None
    if self_calibrating(model):
        return _self_calibrated_users(model, indptr, cols, centred, gravity)
    plan = make_plan(indptr, cols, centred, model.n_items)
    # float64 Grams, as in fold_in: a float32 Gram's rounding (2^-24 relative) is amplified by the
    # system's condition number (small ridges), and evaluation must score what serving serves
    return solve_side(plan, model.item_factors, model.user_reg.ridge(plan.counts), gravity, gram_dtype=np.float64)


def _self_calibrated_users(
    model: PublicModel, indptr: np.ndarray, cols: np.ndarray, centred: np.ndarray, gravity: np.ndarray | None
) -> np.ndarray:
    """:func:`self_calibrated_batch` for every user of a CSR layout, bucket by bucket (users
    without data get 0)."""
    plan = make_plan(indptr, cols, centred, model.n_items)
    ridges = model.user_reg.ridge(plan.counts)
    padded = np.vstack([model.item_factors, np.zeros((1, model.rank))])
    users = np.zeros((plan.n_rows, model.rank))
    for bucket in plan.buckets:
        users[bucket.rows] = self_calibrated_batch(padded[bucket.cols], bucket.values, ridges[bucket.rows], gravity)
    return users


def predict_ratings(model: PublicModel, user_vector: np.ndarray, offset: float | None = None) -> np.ndarray:
    """offset + b̃_j + u·v_j for every item (offset defaults to m̃). Untrained items have v_j = 0,
    so they get the baseline m̃ + b_u + b̃_j; the product runs over the trained block only, the
    array the serving path multiplies, so both round every score alike."""
    base = model.global_mean if offset is None else offset
    scores = np.asarray(base + model.item_biases, dtype=np.float64)
    rows = model.trained_rows
    scores[rows] = base + model.item_biases[rows] + model.trained_factors @ user_vector
    return scores


def score_items(model: PublicModel, user_vector: np.ndarray, offset: float | None = None) -> np.ndarray:
    """:func:`predict_ratings` for top-N. Under the rating objective untrained items score −inf
    (ranked last); under the ranking objective they keep their popularity prior."""
    scores = predict_ratings(model, user_vector, offset)
    return scores if is_ranking(model) else np.where(model.trained_mask, scores, -np.inf)


Scale = tuple[float, float] | None


def on_scale(scores: np.ndarray, scale: Scale) -> np.ndarray:
    """``scores`` clipped to the rating ``scale`` (unchanged without one): what is shown, never
    what is ranked (items predicted above the top of the scale would tie there)."""
    return scores if scale is None else np.clip(scores, scale[0], scale[1])


def top_n(scores: np.ndarray, n: int, candidates: np.ndarray, scale: Scale = None) -> tuple[np.ndarray, np.ndarray]:
    """The ``n`` best finite-scored candidates, best first (fewer when fewer remain), and their
    scores clipped to ``scale``; chosen and ordered by the unclipped scores, equal ones in the
    order of ``candidates`` (ascending item index for every caller)."""
    if n < 1:
        raise ValueError("n must be >= 1")
    candidates = np.asarray(candidates)
    chosen = candidates[best_positions(scores[candidates], n)]
    return chosen, on_scale(scores[chosen], scale)


def top_n_allowed(scores: np.ndarray, n: int, allowed: np.ndarray,
                  scale: Scale = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`top_n` over the candidates ``np.flatnonzero(allowed)`` (a boolean mask), the same
    choice without building the candidate list."""
    if n < 1:
        raise ValueError("n must be >= 1")
    chosen = best_positions(np.where(allowed, scores, np.nan), n)
    return chosen, on_scale(scores[chosen], scale)


def ranked(scores: np.ndarray, scale: Scale = None) -> tuple[np.ndarray, np.ndarray]:
    """(positions of ``scores`` best first, their scores clipped to ``scale``): every position
    ranked by the unclipped score, equal scores by position (a caller's given list)."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    return order, on_scale(scores[order], scale)


SAMPLE_STRIDE = 16  # top-n preselection: every 16th value bounds the n-th best from below


def best_positions(values: np.ndarray, n: int) -> np.ndarray:
    """Positions of the ``n`` largest finite ``values``, largest first, equal values by position.

    Exact with a cheap preselection: the n-th largest finite value t of a strided sample is at
    most the n-th largest of all values (the sample's n values >= t are among them), so every
    value of the top n, and every value tied with the n-th, is >= t; only those few are sorted
    (a stable sort keeps equal values in position order). An argpartition of the whole array
    cost ~5x more at 8,000 values, and left the order of ties to the selection algorithm.
    """
    finite = np.isfinite(values)
    keep = None
    if len(values) >= 2 * SAMPLE_STRIDE * n:
        sample = values[::SAMPLE_STRIDE][finite[::SAMPLE_STRIDE]]
        if len(sample) >= n:
            t = np.partition(sample, len(sample) - n)[len(sample) - n]
            keep = np.flatnonzero((values >= t) & finite)
    if keep is None:
        keep = np.flatnonzero(finite)
    if len(keep) > 4 * SAMPLE_STRIDE * n:  # many values tied at the sample's bound: cut exactly
        kept = values[keep]
        keep = keep[kept >= np.partition(kept, len(kept) - n)[len(kept) - n]]
    order = np.argsort(-values[keep], kind="stable")[:n]
    return keep[order]


def user_scores(model: PublicModel, item_idx: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Scores of every item for one user: the predicted rating m̃ + b_u + b̃_j + u·v_j (rating
    objective; untrained items get the baseline m̃ + b_u + b̃_j) or prior_j + u·v_j (ranking)."""
    user_vector, offset = fold_in_state(model, *objective_view(model, item_idx, values))
    return predict_ratings(model, user_vector, offset)


def recommend(
    model: PublicModel,
    item_idx: np.ndarray,
    values: np.ndarray,
    n: int,
    *,
    exclude_idx: np.ndarray | None = None,
    allowed_idx: np.ndarray | None = None,
    scale: Scale = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``n`` items for one user, excluding their rated items and ``exclude_idx``.

    ``allowed_idx`` (e.g. a category filter) restricts the candidates. Returns item indices
    and predicted ratings, best first; fewer than ``n`` when filtering leaves fewer. With the
    rating ``scale`` the ratings are shown clipped to it but ranked unclipped (:func:`top_n`).
    """
    item_idx, values = objective_view(model, item_idx, values)
    user_vector, offset = fold_in_state(model, item_idx, values)
    scores = score_items(model, user_vector, offset)
    return top_n(scores, n, candidate_items(model.n_items, item_idx, exclude_idx, allowed_idx), scale)


def objective_view(model: PublicModel, item_idx: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The user's data as the model was trained on it: for the ranking objective only her
    positives (ratings >= the public threshold) with value 1; ratings unchanged otherwise."""
    item_idx = np.asarray(item_idx, dtype=np.int64).reshape(-1)
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if model.config.get("objective") != "ranking":
        return item_idx, values
    lo, hi = model.config["rating_range"]
    threshold = model.config.get("positive_threshold")
    keep = values >= (lo + 0.75 * (hi - lo) if threshold is None else threshold)
    return item_idx[keep], np.ones(int(keep.sum()))


def candidate_items(
    n_items: int,
    rated_idx: np.ndarray,
    exclude_idx: np.ndarray | None = None,
    allowed_idx: np.ndarray | None = None,
) -> np.ndarray:
    """Items that may be recommended: ``allowed_idx`` (default all) minus rated and excluded ones."""
    allowed = np.zeros(n_items, dtype=bool)
    if allowed_idx is None:
        allowed[:] = True
    else:
        allowed[_as_candidate_array(allowed_idx, n_items)] = True
    allowed[_as_candidate_array(rated_idx, n_items)] = False
    if exclude_idx is not None:
        allowed[_as_candidate_array(exclude_idx, n_items)] = False
    return np.flatnonzero(allowed)


def _as_candidate_array(idx: np.ndarray, n_items: int) -> np.ndarray:
    idx = np.asarray(idx, dtype=np.int64).reshape(-1)
    if len(idx) and (idx.min() < 0 or idx.max() >= n_items):
        raise ValueError("item index out of range")
    return idx


def similar_items(model: PublicModel, item_index: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Items whose factors have the highest cosine similarity with ``item_index`` (public V only)."""
    if not 0 <= item_index < model.n_items:
        raise ValueError("item index out of range")
    if not model.trained_mask[item_index]:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    v = model.item_factors
    norms = np.linalg.norm(v, axis=1)
    target = v[item_index] / max(norms[item_index], 1e-12)
    scores = np.where(model.trained_mask & (norms > 0), (v @ target) / np.maximum(norms, 1e-12), -np.inf)
    candidates = np.flatnonzero(np.arange(model.n_items) != item_index)
    return top_n(scores, n, candidates)


def popular_items(model: PublicModel, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Items with the highest DP counts (the fallback for users without ratings)."""
    counts = np.asarray(model.item_counts, dtype=np.float64)
    return top_n(counts, n, np.arange(model.n_items))
