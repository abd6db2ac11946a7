"""The active published model of a data set, cached per version, and the public catalogue facts
serving filters with (inactive items, categories), cached per data set with a short TTL.

Everything here is public: the published release (item factors, DP counts, public config) and
the public catalogue. ``invalidate_catalog`` is called after a committed item write.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import String, cast, or_, select, text
from sqlalchemy.orm import Session

from app.db.models import Dataset, Item, ModelVersion
from app.model_store import get_active_model
from app.schemas.serving import ScoredItem
from app.services.ingest import user_ratings_arrays
from app.services.serving.hot_read import Rows, read_rows

__all__ = ["CATALOG_TTL_S", "ACTIVE_AND_RATINGS", "ACTIVE_AND_RATINGS_MANY", "ServedModel", "Catalog", "ActiveModel", "active",
           "active_with_ratings", "active_and_ratings_params", "ratings_from_rows", "invalidate_catalog", "catalog",
           "fresh_catalog", "item_mask", "scored_items", "scored_rows"]

CATALOG_TTL_S = 30.0


@dataclass
class ServedModel:
    """A published model plus derived lookups (public data only), cached per version and shared
    by request threads; ``row`` is the requesting session's own ORM row (set per request)."""

    model: Any
    positions: dict[str, int]
    version_id: int = 0
    sha256: str = ""  # the artifact's digest: with version_id, names the published model
    dataset_id: int = 0
    algorithm: str = ""
    npy: bytes | None = None
    masks: dict[Any, np.ndarray] = field(default_factory=dict)
    rating_range: tuple[float, float] | None = None  # the data set's public scale
    trained: Any = None  # trained_scoring.TrainedRows, built on first use
    row_positions: dict[int, int] | None = None  # items.id -> model row (public catalogue), built on first use


@dataclass(frozen=True)
class Catalog:
    """Public catalogue facts used for filtering: inactive items, category -> items."""

    stamp: float
    inactive: frozenset[str]
    by_category: dict[str, frozenset[str]]


_lock = threading.Lock()
_refresh_lock = threading.Lock()
_serving: dict[tuple[int, str], ServedModel] = {}
_catalogs: dict[str, Catalog] = {}


@dataclass
class ActiveModel:
    """One request's view: its own ORM row plus the shared per-version cache."""

    row: ModelVersion
    cache: ServedModel

    @property
    def model(self) -> Any:
        return self.cache.model

    @property
    def positions(self) -> dict[str, int]:
        return self.cache.positions


def active(session: Session, dataset: str) -> ActiveModel:
    """The active model of ``dataset`` with its id index (404 ``no_active_model`` when none)."""
    row, model = get_active_model(session, dataset)
    key = (row.id, row.sha256)
    cached = _serving.get(key)
    if cached is None:
        positions = {str(i): k for k, i in enumerate(np.asarray(model.item_ids).tolist())}
        ds = session.get_one(Dataset, row.dataset_id)  # the version row's foreign key
        cached = ServedModel(model=model, positions=positions, version_id=row.id, sha256=row.sha256,
                             dataset_id=row.dataset_id,
                             algorithm=row.algorithm, rating_range=(float(ds.rating_min), float(ds.rating_max)))
        with _lock:
            if len(_serving) > 8:
                _serving.clear()
            _serving[key] = cached
    return ActiveModel(row=row, cache=cached)


# One round trip for the hot path: the active version's key plus this user's own ratings, by
# the items' database ids (mapped to model rows in this process: joining the items table cost
# PostgreSQL an index probe per rating, about a third of the statement's time).
ACTIVE_AND_RATINGS = text(
    "SELECT mv.id, mv.sha256, r.item_id, r.value "
    "FROM datasets d "
    "JOIN model_versions mv ON mv.dataset_id = d.id AND mv.active "
    "LEFT JOIN users u ON u.external_id = :user "
    "LEFT JOIN ratings r ON r.dataset_id = d.id AND r.user_id = u.id "
    "WHERE d.name = :dataset"
)

# The same for several users at once (the event loop's grouped reads, hot_read.read_rows_async):
# each row starts with the user's external id.
ACTIVE_AND_RATINGS_MANY = text(
    "SELECT q.ext, mv.id, mv.sha256, r.item_id, r.value "
    "FROM datasets d "
    "JOIN model_versions mv ON mv.dataset_id = d.id AND mv.active "
    "CROSS JOIN unnest(CAST(:keys AS text[])) AS q(ext) "
    "LEFT JOIN users u ON u.external_id = q.ext "
    "LEFT JOIN ratings r ON r.dataset_id = d.id AND r.user_id = u.id "
    "WHERE d.name = :dataset"
)


def active_with_ratings(session: Session, dataset: str,
                        user_id: str) -> tuple[ServedModel, list[Any], list[float], dict[Any, int]]:
    """The active model (cached per version) and the one user's ratings, in one query:
    (model, item keys, values, item key -> model row). The keys are the items' database ids
    (external ids when an activation raced with the request); items outside the model have no row."""
    rows = read_rows(session, ACTIVE_AND_RATINGS, active_and_ratings_params(dataset, user_id))
    cached = _serving.get((rows[0][0], rows[0][1])) if rows else None
    if cached is None:  # cold cache, no active model or unknown data set: the full path
        cached = active(session, dataset).cache
        if not rows or rows[0][0] != cached.version_id:  # activation raced with this request
            items, values = user_ratings_arrays(session, dataset_id=cached.dataset_id, user_id=user_id)
            return cached, items, values, cached.positions
    return _user_ratings(cached, rows, _row_positions(session, cached))


def active_and_ratings_params(dataset: str, user_id: str) -> dict[str, str]:
    """The parameters of :data:`ACTIVE_AND_RATINGS` for one request."""
    return {"dataset": dataset, "user": user_id}


def ratings_from_rows(rows: Rows) -> tuple[ServedModel, list[Any], list[float], dict[Any, int]] | None:
    """:func:`active_with_ratings` from the rows of :data:`ACTIVE_AND_RATINGS` alone, when the
    active version and its row positions are cached in this process; None otherwise (the caller
    takes the session path)."""
    cached = _serving.get((rows[0][0], rows[0][1])) if rows else None
    if cached is None or cached.row_positions is None:
        return None
    return _user_ratings(cached, rows, cached.row_positions)


def _user_ratings(cached: ServedModel, rows: Rows,
                  positions: dict[int, int]) -> tuple[ServedModel, list[Any], list[float], dict[Any, int]]:
    pairs = sorted((r[2], float(r[3])) for r in rows if r[2] is not None)  # one order whatever the plan
    return cached, [k for k, _ in pairs], [v for _, v in pairs], positions


def _row_positions(session: Session, cached: ServedModel) -> dict[int, int]:
    """items.id -> model row for the model's items (loaded once per version; an item's database
    id and external id never change: items are deactivated, never deleted or renamed)."""
    mapping = cached.row_positions
    if mapping is None:
        positions = cached.positions
        mapping = {item_id: positions[ext] for item_id, ext in session.execute(
            select(Item.id, Item.external_id).where(Item.dataset_id == cached.dataset_id)) if ext in positions}
        cached.row_positions = mapping
    return mapping


def invalidate_catalog(dataset: str | None = None) -> None:
    """Forget cached catalogue facts (called after item writes in this process)."""
    with _lock:
        if dataset is None:
            _catalogs.clear()
        else:
            _catalogs.pop(dataset, None)


def _load_catalog(session: Session, dataset_id: int) -> Catalog:
    """The catalogue facts, read from the items that carry one: inactive or with a category.

    Every process reloads them every ``CATALOG_TTL_S`` on a request's path; reading (and decoding
    the categories of) all 20,000 items of a typical catalogue cost 50-110 ms of CPU in that
    process each time, while the requests it served waited. An item whose categories are stored
    as the empty list ``[]`` (what a write of no categories stores) and that is active carries no
    fact and is not read; any other spelling of an empty list is read and contributes nothing.
    """
    inactive: set[str] = set()
    by_category: dict[str, set[str]] = {}
    carries_a_fact = or_(~Item.active, cast(Item.categories, String) != "[]")
    for ext, cats, is_active in session.execute(
        select(Item.external_id, Item.categories, Item.active).where(Item.dataset_id == dataset_id, carries_a_fact)
    ):
        if not is_active:
            inactive.add(ext)
        for c in cats or ():
            by_category.setdefault(str(c), set()).add(ext)
    return Catalog(stamp=time.monotonic(), inactive=frozenset(inactive),
                    by_category={k: frozenset(v) for k, v in by_category.items()})


def fresh_catalog(dataset: str) -> Catalog | None:
    """The cached catalogue of ``dataset`` while it is within its TTL; None otherwise."""
    cat = _catalogs.get(dataset)
    return cat if cat is not None and time.monotonic() - cat.stamp < CATALOG_TTL_S else None


def catalog(session: Session, dataset_id: int, dataset: str) -> Catalog:
    """The cached catalogue; after the TTL one thread reloads it while the others keep using
    the previous copy (no thundering herd on large catalogues)."""
    cat = fresh_catalog(dataset)
    if cat is not None:
        return cat
    cat = _catalogs.get(dataset)
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


def item_mask(active_: ActiveModel, key: Any, ids: frozenset[str]) -> np.ndarray:
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


def scored_items(serving: ActiveModel, idx: np.ndarray, scores: np.ndarray | None) -> list[ScoredItem]:
    """The response rows for ``idx``, best first (``tolist``: Python floats, as ``float(x)``)."""
    return [ScoredItem(**row) for row in scored_rows(serving, idx, scores)]


def scored_rows(serving: ActiveModel, idx: np.ndarray, scores: np.ndarray | None) -> list[dict[str, Any]]:
    """:func:`scored_items` as plain dicts, for a response model that validates them all in one
    call (a ``ScoredItem`` built per row cost about as much again)."""
    ids = np.asarray(serving.model.item_ids)[idx].tolist()
    values = [None] * len(ids) if scores is None else scores.tolist()
    return [{"item_id": str(i), "score": v, "rank": k} for k, (i, v) in enumerate(zip(ids, values, strict=True), 1)]
