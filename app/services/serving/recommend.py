"""Privileged recommendations for one user.

They read the *active published model* (:mod:`app.services.serving.active`) and additionally
the one requesting user's own ratings (or votes) and nothing else (joint DP: post-processing of
the public release, not charged). Scores and user vectors are never logged or stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from itertools import repeat
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.core.algorithms import get_algorithm, score_kind
from app.core.mf import foldin
from app.db.stores.serving import active_and_ratings_on_loop
from app.errors import ItemsNotInModel
from app.schemas.serving import RecommendationQuery, RecommendationsOut, ScoredItem
from app.services.serving import trained_scoring
from app.services.serving.active import ActiveModel, ServedModel, active_with_ratings, ratings_from_rows
from app.services.serving.catalogue_cache import Catalog, catalog, fresh_catalog
from app.services.serving.popular import popular_indices
from app.services.serving.responses import item_mask, scored_items, scored_rows
from app.services.votes import user_votes_arrays

__all__ = ["recommend_for_user", "recommend_on_loop"]


def recommend_for_user(session: Session, *, dataset: str, user_id: str,
                       query: RecommendationQuery) -> RecommendationsOut:
    """Top-N (or the ranking of ``query.items``) for one user from the active model plus this
    user's own ratings only (own stored votes for a model trained on votes: one-bit)."""
    cache, item_ids, values, model_row = active_with_ratings(session, dataset, user_id)  # 404s as `active`
    noun = "ratings"
    if get_algorithm(cache.algorithm).data == "votes":
        noun = "votes"
        item_ids, values = user_votes_arrays(session, dataset_id=cache.dataset_id, user_id=user_id)
        model_row = cache.positions
    cat = catalog(session, cache.dataset_id, dataset)
    return _recommend(cache, cat, _UserData(user_id, item_ids, values, model_row, noun), query)


async def recommend_on_loop(bind: Any, pool_size: int, *, dataset: str, user_id: str,
                            query: RecommendationQuery) -> RecommendationsOut | None:
    """:func:`recommend_for_user` on the event loop: the one round trip on an asynchronous
    connection (PostgreSQL ``bind``), the rest from this process's caches. None when any of it
    needs a session (another database, a cold cache, an activation racing with the read, a
    catalogue past its TTL, a model trained on votes): the caller runs the session path."""
    rows = await active_and_ratings_on_loop(bind, pool_size, dataset, user_id)
    read = None if rows is None else ratings_from_rows(rows)
    if read is None:
        return None
    cache, item_ids, values, model_row = read
    cat = fresh_catalog(dataset)
    if cat is None or get_algorithm(cache.algorithm).data == "votes":
        return None
    return _recommend(cache, cat, _UserData(user_id, item_ids, values, model_row, "ratings"), query)


@dataclass(frozen=True)
class _UserData:
    """The requesting user's own data as read: item keys, values, key -> model row."""

    user_id: str
    item_ids: list[Any]
    values: list[float]
    model_row: dict[Any, int]
    noun: str  # "ratings" or "votes", for the fallback reason


def _recommend(cache: ServedModel, cat: Catalog, user: _UserData, query: RecommendationQuery) -> RecommendationsOut:
    """The answer from the cached model, the catalogue and the user's own data (no I/O)."""
    algorithm = get_algorithm(cache.algorithm)
    user_id, item_ids, values, model_row, noun = user.user_id, user.item_ids, user.values, user.model_row, user.noun
    s = ActiveModel(row=None, cache=cache)  # type: ignore[arg-type]  # the row is not needed here
    model = s.model
    rated = np.fromiter(map(model_row.get, item_ids, repeat(-1)), dtype=np.int64, count=len(item_ids))
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
    allowed = _allowed(cat, s, query)
    allowed[rated_idx] = False
    out = partial(out, notes=_category_notes(cat, query))
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
        return out(fallback=False, fallback_reason=None, items=scored_rows(s, idx, top))
    scores = algorithm.score(model, rated_idx, rated_vals)
    if kind != "ranking_score":
        allowed &= model.trained_mask  # untrained items carry no personal signal: never in a top-N
    idx, top = foldin.top_n_allowed(scores, query.n, allowed, _scale(s, kind))  # ranked unclipped, shown clipped
    return out(fallback=False, fallback_reason=None, items=scored_rows(s, idx, top))


def _trained_top_n(s: ActiveModel, kind: str, state_key: tuple, rated_idx: np.ndarray, rated_vals: np.ndarray,
                   n: int, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-N over the trained rows with the user's cached state (same result as the full path)."""
    if s.cache.trained is None:
        s.cache.trained = trained_scoring.trained_rows(s.model)
    vector, offset = trained_scoring.user_state(s.model, state_key, rated_idx, rated_vals)
    return trained_scoring.top_n_scores(s.model, s.cache.trained, vector, offset, n, allowed, _scale(s, kind))


def _allowed(cat: Catalog, s: ActiveModel, query: RecommendationQuery) -> np.ndarray:
    """Candidate mask: active items, in ``categories`` when given, not in ``exclude``."""
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


def _category_notes(cat: Catalog, query: RecommendationQuery) -> list[str]:
    """Say so when a requested category is carried by no item (the list would be silently empty)."""
    if not query.categories:
        return []
    known = cat.by_category
    return [f"no item carries category {c!r}" for c in query.categories if c not in known]


def _scale(s: ActiveModel, kind: str) -> tuple[float, float] | None:
    """The range shown predicted ratings are clipped to (a safety net: the model's own shrinkage
    keeps most on the scale, see quality-defaults' rmse_unclipped). Lists are ranked by the
    unclipped score, so items predicted above the top of the scale do not tie there."""
    return s.cache.rating_range if kind == "predicted_rating" else None


def _baseline_scores(s: ActiveModel, kind: str) -> np.ndarray | None:
    """Scores of a user with no data: m̃ + b̃_j (or the ranking prior) for the fold-in family."""
    baseline = get_algorithm(s.cache.algorithm).baseline_scores(s.model)
    return None if baseline is None else foldin.on_scale(baseline, _scale(s, kind))


def _ranked_list(s: ActiveModel, algorithm: Any, kind: str, rated_idx: np.ndarray, rated_vals: np.ndarray,
                 items: list[str]) -> list[ScoredItem]:
    """Exactly ``items``, best first, each with its score (baseline-flagged outside the trained set)."""
    unknown = [i for i in items if i not in s.positions]
    if unknown:
        raise ItemsNotInModel(f"{len(unknown)} item id(s) are not in the active model",
                              details={"unknown_items": unknown[:100]})
    idx = np.asarray([s.positions[i] for i in items], dtype=np.int64)
    order, shown = foldin.ranked(algorithm.score(s.model, rated_idx, rated_vals)[idx], _scale(s, kind))
    trained = s.model.trained_mask
    return [ScoredItem(item_id=items[k], score=float(score), rank=r + 1, baseline=not bool(trained[idx[k]]))
            for r, (k, score) in enumerate(zip(order, shown, strict=True))]
