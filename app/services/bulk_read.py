"""Bulk reads of the (user, item, value) tables of a data set into a :class:`Ratings`.

Ratings and votes are read the same way (the ratings store's
:meth:`~app.db.stores.ratings.RatingsStore.triplets`: binary ``COPY`` on PostgreSQL,
``fetchmany`` chunks elsewhere), then one ``np.unique`` / ``np.searchsorted`` pass onto the data set's catalogue
(items = every item of the data set, so the model's item space is public). Used by training
inputs and by the public-data and votes services; it imports no other service.
"""

from __future__ import annotations

import numpy as np
from sqlalchemy.orm import Session

from app.core.data.ratings import Ratings
from app.db.models import Dataset
from app.db.stores import Triplets, catalogue_store, ratings_store
from app.db.stores.ratings import TRIPLET_TABLES

__all__ = ["load_ratings", "load_triplets", "ratings_from_triplets", "item_index", "Triplets"]


def item_index(session: Session, ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """(database ids sorted ascending, external ids in the same order) of every item of ``ds``."""
    return catalogue_store(session).item_index(ds.id)


def load_triplets(session: Session, ds: Dataset, table: str = "ratings", *,
                  local_epsilon: float | None = None) -> Triplets:
    """(user db id, item db id, value as float64) of every row of ``table`` in ``ds`` (votes
    with ``local_epsilon``: only those randomised with exactly that ε0)."""
    if table not in TRIPLET_TABLES:
        raise ValueError(f"unknown triplet table {table!r}")
    if local_epsilon is not None and table != "votes":
        raise ValueError("local_epsilon filters votes only")
    return ratings_store(session).triplets(table, ds.id, local_epsilon)


def load_ratings(session: Session, ds: Dataset, table: str = "ratings", *,
                 local_epsilon: float | None = None) -> Ratings:
    """All rows of ``table`` (ratings or votes) of ``ds`` as a :class:`Ratings`
    (users = those with a row, sorted by database id; items = every item of the data set)."""
    return ratings_from_triplets(*item_index(session, ds), *load_triplets(session, ds, table, local_epsilon=local_epsilon))


def ratings_from_triplets(item_db: np.ndarray, item_ext: np.ndarray, u: np.ndarray, i: np.ndarray, v: np.ndarray) -> Ratings:
    """A :class:`Ratings` over every item (``item_index`` order) from database-id triplets."""
    user_ids, rows = np.unique(u, return_inverse=True)
    cols = np.searchsorted(item_db, i)
    if len(i) and (cols.max() >= len(item_db) or not np.array_equal(item_db[cols], i)):
        raise RuntimeError("ratings reference items outside their data set")
    return Ratings.from_indices(rows.astype(np.int64), cols.astype(np.int64), v, user_ids=user_ids, item_ids=item_ext)
