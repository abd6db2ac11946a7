"""The active published model of a data set, cached per version, and the hot path's read of it
with one user's own ratings.

Everything cached here is public: the published release (item factors, DP counts, public
config) and the public catalogue's ids. The catalogue's filtering facts are cached by
:mod:`app.services.serving.catalogue_cache`; masks and response rows are built by
:mod:`app.services.serving.responses`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.db.models import ModelVersion
from app.db.stores import catalogue_store, ratings_store
from app.db.stores.serving import Rows, active_and_ratings
from app.model_store import get_active_model
from app.services.serving.catalogue_cache import invalidate_catalog  # re-exported: the CLI drops the cache from here

__all__ = ["ServedModel", "ActiveModel", "UserRatings", "active", "active_with_ratings", "ratings_from_rows",
           "invalidate_catalog"]


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


_lock = threading.Lock()
_serving: dict[tuple[int, str], ServedModel] = {}
# (model, item keys, values, item key -> model row): a request's user data as read
UserRatings = tuple[ServedModel, list[Any], list[float], dict[Any, int]]


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
        cached = ServedModel(model=model, positions=positions, version_id=row.id, sha256=row.sha256,
                             dataset_id=row.dataset_id, algorithm=row.algorithm,
                             rating_range=catalogue_store(session).rating_range(row.dataset_id))
        with _lock:
            if len(_serving) > 8:
                _serving.clear()
            _serving[key] = cached
    return ActiveModel(row=row, cache=cached)


def active_with_ratings(session: Session, dataset: str, user_id: str) -> UserRatings:
    """The active model (cached per version) and the one user's ratings, in one query:
    (model, item keys, values, item key -> model row). The keys are the items' database ids
    (external ids when an activation raced with the request); items outside the model have no row."""
    rows = active_and_ratings(session, dataset, user_id)
    cached = _serving.get((rows[0][0], rows[0][1])) if rows else None
    if cached is None:  # cold cache, no active model or unknown data set: the full path
        cached = active(session, dataset).cache
        if not rows or rows[0][0] != cached.version_id:  # activation raced with this request
            items, values = ratings_store(session).user_ratings(cached.dataset_id, user_id)
            return cached, items, values, cached.positions
    return _user_ratings(cached, rows, _row_positions(session, cached))


def ratings_from_rows(rows: Rows) -> UserRatings | None:
    """:func:`active_with_ratings` from the rows of
    :func:`~app.db.stores.serving.active_and_ratings_on_loop` alone, when the
    active version and its row positions are cached in this process; None otherwise (the caller
    takes the session path)."""
    cached = _serving.get((rows[0][0], rows[0][1])) if rows else None
    if cached is None or cached.row_positions is None:
        return None
    return _user_ratings(cached, rows, cached.row_positions)


def _user_ratings(cached: ServedModel, rows: Rows, positions: dict[int, int]) -> UserRatings:
    pairs = sorted((r[2], float(r[3])) for r in rows if r[2] is not None)  # one order whatever the plan
    return cached, [k for k, _ in pairs], [v for _, v in pairs], positions


def _row_positions(session: Session, cached: ServedModel) -> dict[int, int]:
    """items.id -> model row for the model's items (loaded once per version; an item's database
    id and external id never change: items are deactivated, never deleted or renamed)."""
    mapping = cached.row_positions
    if mapping is None:
        positions = cached.positions
        mapping = {item_id: positions[ext] for item_id, ext in
                   catalogue_store(session).model_item_rows(cached.dataset_id) if ext in positions}
        cached.row_positions = mapping
    return mapping
