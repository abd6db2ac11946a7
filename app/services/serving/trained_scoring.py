"""Top-N of the fold-in family on the trained items only, with the user's state cached.

For a rating-objective fold-in model (DPALS, ALS, DP-CMF; arXiv:1505.03014 / docs/algorithms.md §1)
an item outside the trained set has v_j = 0 and is never in a top-N, so the score vector
    s_j = m̃ + b_u + b̃_j + u·v_j        (the predicted rating, foldin.predict_ratings)
is needed on the trained rows only: a contiguous copy of those rows per published version cuts
the per-request matrix-vector product (memory bound) to the trained fraction. Each score is the
same sum in the same order as on the full matrix (tests pin the choice). :func:`top_n_scores`
goes further: a float32 product with a rigorous error bound preselects the few items that can be
in the top n, and only those are scored in float64 (same choice, order and ties, ranked by the
unclipped rating and shown clipped to the scale; the scores
are float64 dot products of the same rows, equal up to BLAS's row-position-dependent rounding
of the last bits, which the full and trained-rows products do not share either).

The user's state (u, m̃ + b_u) is a function of the published model and her own ratings only
(joint DP post-processing). It is kept in this process, keyed by the model version and the
ratings exactly as read in this request's one round trip: a write, a deleted user or a newly
activated model changes the key, so every process sees them on its next request. Nothing is
logged or stored elsewhere.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.core.mf import foldin

__all__ = ["TrainedRows", "USER_STATE_CAPACITY", "applies", "trained_rows", "ratings_digest", "user_state", "trained_scores",
           "trained_top_n", "top_n_scores", "clear_user_states"]

USER_STATE_CAPACITY = 20_000  # users per process (≈ 1 KiB each at r = 64)


@dataclass(frozen=True)
class TrainedRows:
    """The trained items of one published model: global rows, their factors and DP biases, plus
    a float32 copy of the factors and the largest row norm for :func:`top_n_scores`."""

    rows: np.ndarray
    factors: np.ndarray
    biases: np.ndarray
    factors32: np.ndarray | None = None  # None: a factor is beyond float32's range (never preselect)
    max_row_norm: float = 0.0
    max_abs_bias: float = 0.0


def applies(algorithm: Any, kind: str) -> bool:
    """True when ``algorithm`` scores by fold-in predicted ratings (top-N restricted to trained
    items): its declared ``scores_by_fold_in`` and a predicted-rating kind."""
    return bool(algorithm.scores_by_fold_in) and kind == "predicted_rating"


def trained_rows(model: Any) -> TrainedRows:
    """Contiguous trained rows of ``model`` (build once per version; read-only)."""
    rows = model.trained_rows
    factors = model.trained_factors  # the very array foldin.predict_ratings multiplies
    with np.errstate(over="ignore"):
        factors32 = factors.astype(np.float32)
    view = TrainedRows(rows=rows, factors=factors, biases=np.ascontiguousarray(model.item_biases[rows]),
                       factors32=factors32 if np.all(np.isfinite(factors32)) else None,
                       max_row_norm=float(np.sqrt(np.max(np.sum(factors**2, axis=1), initial=0.0))),
                       max_abs_bias=float(np.max(np.abs(model.item_biases[rows]), initial=0.0)))
    for array in (view.rows, view.factors, view.biases, view.factors32):
        if array is not None:
            array.setflags(write=False)
    return view


_states: OrderedDict[Hashable, tuple[np.ndarray, float | None]] = OrderedDict()
_states_lock = threading.Lock()


def ratings_digest(item_ids: list[str], values: list[float]) -> bytes:
    """A 128-bit digest of the ratings as read (order included: the solve sums in that order),
    so a cache key stays small however many ratings the user has."""
    return hashlib.blake2b(repr((item_ids, values)).encode(), digest_size=16).digest()


def user_state(model: Any, key: Hashable, rated_idx: np.ndarray,
               rated_vals: np.ndarray) -> tuple[np.ndarray, float | None]:
    """(u, offset) exactly as :func:`foldin.user_scores` computes them, cached under ``key``
    (which must name the model version and the user's ratings as read)."""
    with _states_lock:
        state = _states.get(key)
        if state is not None:
            _states.move_to_end(key)
            return state
    state = foldin.fold_in_state(model, *foldin.objective_view(model, rated_idx, rated_vals))
    state[0].setflags(write=False)
    with _states_lock:
        _states[key] = state
        while len(_states) > USER_STATE_CAPACITY:
            _states.popitem(last=False)
    return state


def clear_user_states() -> None:
    """Forget every cached user state (tests)."""
    with _states_lock:
        _states.clear()


def trained_scores(model: Any, view: TrainedRows, vector: np.ndarray, offset: float | None) -> np.ndarray:
    """foldin.predict_ratings restricted to ``view.rows`` (same operations, same order)."""
    base = model.global_mean if offset is None else offset
    return base + view.biases + view.factors @ vector


def trained_top_n(view: TrainedRows, scores: np.ndarray, n: int, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``n`` best allowed trained items (global rows, best first) and their scores, chosen
    exactly as :func:`foldin.top_n` chooses among the allowed trained items of the full vector."""
    local, top = foldin.top_n_allowed(scores, n, allowed[view.rows])
    return view.rows[local], top


def top_n_scores(model: Any, view: TrainedRows, vector: np.ndarray, offset: float | None, n: int,
                 allowed: np.ndarray, scale: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray]:
    """The ``n`` best allowed trained items (global rows, best first) by predicted rating, and
    those ratings clipped to ``scale``: :func:`trained_top_n` of :func:`trained_scores`, ranked by
    the unclipped rating (items predicted above the top of the scale keep their order; equal
    ratings by row) and shown clipped, as :func:`foldin.top_n` with a scale.

    The float64 matrix-vector product over every trained row (memory bound: 4 MiB at 8,000 rows
    and r = 64) is replaced by a float32 one (half the bytes) that only preselects. Each float32
    score a_j is within e of the float64 one x_j, a rigorous bound (:func:`_error_bound` returns
    E = 2e). Let a_n be the n-th best approximate score of the allowed rows: the n rows with
    a_j >= a_n have x_j >= a_n - e, so the n-th best exact score x_n >= a_n - e, and every row of
    the exact top n, ties with the n-th included, has a_j >= x_j - e >= x_n - e >= a_n - E. The
    rows with a_j >= a_n - 2E (a further E covers the rounding of the threshold itself) are
    scored in float64 and ranked as :func:`foldin.top_n` ranks. Where fewer than ``n`` items are
    allowed, or float32 cannot hold the factors, the full float64 product runs.
    """
    base = model.global_mean if offset is None else offset
    candidates = _candidates(view, base, vector, n, allowed[view.rows])
    if candidates is None:
        rows, top = trained_top_n(view, trained_scores(model, view, vector, offset), n, allowed)
        return rows, foldin.on_scale(top, scale)
    exact = base + view.biases[candidates] + view.factors[candidates] @ vector
    local = foldin.best_positions(exact, n)
    return view.rows[candidates[local]], foldin.on_scale(exact[local], scale)


def _candidates(view: TrainedRows, base: float, vector: np.ndarray, n: int, allowed: np.ndarray) -> np.ndarray | None:
    """Rows that may be in the exact top n (ascending), from the float32 scores; None: score every
    row in float64."""
    norm = float(np.sqrt(vector @ vector))
    if view.factors32 is None or not np.isfinite(norm) or norm * view.max_row_norm > 1e30:
        return None
    approx = (base + view.biases) + view.factors32 @ vector.astype(np.float32)
    best = foldin.best_positions(np.where(allowed, approx, np.nan), n)
    if len(best) < n:
        return None
    bound = _error_bound(vector.shape[0], norm * view.max_row_norm, abs(base) + view.max_abs_bias)
    return np.flatnonzero(allowed & (approx >= float(approx[best[-1]]) - 2 * bound))


def _error_bound(rank: int, dot_bound: float, sum_bound: float) -> float:
    """Twice a bound on |approx - exact| for one row: the float32 dot product of factors and
    vector (each rounded to float32, relative 2^-24) differs from the exact one by at most
    ((rank + 3) 2^-24 + O(2^-48)) Σ|v_k u_k| <= that times ‖v‖‖u‖ (Higham, Accuracy and Stability
    of Numerical Algorithms, §3.1, any summation order); the float64 sums and product add a
    few 2^-53 of the magnitudes."""
    return 2.0 * ((rank + 4) * 2.0**-24 * dot_bound + 8 * 2.0**-53 * (sum_bound + dot_bound))
