"""Top-N of the fold-in family on the trained items only, with the user's state cached.

For a rating-objective fold-in model (DPALS, ALS, DP-CMF; arXiv:1505.03014 / algorithms.md §2)
an item outside the trained set has v_j = 0 and is never in a top-N, so the score vector
    s_j = m̃ + b_u + b̃_j + u·v_j        (the predicted rating, foldin.predict_ratings)
is needed on the trained rows only: a contiguous copy of those rows per published version cuts
the per-request matrix-vector product (memory bound) to the trained fraction. Each score is the
same sum in the same order as on the full matrix, so results are bit-identical (tests pin it).

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

from app.core.algorithms import ALGORITHMS
from app.core.mf import foldin

__all__ = ["TrainedRows", "USER_STATE_CAPACITY", "applies", "trained_rows", "ratings_digest", "user_state", "trained_scores",
           "trained_top_n", "clear_user_states"]

USER_STATE_CAPACITY = 20_000  # users per process (≈ 1 KiB each at r = 64)


@dataclass(frozen=True)
class TrainedRows:
    """The trained items of one published model: global rows, their factors and DP biases."""

    rows: np.ndarray
    factors: np.ndarray
    biases: np.ndarray


# The fold-in family's scoring method (DPALS and DP-CMF inherit it: foldin.user_scores).
_FOLD_IN_SCORE = type(ALGORITHMS["dpals"]).score


def applies(algorithm: Any, kind: str) -> bool:
    """True when ``algorithm`` scores by fold-in predicted ratings (top-N restricted to trained
    items). Compared on the class: ``algorithm.score`` is a new bound method on every access."""
    return getattr(type(algorithm), "score", None) is _FOLD_IN_SCORE and kind == "predicted_rating"


def trained_rows(model: Any) -> TrainedRows:
    """Contiguous trained rows of ``model`` (build once per version; read-only)."""
    rows = np.flatnonzero(model.trained_mask)
    view = TrainedRows(rows=rows, factors=np.ascontiguousarray(model.item_factors[rows]),
                       biases=np.ascontiguousarray(model.item_biases[rows]))
    for array in (view.rows, view.factors, view.biases):
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
