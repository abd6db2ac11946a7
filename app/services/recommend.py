"""Serving: privileged recommendations, similar and popular items, embeddings, model metadata.

Everything here reads the *active published model* (via ``app.model_store.get_active_model``);
recommendations additionally read the one requesting user's own ratings and nothing else
(joint DP: post-processing of the public release, not charged). Scores and user vectors are
never logged or stored.
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from app.errors import NotFound, Unprocessable
from app.core.mf import foldin
from app.core.algorithms import get_algorithm, score_kind
from app.db.models import Dataset, Item, ModelVersion
from app.schemas.serving import (EmbeddingRow, EmbeddingsPage, ModelInfoOut, PopularItem, PopularOut,
                                 RecommendationQuery, RecommendationsOut, ScoredItem, SimilarOut)
from app.services.ingest import user_ratings_arrays

__all__ = [
    "CATALOG_TTL_S",
    "active",
    "invalidate_catalog",
    "model_info",
    "embeddings_page",
    "embeddings_npy",
    "similar",
    "popular",
    "recommend_for_user",
]

CATALOG_TTL_S = 30.0


@dataclass
class _Serving:
    """A published model plus derived lookups (public data only), cached per version and shared
    by request threads; ``row`` is the requesting session's own ORM row (set per request)."""

    model: Any
    positions: dict[str, int]
    version_id: int = 0
    dataset_id: int = 0
    algorithm: str = ""
    npy: bytes | None = None
    masks: dict[Any, np.ndarray] = field(default_factory=dict)
    rating_range: tuple[float, float] | None = None  # the data set's public scale


@dataclass(frozen=True)
class _Catalog:
    """Public catalogue facts used for filtering: inactive items, category -> items."""

    stamp: float
    inactive: frozenset[str]
    by_category: dict[str, frozenset[str]]


_lock = threading.Lock()
_refresh_lock = threading.Lock()
_serving: dict[tuple[int, str], _Serving] = {}
_catalogs: dict[str, _Catalog] = {}


@dataclass
class _Active:
    """One request's view: its own ORM row plus the shared per-version cache."""

    row: ModelVersion
    cache: _Serving

    @property
    def model(self) -> Any:
        return self.cache.model

    @property
    def positions(self) -> dict[str, int]:
        return self.cache.positions


def active(session: Session, dataset: str) -> _Active:
    """The active model of ``dataset`` with its id index (404 ``no_active_model`` when none)."""
    from app.model_store import get_active_model

    row, model = get_active_model(session, dataset)
    key = (row.id, row.sha256)
    cached = _serving.get(key)
    if cached is None:
        positions = {str(i): k for k, i in enumerate(np.asarray(model.item_ids).tolist())}
        ds = session.get(Dataset, row.dataset_id)
        cached = _Serving(model=model, positions=positions, version_id=row.id, dataset_id=row.dataset_id,
                          algorithm=row.algorithm, rating_range=(float(ds.rating_min), float(ds.rating_max)))
        with _lock:
            if len(_serving) > 8:
                _serving.clear()
            _serving[key] = cached
    return _Active(row=row, cache=cached)


# One round trip for the hot path: the active version's key plus this user's own ratings.
_ACTIVE_AND_RATINGS = text(
    "SELECT mv.id, mv.sha256, i.external_id, r.value "
    "FROM datasets d "
    "JOIN model_versions mv ON mv.dataset_id = d.id AND mv.active "
    "LEFT JOIN users u ON u.external_id = :user "
    "LEFT JOIN ratings r ON r.dataset_id = d.id AND r.user_id = u.id "
    "LEFT JOIN items i ON i.id = r.item_id "
    "WHERE d.name = :dataset"
)


def _active_with_ratings(session: Session, dataset: str, user_id: str) -> tuple[_Serving, list[str], list[float]]:
    """The active model (cached per version) and the one user's ratings, in one query."""
    rows = session.execute(_ACTIVE_AND_RATINGS, {"dataset": dataset, "user": user_id}).all()
    cached = _serving.get((rows[0][0], rows[0][1])) if rows else None
    if cached is None:  # cold cache, no active model or unknown data set: the full path
        cached = active(session, dataset).cache
        if not rows or rows[0][0] != cached.version_id:  # activation raced with this request
            items, values = user_ratings_arrays(session, dataset_id=cached.dataset_id, user_id=user_id)
            return cached, items, values
    items = [r[2] for r in rows if r[2] is not None]
    values = [float(r[3]) for r in rows if r[2] is not None]
    return cached, items, values


def invalidate_catalog(dataset: str | None = None) -> None:
    """Forget cached catalogue facts (called after item writes in this process)."""
    with _lock:
        if dataset is None:
            _catalogs.clear()
        else:
            _catalogs.pop(dataset, None)


def _load_catalog(session: Session, dataset_id: int) -> _Catalog:
    inactive: set[str] = set()
    by_category: dict[str, set[str]] = {}
    for ext, cats, is_active in session.execute(
        select(Item.external_id, Item.categories, Item.active).where(Item.dataset_id == dataset_id)
    ):
        if not is_active:
            inactive.add(ext)
        for c in cats or ():
            by_category.setdefault(str(c), set()).add(ext)
    return _Catalog(stamp=time.monotonic(), inactive=frozenset(inactive),
                    by_category={k: frozenset(v) for k, v in by_category.items()})


def _catalog(session: Session, dataset_id: int, dataset: str) -> _Catalog:
    """The cached catalogue; after the TTL one thread reloads it while the others keep using
    the previous copy (no thundering herd on large catalogues)."""
    cat = _catalogs.get(dataset)
    if cat is not None and time.monotonic() - cat.stamp < CATALOG_TTL_S:
        return cat
    if not _refresh_lock.acquire(blocking=cat is None):
        return cat  # type: ignore[return-value]  # another thread is refreshing
    try:
        current = _catalogs.get(dataset)
        if current is not None and current is not cat and time.monotonic() - current.stamp < CATALOG_TTL_S:
            return current
        fresh = _load_catalog(session, dataset_id)
        with _lock:
            _catalogs[dataset] = fresh
        return fresh
    finally:
        _refresh_lock.release()


def _mask(active_: _Active, key: Any, ids: frozenset[str]) -> np.ndarray:
    """Boolean mask over the model's items for ``ids`` (cached per catalogue stamp; read-only)."""
    serving = active_.cache
    mask = serving.masks.get(key)
    if mask is None:
        mask = np.zeros(serving.model.n_items, dtype=bool)
        rows = [serving.positions[i] for i in ids if i in serving.positions]
        mask[np.asarray(rows, dtype=np.int64)] = True
        mask.setflags(write=False)
        if len(serving.masks) > 256:
            serving.masks.clear()
        serving.masks[key] = mask
    return mask


def _scored(serving: _Active, idx: np.ndarray, scores: np.ndarray | None) -> list[ScoredItem]:
    ids = np.asarray(serving.model.item_ids)[idx].tolist()
    values = [None] * len(ids) if scores is None else [float(x) for x in scores]
    return [ScoredItem(item_id=str(i), score=v, rank=k + 1) for k, (i, v) in enumerate(zip(ids, values))]


def model_info(session: Session, *, dataset: str) -> ModelInfoOut:
    """Public metadata of the active model."""
    s = active(session, dataset)
    row, model = s.row, s.model
    from app.ledger import round_up

    meta = dict(row.model_metadata or {})
    eps_pld = None if row.epsilon_pld is None else round_up(row.epsilon_pld)
    return ModelInfoOut(
        version=row.id, dataset_version=row.version, dataset=dataset, algorithm=row.algorithm, epsilon=round_up(row.epsilon),
        delta=row.delta, epsilon_rdp=round_up(row.epsilon), epsilon_pld=eps_pld, trained_at=row.created_at, n_items=model.n_items,
        n_trained_items=int(np.count_nonzero(model.trained_mask)), rank=model.rank,
        sha256=row.sha256, active=bool(row.active), metrics=dict(row.metrics or {}), privacy=meta,
    )


def embeddings_page(session: Session, *, dataset: str, offset: int, limit: int) -> EmbeddingsPage:
    """One page of item embeddings (rows of the public V)."""
    s = active(session, dataset)
    model = s.model
    total = model.n_items
    stop = min(offset + limit, total)
    ids = np.asarray(model.item_ids)[offset:stop].tolist()
    vecs = np.asarray(model.item_factors[offset:stop], dtype=np.float64).tolist()
    trained = model.trained_mask[offset:stop].tolist()
    rows = [EmbeddingRow(item_id=str(i), trained=bool(t), vector=v) for i, t, v in zip(ids, trained, vecs)]
    return EmbeddingsPage(model_version=s.row.id, rank=model.rank, items=rows, total=total,
                          offset=offset, limit=limit, next_offset=stop if stop < total else None)


def embeddings_npy(session: Session, *, dataset: str) -> tuple[bytes, int]:
    """The whole V as a float32 ``.npy`` file (cached per version) and the version id."""
    s = active(session, dataset)
    if s.cache.npy is None:
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(s.model.item_factors, dtype=np.float32), allow_pickle=False)
        s.cache.npy = buf.getvalue()
    return s.cache.npy, s.row.id


def similar(session: Session, *, dataset: str, item_id: str, n: int) -> SimilarOut:
    """Items closest to ``item_id`` by cosine on the public V (inactive items left out)."""
    s = active(session, dataset)
    pos = s.positions.get(item_id)
    if pos is None:
        raise NotFound(f"item {item_id!r} is not in the active model", code="unknown_item",
                       details={"item_id": item_id, "model_version": s.row.id})
    cat = _catalog(session, s.row.dataset_id, dataset)
    idx, scores = foldin.similar_items(s.model, pos, n + len(cat.inactive))
    if cat.inactive:
        keep = ~_mask(s, ("inactive", cat.stamp), cat.inactive)[idx]
        idx, scores = idx[keep][:n], scores[keep][:n]
    return SimilarOut(model_version=s.row.id, item_id=item_id, items=_scored(s, idx[:n], scores[:n]))


def _popular_idx(s: _Active, n: int, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = np.asarray(s.model.item_counts, dtype=np.float64)
    return foldin.top_n(counts, n, np.flatnonzero(candidates))


def popular(session: Session, *, dataset: str, n: int) -> PopularOut:
    """Most popular active items by the DP counts released with the model."""
    s = active(session, dataset)
    cat = _catalog(session, s.row.dataset_id, dataset)
    allowed = ~_mask(s, ("inactive", cat.stamp), cat.inactive)
    idx, counts = _popular_idx(s, n, allowed)
    ids = np.asarray(s.model.item_ids)[idx].tolist()
    return PopularOut(model_version=s.row.id, items=[
        PopularItem(item_id=str(i), dp_count=float(c), rank=k + 1) for k, (i, c) in enumerate(zip(ids, counts))])


def recommend_for_user(session: Session, *, dataset: str, user_id: str,
                       query: RecommendationQuery) -> RecommendationsOut:
    """Top-N (or the ranking of ``query.items``) for one user from the active model plus this
    user's own ratings only (own stored votes for a model trained on votes: one-bit)."""
    cache, item_ids, values = _active_with_ratings(session, dataset, user_id)  # 404s as `active`
    algorithm = get_algorithm(cache.algorithm)
    noun = "ratings"
    if algorithm.data == "votes":
        from app.services.votes import user_votes_arrays

        noun = "votes"
        item_ids, values = user_votes_arrays(session, dataset_id=cache.dataset_id, user_id=user_id)
    s = _Active(row=None, cache=cache)  # type: ignore[arg-type]  # the row is not needed here
    model = s.model
    rated = np.fromiter((s.positions.get(i, -1) for i in item_ids), dtype=np.int64, count=len(item_ids))
    known = rated >= 0
    rated_idx, rated_vals = rated[known], np.asarray(values, dtype=np.float64)[known]
    kind = score_kind(cache.algorithm, model)
    usable = int(np.count_nonzero(model.trained_mask[rated_idx])) if len(rated_idx) else 0
    reason = None
    if usable == 0:
        reason = f"user has no {noun}" if not item_ids else f"none of the user's {noun} is for an item in the trained set"
    out = dict(user_id=user_id, model_version=cache.version_id, algorithm=cache.algorithm, score_kind=kind)
    if query.items is not None:
        return RecommendationsOut(**out, fallback=False, fallback_reason=None,
                                  items=_ranked_list(s, algorithm, kind, rated_idx, rated_vals, query.items))
    allowed = _allowed(session, s, dataset, query)
    allowed[rated_idx] = False
    out["notes"] = _category_notes(session, s, dataset, query)
    if reason is not None:
        idx, _ = _popular_idx(s, query.n, allowed)
        scores = _baseline_scores(s, kind)
        items = _scored(s, idx, None if scores is None else scores[idx])
        counts = np.asarray(model.item_counts, dtype=np.float64)[idx]
        items = [item.model_copy(update={"dp_count": float(c)}) for item, c in zip(items, counts)]
        return RecommendationsOut(**out, fallback=True, fallback_reason=f"dp_popular: {reason}", items=items)
    scores = _on_scale(s, kind, algorithm.score(model, rated_idx, rated_vals))
    if kind != "ranking_score":
        allowed &= model.trained_mask  # untrained items carry no personal signal: never in a top-N
    idx, top = foldin.top_n(scores, query.n, np.flatnonzero(allowed))
    return RecommendationsOut(**out, fallback=False, fallback_reason=None, items=_scored(s, idx, top))


def _allowed(session: Session, s: _Active, dataset: str, query: RecommendationQuery) -> np.ndarray:
    """Candidate mask: active items, in ``categories`` when given, not in ``exclude``."""
    cat = _catalog(session, s.cache.dataset_id, dataset)
    allowed = ~_mask(s, ("inactive", cat.stamp), cat.inactive)
    if query.categories is not None:
        in_cats = np.zeros(s.model.n_items, dtype=bool)
        for c in query.categories:
            in_cats |= _mask(s, ("cat", c, cat.stamp), cat.by_category.get(c, frozenset()))
        allowed &= in_cats
    if query.exclude:
        ex = [s.positions[i] for i in query.exclude if i in s.positions]
        allowed[np.asarray(ex, dtype=np.int64)] = False
    return allowed


def _category_notes(session: Session, s: _Active, dataset: str, query: RecommendationQuery) -> list[str]:
    """Say so when a requested category is carried by no item (the list would be silently empty)."""
    if not query.categories:
        return []
    known = _catalog(session, s.cache.dataset_id, dataset).by_category
    return [f"no item carries category {c!r}" for c in query.categories if c not in known]


def _on_scale(s: _Active, kind: str, scores: np.ndarray) -> np.ndarray:
    """Predicted ratings clipped into the data set's range (a safety net: the model's own
    shrinkage keeps them on the scale, see quality-defaults' rmse_unclipped)."""
    if kind != "predicted_rating" or s.cache.rating_range is None:
        return scores
    lo, hi = s.cache.rating_range
    return np.clip(scores, lo, hi)


def _baseline_scores(s: _Active, kind: str) -> np.ndarray | None:
    """Scores of a user with no data: m̃ + b̃_j (or the ranking prior) for the fold-in family."""
    if not hasattr(s.model, "item_biases"):
        return None
    return _on_scale(s, kind, foldin.predict_ratings(s.model, np.zeros(s.model.rank)))


def _ranked_list(s: _Active, algorithm: Any, kind: str, rated_idx: np.ndarray, rated_vals: np.ndarray,
                 items: list[str]) -> list[ScoredItem]:
    """Exactly ``items``, best first, each with its score (baseline-flagged outside the trained set)."""
    unknown = [i for i in items if i not in s.positions]
    if unknown:
        raise Unprocessable(f"{len(unknown)} item id(s) are not in the active model", code="unknown_items",
                            details={"unknown_items": unknown[:100]})
    idx = np.asarray([s.positions[i] for i in items], dtype=np.int64)
    scores = _on_scale(s, kind, algorithm.score(s.model, rated_idx, rated_vals))[idx]
    order = np.argsort(-scores, kind="stable")
    trained = s.model.trained_mask
    return [ScoredItem(item_id=items[k], score=float(scores[k]), rank=r + 1, baseline=not bool(trained[idx[k]]))
            for r, k in enumerate(order)]
