"""Evaluation metrics, exactly as in docs/algorithms.md §1, "Evaluation protocols".

Rating task: :func:`rating_rmse` - RMSE over held-out ratings where items the model did not train
(infrequent items) are predicted by the user's own mean training rating (the global training mean
when the user has no training rating).

Ranking task: :func:`recall_at_k` / :func:`ndcg_at_k` / :func:`ranking_metrics` -
Recall@k = |top-k ∩ target| / min(k, |target|) and NDCG@k with binary gains,
DCG = sum_{hits at 0-based rank p} 1 / log2(p + 2), ideal DCG = sum_{p < min(k, |target|)} 1 / log2(p + 2).
The user's history (query) is excluded from the candidates; both are averaged over users with a
non-empty target. Scores may be a dense (n_eval x n_items) array or a callable producing them in
batches; top-k lists (integer arrays) are accepted too.

All user rows of scores, targets and history are aligned (row b = evaluated user b); targets and
history are :class:`Ratings`, scipy sparse matrices, or sequences of item-index arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np
import scipy.sparse as sp

from app.core.data.ratings import Ratings

__all__ = [
    "factor_predictions",
    "ndcg_at_k",
    "ranking_metrics",
    "rating_rmse",
    "recall_at_k",
    "rmse",
    "top_k",
    "user_means",
]

ItemSets: TypeAlias = Ratings | sp.spmatrix | Sequence[np.ndarray]
Scores: TypeAlias = np.ndarray | Callable[[np.ndarray], np.ndarray] | Sequence[np.ndarray]


# ---------------------------------------------------------------------------- rating task
def rmse(pred: np.ndarray, truth: np.ndarray) -> float:
    """Root mean squared error of two equally long, finite, non-empty arrays."""
    pred = np.asarray(pred, dtype=np.float64)
    truth = np.asarray(truth, dtype=np.float64)
    if pred.shape != truth.shape:
        raise ValueError(f"shape mismatch: predictions {pred.shape} vs truth {truth.shape}")
    if pred.size == 0:
        raise ValueError("RMSE of an empty set is undefined")
    if not (np.all(np.isfinite(pred)) and np.all(np.isfinite(truth))):
        raise ValueError("predictions and truth must be finite")
    return float(np.sqrt(np.mean((pred - truth) ** 2)))


def user_means(train: Ratings) -> np.ndarray:
    """Mean training rating per user; users without training ratings get the global mean."""
    if train.nnz == 0:
        raise ValueError("training ratings are empty: no mean to fall back on")
    counts = train.user_counts()
    sums = np.add.reduceat(train.csr.data, np.minimum(train.csr.indptr[:-1], train.nnz - 1))
    means = np.full(train.n_users, float(train.csr.data.mean()))
    has = counts > 0
    means[has] = sums[has] / counts[has]
    return means


def _same_space(a: Ratings, b: Ratings, what: str) -> None:
    if not (np.array_equal(a.user_ids, b.user_ids) and np.array_equal(a.item_ids, b.item_ids)):
        raise ValueError(f"{what}: train and test must share user and item id spaces")


def factor_predictions(
    test: Ratings, user_factors: np.ndarray, item_factors: np.ndarray, offset: float = 0.0
) -> np.ndarray:
    """offset + u_i . v_j for every test entry, in the test matrix's CSR order."""
    if user_factors.shape[0] != test.n_users or item_factors.shape[0] != test.n_items:
        raise ValueError("factor matrices do not match the test matrix's users/items")
    rows, cols, _ = test.coo()
    out = np.empty(test.nnz, dtype=np.float64)
    step = 1 << 20
    for lo in range(0, test.nnz, step):
        r, c = rows[lo : lo + step], cols[lo : lo + step]
        out[lo : lo + step] = np.einsum("ij,ij->i", user_factors.take(r, axis=0), item_factors.take(c, axis=0))
    return out + offset


def rating_rmse(
    test: Ratings,
    predictions: np.ndarray,
    *,
    train: Ratings,
    trained_mask: np.ndarray | None = None,
    clip: tuple[float, float] | None = None,
) -> float:
    """RMSE on ``test`` (predictions in its CSR order); untrained items -> the user's mean.

    ``trained_mask[j]`` is True for items the model trained (the frequent set); for the others the
    prediction is replaced by the user's mean rating in ``train`` (global mean if the user has
    none). ``clip`` optionally clips all predictions to the rating range.
    """
    _same_space(train, test, "rating_rmse")
    pred = np.asarray(predictions, dtype=np.float64).copy()
    if pred.shape != (test.nnz,):
        raise ValueError(f"expected {test.nnz} predictions (test CSR order), got shape {pred.shape}")
    rows, cols, truth = test.coo()
    if trained_mask is not None:
        mask = np.asarray(trained_mask, dtype=bool)
        if mask.shape != (test.n_items,):
            raise ValueError(f"trained_mask must have one flag per item ({test.n_items})")
        fallback = ~mask[cols]
        pred[fallback] = user_means(train)[rows[fallback]]
    if clip is not None:
        np.clip(pred, clip[0], clip[1], out=pred)
    return rmse(pred, truth)


# ---------------------------------------------------------------------------- ranking task
def _as_csr(sets: ItemSets | None, n_rows: int, n_items: int, what: str) -> sp.csr_matrix:
    """Item sets as a binary CSR (n_rows x n_items) with sorted indices, no explicit zeros kept."""
    if sets is None:
        return sp.csr_matrix((n_rows, n_items), dtype=bool)
    if isinstance(sets, Ratings):
        mat = sets.csr
    elif sp.issparse(sets):
        mat = sp.csr_matrix(sets)
    else:
        lists = [np.asarray(s, dtype=np.int64).ravel() for s in sets]
        indptr = np.concatenate([[0], np.cumsum([len(s) for s in lists])])
        idx = np.concatenate(lists) if lists else np.empty(0, np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= n_items):
            raise ValueError(f"{what} item index out of range [0, {n_items})")
        mat = sp.csr_matrix((np.ones(len(idx), dtype=bool), idx, indptr), shape=(len(lists), n_items))
        mat.sum_duplicates()
    if mat.shape != (n_rows, n_items):
        raise ValueError(f"{what} has shape {mat.shape}, expected ({n_rows}, {n_items})")
    out = sp.csr_matrix((np.ones(mat.nnz, dtype=bool), mat.indices, mat.indptr), shape=mat.shape)
    out.sum_duplicates()
    out.sort_indices()
    return out


def _member(mat: sp.csr_matrix, rows: np.ndarray, items: np.ndarray) -> np.ndarray:
    """mat[rows, items] as a bool array for index pairs (items may be -1: False)."""
    m = mat.shape[1]
    keys = np.repeat(np.arange(mat.shape[0], dtype=np.int64), np.diff(mat.indptr)) * m + mat.indices
    q = rows.astype(np.int64) * m + items
    if len(keys) == 0:
        return np.zeros(q.shape, dtype=bool)
    pos = np.minimum(np.searchsorted(keys, q), len(keys) - 1)
    return np.asarray((keys[pos] == q) & (items >= 0))


def top_k(scores: np.ndarray, k: int, exclude: ItemSets | None = None) -> np.ndarray:
    """Indices of the k best-scored items per row, best first, excluded items skipped.

    Returns an (n, k) int64 array padded with -1 where fewer than k candidates remain. Ties are
    broken by the lower item index.
    """
    scores = np.asarray(scores)
    if scores.ndim != 2:
        raise ValueError("scores must be a 2-D (users x items) array")
    if k < 1:
        raise ValueError("k must be >= 1")
    n, m = scores.shape
    dtype = scores.dtype if scores.dtype in (np.float32, np.float64) else np.float64
    s = np.array(scores, dtype=dtype, copy=True)  # never modify the caller's scores
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    ex = _as_csr(exclude, n, m, "exclude")
    rows = np.repeat(np.arange(n), np.diff(ex.indptr))
    s[rows, ex.indices] = -np.inf
    kk = min(k, m)
    if kk < m:
        part = np.argpartition(s, m - kk, axis=1)[:, m - kk :]
        part_scores = np.take_along_axis(s, part, axis=1)
        # Ties straddling the cut: redo those rows with a stable sort so lower indices win.
        kth = part_scores.min(axis=1, keepdims=True)
        tied = np.flatnonzero((s == kth).sum(axis=1) > (part_scores == kth).sum(axis=1))
        if len(tied):
            part[tied] = np.argsort(-s[tied], axis=1, kind="stable")[:, :kk]
    else:
        part = np.tile(np.arange(m), (n, 1))
    part_scores = np.take_along_axis(s, part, axis=1)
    order = np.lexsort((part, -part_scores), axis=1)  # score desc, then item index asc
    best = np.take_along_axis(part, order, axis=1)
    best[np.take_along_axis(part_scores, order, axis=1) == -np.inf] = -1
    if kk < k:
        best = np.hstack([best, np.full((n, k - kk), -1, dtype=best.dtype)])
    return best.astype(np.int64)


def _lists_to_topk(lists: np.ndarray | Sequence[np.ndarray], history: sp.csr_matrix, k: int, n_items: int) -> np.ndarray:
    """Top-k lists (int array or sequence) -> (n, k) after dropping history items, -1 padded."""
    rows_l = [np.asarray(x, dtype=np.int64).ravel() for x in lists]
    width = max([len(r) for r in rows_l] + [1])
    arr = np.full((len(rows_l), width), -1, dtype=np.int64)
    for b, r in enumerate(rows_l):
        arr[b, : len(r)] = r
    if arr.size and arr.max() >= n_items or (arr < -1).any():
        raise ValueError(f"top-k item index out of range [0, {n_items})")
    srt = np.sort(arr, axis=1)
    if np.any((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)):
        raise ValueError("a top-k list contains the same item twice")
    rr = np.repeat(np.arange(len(arr)), width)
    arr[_member(history, rr, arr.ravel()).reshape(arr.shape)] = -1
    arr = np.take_along_axis(arr, np.argsort(arr < 0, axis=1, kind="stable"), axis=1)
    if arr.shape[1] < k:
        arr = np.hstack([arr, np.full((len(arr), k - arr.shape[1]), -1, dtype=np.int64)])
    return arr[:, :k]


def _per_user(topk: np.ndarray, target: sp.csr_matrix, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(recall, ndcg, has_target) per evaluated user from an (n, k) top-k array."""
    n = topk.shape[0]
    hits = _member(target, np.repeat(np.arange(n), k), topk.ravel()).reshape(n, k)
    n_t = np.diff(target.indptr)
    denom = np.minimum(k, n_t)
    disc = 1.0 / np.log2(np.arange(k) + 2.0)
    ideal = np.concatenate([[0.0], np.cumsum(disc)])[denom]
    has = n_t > 0
    safe = np.where(has, denom, 1)
    recall = np.where(has, hits.sum(1) / safe, 0.0)
    ndcg = np.where(has, (hits * disc).sum(1) / np.where(has, ideal, 1.0), 0.0)
    return recall, ndcg, has


def ranking_metrics(
    scores: Scores,
    targets: ItemSets,
    history: ItemSets | None = None,
    k: int = 20,
    *,
    n_items: int | None = None,
    batch_size: int = 1024,
    per_user: bool = False,
) -> dict[str, Any]:
    """Recall@k and NDCG@k averaged over users with a non-empty target.

    ``scores``: a float (n_eval x n_items) array; a callable taking an int array of eval-row
    indices and returning their (len, n_items) scores (evaluated in ``batch_size`` batches); or
    top-k item-index lists (an integer array or a sequence of int arrays, best first), from which
    history items are dropped before cutting at k. Returns {"recall@k", "ndcg@k", "users"}
    (+ per-user arrays "recall", "ndcg", "has_target" when ``per_user``).
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    if isinstance(targets, Ratings):
        n_eval, m = targets.n_users, targets.n_items
    elif sp.issparse(targets):
        n_eval, m = np.shape(targets)
    else:
        n_eval = len(targets)
        m = n_items if n_items is not None else getattr(scores, "shape", (0, 0))[-1]
        if not m:
            raise ValueError("pass n_items when targets are plain index lists")
    target = _as_csr(targets, n_eval, m, "targets")
    hist = _as_csr(history, n_eval, m, "history")
    if callable(scores):
        parts = []
        for lo in range(0, n_eval, batch_size):
            idx = np.arange(lo, min(lo + batch_size, n_eval))
            block = np.asarray(scores(idx))
            if block.ndim == 1 and len(idx) == 1:
                block = block[None, :]
            if block.shape != (len(idx), m):
                raise ValueError(f"score callable returned shape {block.shape}, expected {(len(idx), m)}")
            parts.append(top_k(block, k, hist[lo : lo + len(idx)]))
        topk = np.vstack(parts) if parts else np.empty((0, k), dtype=np.int64)
    elif isinstance(scores, np.ndarray) and np.issubdtype(scores.dtype, np.floating):
        if scores.shape != (n_eval, m):
            raise ValueError(f"scores have shape {scores.shape}, expected {(n_eval, m)}")
        topk = np.vstack(
            [top_k(scores[lo : lo + batch_size], k, hist[lo : lo + batch_size]) for lo in range(0, n_eval, batch_size)]
        ) if n_eval else np.empty((0, k), dtype=np.int64)
    else:
        if len(scores) != n_eval:
            raise ValueError(f"got {len(scores)} top-k lists for {n_eval} users")
        topk = _lists_to_topk(scores, hist, k, m)
    recall, ndcg, has = _per_user(topk, target, k)
    if not has.any():
        raise ValueError("no evaluated user has a non-empty target")
    out: dict[str, Any] = {
        f"recall@{k}": float(recall[has].mean()), f"ndcg@{k}": float(ndcg[has].mean()), "users": int(has.sum())}
    if per_user:
        out.update(recall=recall, ndcg=ndcg, has_target=has)
    return out


def recall_at_k(scores: Scores, targets: ItemSets, history: ItemSets | None = None, k: int = 20, **kw: Any) -> float:
    """Recall@k = mean over users with a target of |top-k ∩ target| / min(k, |target|)."""
    return float(ranking_metrics(scores, targets, history, k, **kw)[f"recall@{k}"])


def ndcg_at_k(scores: Scores, targets: ItemSets, history: ItemSets | None = None, k: int = 20, **kw: Any) -> float:
    """NDCG@k with binary gains and ideal DCG over min(k, |target|) positions."""
    return float(ranking_metrics(scores, targets, history, k, **kw)[f"ndcg@{k}"])
