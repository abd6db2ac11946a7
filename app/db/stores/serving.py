"""The serving hot path's reads: the active published version's key and one user's own ratings
in one statement, one round trip (:mod:`app.db.hot_read`), on a session or on the event loop.

The ratings come by the items' database ids (mapped to model rows in the API process: joining
the items table cost PostgreSQL an index probe per rating, about a third of the statement's time).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.db.hot_read import Rows, read_rows, read_rows_async

__all__ = ["Rows", "ACTIVE_AND_RATINGS", "ACTIVE_AND_RATINGS_MANY", "active_and_ratings", "active_and_ratings_on_loop"]

# rows (version id, sha256, item row id or NULL, value or NULL); none: no active version
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


def active_and_ratings(session: Session, dataset: str, user_id: str) -> Rows:
    """(version id, sha256, item row id, value) rows of :data:`ACTIVE_AND_RATINGS`: the active
    version of ``dataset`` with each of the user's ratings there (one row with NULLs for a user
    without any; no row without an active version or data set)."""
    return read_rows(session, ACTIVE_AND_RATINGS, {"dataset": dataset, "user": user_id})


def active_and_ratings_on_loop(bind: Any, pool_size: int, dataset: str, user_id: str) -> Awaitable[Rows | None]:
    """:func:`active_and_ratings` on the event loop, grouped with concurrent requests
    (:func:`app.db.hot_read.read_rows_async`; the coroutine itself, no frame around it); None
    for a bind other than a PostgreSQL engine."""
    return read_rows_async(bind, ACTIVE_AND_RATINGS_MANY, {"dataset": dataset}, user_id, pool_size)
