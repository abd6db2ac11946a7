"""Per-domain stores: every query a use case of :mod:`app.services` makes, behind a small
protocol with a PostgreSQL and a SQLite implementation, chosen once per session from the
engine's dialect.

* :mod:`app.db.stores.catalogue`: data sets by name and their public items;
* :mod:`app.db.stores.ratings`: users and ratings (:mod:`~app.db.stores.ratings_postgres`,
  :mod:`~app.db.stores.ratings_sqlite`), and the bulk read of (user, item, value) tables
  (PostgreSQL's COPY paths: :mod:`~app.db.stores.postgres_copy`);
* :mod:`app.db.stores.serving`: the serving hot path's one-round-trip reads;
* :mod:`app.db.stores.runs`: training runs and model versions;
* :mod:`app.db.stores.votes`: votes and their allowances;
* :mod:`app.db.stores.public_inputs`: public item data (features, similarities, public users);
* :mod:`app.db.stores.admin`: the administration's reads and writes.
* :mod:`app.db.stores.revocations`: revoked token ids.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from app.db.session import store_for
from app.db.stores.catalogue import CatalogueStore, DatasetRef, catalogue_store
from app.db.stores.ratings import OneRating, RatingsStore, Triplets
from app.db.stores.ratings_postgres import PostgresRatingsStore
from app.db.stores.ratings_sqlite import SqliteRatingsStore

__all__ = ["CatalogueStore", "DatasetRef", "catalogue_store", "OneRating", "RatingsStore", "Triplets", "ratings_store"]

_RATINGS: dict[str, Callable[[Session], RatingsStore]] = {
    "postgresql": PostgresRatingsStore, "sqlite": SqliteRatingsStore}


def ratings_store(session: Session) -> RatingsStore:
    """The ratings store of ``session``'s database (chosen by its dialect)."""
    return store_for(session, _RATINGS)
