"""Privileged recommendations for one user.

They read the *active published model* (:mod:`app.services.serving.active`) and additionally
the one requesting user's own ratings (or votes) and nothing else (joint DP: post-processing of
the public release, not charged). Scores and user vectors are never logged or stored.
"""

from __future__ import annotations

from functools import partial
from itertools import repeat
from typing import Any

import numpy as np
from psycopg_pool import AsyncConnectionPool
from sqlalchemy.orm import Session

from app.core.algorithms import get_algorithm, score_kind
from app.core.mf import foldin
from app.errors import ItemsNotInModel
from app.schemas.serving import RecommendationQuery, RecommendationsOut, ScoredItem
from app.services.serving import trained_scoring
from app.services.serving.active import (
    ACTIVE_AND_RATINGS,
    ActiveModel,
    Catalog,
    ServedModel,
    active_with_ratings,
    cached_with_ratings,
    catalog,
    fresh_catalog,
    item_mask,
    scored_items,
)
from app.services.serving.hot_read import Rows, read_rows_async
from app.services.serving.popular import popular_indices
from app.services.votes import user_votes_arrays

__all__ = ["INLINE_MAX_RATINGS", "NeedsSession", "recommend_for_user", "read_user_rows", "recommend_cached"]


INLINE_MAX_RATINGS = 2_000
"""Longer histories are answered on a worker thread (:func:`recommend_cached` declines them), so
one user's large fold-in never holds up the event loop's other requests."""


class NeedsSession(Exception):
    """The cached path cannot answer without the database session (internal; never reaches a client)."""


def recommend_for_user(session: Session, *, dataset: str, user_id: str, query: RecommendationQuery,
                       rows: Rows | None = None) -> RecommendationsOut:
    """Top-N (or the ranking of ``query.items``) for one user from the active model plus this
    user's own ratings only (own stored votes for a model trained on votes: one-bit). ``rows``:
    what :func:`read_user_rows` has just read for this request (not read again)."""
    cache, item_ids, values = active_with_ratings(session, dataset, user_id, rows)  # 404s as `active`
    return _recommend(session, cache, item_ids, values, dataset=dataset, user_id=user_id, query=query)


async def read_user_rows(pool: AsyncConnectionPool, *, dataset: str, user_id: str) -> Rows:
    """The request's one round trip on the event loop: the active version and the user's ratings."""
    return await read_rows_async(pool, ACTIVE_AND_RATINGS, {"dataset": dataset, "user": user_id})


def recommend_cached(rows: Rows, *, dataset: str, user_id: str, query: RecommendationQuery) -> RecommendationsOut | None:
    """:func:`recommend_for_user` from the rows :func:`read_user_rows` read and this process's
    caches alone: the same answer, or None when it would need the session (the version is not
    loaded here, the catalogue is due for a reload, a model trained on votes, a history longer
    than INLINE_MAX_RATINGS); the caller then takes the full path."""
    if len(rows) > INLINE_MAX_RATINGS:
        return None
    hit = cached_with_ratings(rows)
    if hit is None:
        return None
    try:
        return _recommend(None, *hit, dataset=dataset, user_id=user_id, query=query)
    except NeedsSession:
        return None


def _recommend(session: Session | None, cache: ServedModel, item_ids: list[str], values: list[float], *,
               dataset: str, user_id: str, query: RecommendationQuery) -> RecommendationsOut:
    """The recommendation from the model and the user's ratings as read (NeedsSession when
    ``session`` is None and more must be read)."""
    algorithm = get_algorithm(cache.algorithm)
    noun = "ratings"
    if algorithm.data == "votes":
        noun = "votes"
        if session is None:
            raise NeedsSession
        item_ids, values = user_votes_arrays(session, dataset_id=cache.dataset_id, user_id=user_id)
    s = ActiveModel(row=None, cache=cache)  # type: ignore[arg-type]  # the row is not needed here
    model = s.model
    rated = np.fromiter(map(s.positions.get, item_ids, repeat(-1)), dtype=np.int64, count=len(item_ids))
    known = rated >= 0
    rated_idx, rated_vals = rated[known], np.asarray(values, dtype=np.float64)[known]
    kind = score_kind(cache.algorithm, model)
    usable = int(np.count_nonzero(model.trained_mask[rated_idx])) if len(rated_idx) else 0
    reason = None
    if usable == 0:
        reason = f"user has no {noun}" if not item_ids else f"none of the user's {noun} is for an item in the trained set"
    out = partial(RecommendationsOut, user_id=user_id, model_version=cache.version_id, algorithm=cache.algorithm,
                  score_kind=kind)
    if query.items is not None:
        return out(fallback=False, fallback_reason=None,
                   items=_ranked_list(s, algorithm, kind, rated_idx, rated_vals, query.items))
    allowed = _allowed(session, s, dataset, query)
    allowed[rated_idx] = False
    out = partial(out, notes=_category_notes(session, s, dataset, query))
    if reason is not None:
        idx, popularity = popular_indices(s, query.n, allowed)
        scores = _baseline_scores(s, kind)
        items = scored_items(s, idx, None if scores is None else scores[idx])
        if algorithm.popularity_kind == "dp_count":
            items = [item.model_copy(update={"dp_count": float(c)}) for item, c in zip(items, popularity, strict=True)]
        return out(fallback=True, fallback_reason=f"dp_popular: {reason}", items=items)
    if trained_scoring.applies(algorithm, kind):
        state_key = (cache.version_id, cache.sha256, user_id,
                     trained_scoring.ratings_digest(item_ids, values))
        idx, top = _trained_top_n(s, kind, state_key, rated_idx, rated_vals, query.n, allowed)
        return out(fallback=False, fallback_reason=None, items=scored_items(s, idx, top))
    scores = _on_scale(s, kind, algorithm.score(model, rated_idx, rated_vals))
    if kind != "ranking_score":
        allowed &= model.trained_mask  # untrained items carry no personal signal: never in a top-N
    idx, top = foldin.top_n(scores, query.n, np.flatnonzero(allowed))
    return out(fallback=False, fallback_reason=None, items=scored_items(s, idx, top))


def _trained_top_n(s: ActiveModel, kind: str, state_key: tuple, rated_idx: np.ndarray, rated_vals: np.ndarray,
                   n: int, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-N over the trained rows with the user's cached state (same result as the full path)."""
    if s.cache.trained is None:
        s.cache.trained = trained_scoring.trained_rows(s.model)
    vector, offset = trained_scoring.user_state(s.model, state_key, rated_idx, rated_vals)
    scores = _on_scale(s, kind, trained_scoring.trained_scores(s.model, s.cache.trained, vector, offset))
    return trained_scoring.trained_top_n(s.cache.trained, scores, n, allowed)


def _catalog(session: Session | None, s: ActiveModel, dataset: str) -> Catalog:
    """The cached catalogue, reloaded through ``session`` when due (NeedsSession without one)."""
    if session is not None:
        return catalog(session, s.cache.dataset_id, dataset)
    cat = fresh_catalog(dataset)
    if cat is None:
        raise NeedsSession
    return cat


def _allowed(session: Session | None, s: ActiveModel, dataset: str, query: RecommendationQuery) -> np.ndarray:
    """Candidate mask: active items, in ``categories`` when given, not in ``exclude``."""
    cat = _catalog(session, s, dataset)
    allowed = ~item_mask(s, ("inactive", cat.stamp), cat.inactive)
    if query.categories is not None:
        in_cats = np.zeros(s.model.n_items, dtype=bool)
        for c in query.categories:
            in_cats |= item_mask(s, ("cat", c, cat.stamp), cat.by_category.get(c, frozenset()))
        allowed &= in_cats
    if query.exclude:
        ex = [s.positions[i] for i in query.exclude if i in s.positions]
        allowed[np.asarray(ex, dtype=np.int64)] = False
    return allowed


def _category_notes(session: Session | None, s: ActiveModel, dataset: str, query: RecommendationQuery) -> list[str]:
    """Say so when a requested category is carried by no item (the list would be silently empty)."""
    if not query.categories:
        return []
    known = _catalog(session, s, dataset).by_category
    return [f"no item carries category {c!r}" for c in query.categories if c not in known]


def _on_scale(s: ActiveModel, kind: str, scores: np.ndarray) -> np.ndarray:
    """Predicted ratings clipped into the data set's range (a safety net: the model's own
    shrinkage keeps them on the scale, see quality-defaults' rmse_unclipped)."""
    if kind != "predicted_rating" or s.cache.rating_range is None:
        return scores
    lo, hi = s.cache.rating_range
    return np.clip(scores, lo, hi)


def _baseline_scores(s: ActiveModel, kind: str) -> np.ndarray | None:
    """Scores of a user with no data: m̃ + b̃_j (or the ranking prior) for the fold-in family."""
    if not hasattr(s.model, "item_biases"):
        return None
    return _on_scale(s, kind, foldin.predict_ratings(s.model, np.zeros(s.model.rank)))


def _ranked_list(s: ActiveModel, algorithm: Any, kind: str, rated_idx: np.ndarray, rated_vals: np.ndarray,
                 items: list[str]) -> list[ScoredItem]:
    """Exactly ``items``, best first, each with its score (baseline-flagged outside the trained set)."""
    unknown = [i for i in items if i not in s.positions]
    if unknown:
        raise ItemsNotInModel(f"{len(unknown)} item id(s) are not in the active model",
                              details={"unknown_items": unknown[:100]})
    idx = np.asarray([s.positions[i] for i in items], dtype=np.int64)
    scores = _on_scale(s, kind, algorithm.score(s.model, rated_idx, rated_vals))[idx]
    order = np.argsort(-scores, kind="stable")
    trained = s.model.trained_mask
    return [ScoredItem(item_id=items[k], score=float(scores[k]), rank=r + 1, baseline=not bool(trained[idx[k]]))
            for r, k in enumerate(order)]
