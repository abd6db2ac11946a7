"""Bulk reads of the (user, item, value) tables of a data set into a :class:`Ratings`.

Ratings and votes are read the same way: binary ``COPY`` on PostgreSQL, ``fetchmany`` chunks
elsewhere, then one ``np.unique`` / ``np.searchsorted`` pass onto the data set's catalogue
(items = every item of the data set, so the model's item space is public). Used by training
inputs and by the public-data and votes services; it imports no other service.
"""

from __future__ import annotations

import math

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.data.ratings import Ratings
from app.db.dialect import PG_COPY_HEADER, PG_COPY_TRIPLET, driver_connection
from app.db.models import Dataset, Item
from app.db.session import is_postgres

__all__ = ["load_ratings", "load_triplets", "ratings_from_triplets", "item_index", "Triplets"]


def item_index(session: Session, ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """(database ids sorted ascending, external ids in the same order) of every item of ``ds``."""
    item_rows = session.execute(select(Item.id, Item.external_id).where(Item.dataset_id == ds.id).order_by(Item.id)).all()
    item_db = np.fromiter((r[0] for r in item_rows), dtype=np.int64, count=len(item_rows))
    item_ext = np.array([r[1] for r in item_rows], dtype=object)
    return item_db, item_ext


_TABLES = ("ratings", "votes")  # (user_id, item_id, value) tables; values read as float64
Triplets = tuple[np.ndarray, np.ndarray, np.ndarray]


def _randomised_filter(local_epsilon: float | None) -> str:
    """SQL condition keeping only votes randomised with exactly ``local_epsilon`` (none: all rows)."""
    if local_epsilon is None:
        return ""
    value = float(local_epsilon)
    if not math.isfinite(value) or value <= 0:
        raise ValueError("local_epsilon must be finite and > 0")
    return f" AND randomised AND local_epsilon = {value!r}"


def _triplets_postgres(session: Session, table: str, dataset_id: int, local_epsilon: float | None = None) -> Triplets:
    """(user_id, item_id, value) of a data set via binary COPY (fixed-width columns, no NULLs)."""
    cursor = driver_connection(session).cursor()
    buf = bytearray()
    sql = ("COPY (SELECT user_id, item_id, CAST(value AS DOUBLE PRECISION) FROM {} WHERE dataset_id = {}"
           + _randomised_filter(local_epsilon).replace("%", "%%") + ") TO STDOUT (FORMAT BINARY)")
    with cursor.copy(sql.format(table, int(dataset_id))) as copy:
        for chunk in copy:
            buf += chunk
    cursor.close()
    body = memoryview(buf)[len(PG_COPY_HEADER) : len(buf) - 2]  # strip the header and the -1 trailer
    if len(body) % PG_COPY_TRIPLET.itemsize:
        raise RuntimeError("unexpected binary COPY layout for ratings")
    rows = np.frombuffer(body, dtype=PG_COPY_TRIPLET)
    fixed_width = all(np.all(rows[field] == width) for field, width in (("n", 3), ("l1", 8), ("l2", 8), ("l3", 8)))
    if len(rows) and not fixed_width:
        raise RuntimeError("unexpected binary COPY layout for ratings")
    return rows["u"].astype(np.int64), rows["i"].astype(np.int64), rows["v"].astype(np.float64)


def _triplets_generic(session: Session, table: str, dataset_id: int, local_epsilon: float | None = None) -> Triplets:
    cursor = driver_connection(session).cursor()
    cursor.execute(f"SELECT user_id, item_id, value FROM {table} WHERE dataset_id = ?{_randomised_filter(local_epsilon)}",
                   (int(dataset_id),))
    parts = []
    while True:
        chunk = cursor.fetchmany(500_000)
        if not chunk:
            break
        parts.append(np.array(chunk, dtype=np.float64))
    cursor.close()
    arr = np.concatenate(parts) if parts else np.empty((0, 3))
    return arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64), arr[:, 2]


def load_triplets(session: Session, ds: Dataset, table: str = "ratings", *,
                  local_epsilon: float | None = None) -> Triplets:
    """(user db id, item db id, value as float64) of every row of ``table`` in ``ds`` (votes
    with ``local_epsilon``: only those randomised with exactly that ε0)."""
    if table not in _TABLES:
        raise ValueError(f"unknown triplet table {table!r}")
    if local_epsilon is not None and table != "votes":
        raise ValueError("local_epsilon filters votes only")
    loader = _triplets_postgres if is_postgres(session) else _triplets_generic
    return loader(session, table, ds.id, local_epsilon)


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
