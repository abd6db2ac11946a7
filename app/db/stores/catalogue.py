"""The catalogue store: data sets by name and the public items of each (PostgreSQL and SQLite).

Every read or write of the ``datasets`` and ``items`` tables that a use case makes goes through
:class:`CatalogueStore`; :func:`catalogue_store` picks the implementation from the session's
dialect. The two differ only where the database does: PostgreSQL looks many item ids up in one
statement with an array parameter and row-locks a data set; SQLite looks them up in chunks and
serialises writers anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np
from sqlalchemy import String, cast, func, or_, select, text
from sqlalchemy.orm import Session

from app.db.dialect import CHUNK, chunks, driver_connection, driver_sql, insert_for, pg_array
from app.db.models import Dataset, Item, bump_ratings_version
from app.db.session import store_for
from app.errors import UnknownDataset

__all__ = ["CatalogueStore", "DatasetRef", "DatasetLock", "ItemFacts", "catalogue_store",
           "PostgresCatalogueStore", "SqliteCatalogueStore"]

DatasetLock = Literal["share", "update"]  # FOR KEY SHARE (ingestion) / FOR UPDATE (settings changes)


class DatasetRef(NamedTuple):
    """What a rating write reads of its data set: the row id, the name and the rating range."""

    id: int
    name: str
    rating_min: float
    rating_max: float


class ItemFacts(NamedTuple):
    """An item's public metadata that retraining depends on (DP-CMF's side information)."""

    categories: list[Any]
    features: dict[str, Any]


class CatalogueStore(Protocol):
    """Data sets and their public items. Methods never commit; the caller's unit of work does."""

    def find_dataset(self, name: str, *, lock: DatasetLock | None = None) -> Dataset | None:
        """The data set called ``name`` (None when unknown), row-locked where the database can."""

    def get_dataset(self, name: str, *, lock: DatasetLock | None = None) -> Dataset:
        """:meth:`find_dataset`, raising ``UnknownDataset`` (404) when there is none."""

    def rating_range(self, dataset_id: int) -> tuple[float, float]:
        """The data set's public rating scale (rating_min, rating_max), by row id."""

    def dataset_ref(self, name: str) -> DatasetRef:
        """The data set as a :class:`DatasetRef` (404 when unknown)."""

    def bump_version(self, dataset_id: int, n: int) -> None:
        """Record ``n`` changes of the data set's training inputs (its ``ratings_version``)."""

    def item_row_ids(self, dataset_id: int, external_ids: Sequence[str]) -> dict[str, int]:
        """External item id -> row id for the known items among ``external_ids``."""

    def item_index(self, dataset_id: int) -> tuple[np.ndarray, np.ndarray]:
        """(row ids ascending, external ids in the same order) of every item of the data set."""

    def upsert_items(self, dataset_id: int, rows: dict[str, tuple[str | None, list[Any]]], now: datetime) -> None:
        """Create or update items ``external id -> (title, categories)`` (features kept)."""

    def item_facts(self, dataset_id: int, item_id: str) -> ItemFacts | None:
        """The item's categories and features (None: no such item)."""

    def upsert_item(self, dataset_id: int, item_id: str, values: dict[str, Any], now: datetime) -> None:
        """Create or replace one item's columns ``values``."""

    def get_item(self, dataset_id: int, item_id: str) -> Item | None:
        """One item row (None when unknown)."""

    def items_page(self, dataset_id: int, offset: int, limit: int) -> tuple[int, list[Item]]:
        """(item count, one page of items ordered by external id)."""

    def model_item_rows(self, dataset_id: int) -> Iterable[tuple[int, str]]:
        """(row id, external id) of every item of the data set."""

    def items_carrying_a_fact(self, dataset_id: int) -> Iterable[tuple[str, Any, bool]]:
        """(external id, categories, active) of the items that are inactive or carry a category.

        An active item whose categories are stored as the empty list ``[]`` (what a write of no
        categories stores) is not read: a periodic reload of a large catalogue reads only the few
        items that matter to filtering."""


class _SqlCatalogue:
    """What both databases run alike (ORM statements); subclasses add the dialect's own."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def _lockable(self, stmt: Any, lock: DatasetLock | None) -> Any:
        return stmt

    def find_dataset(self, name: str, *, lock: DatasetLock | None = None) -> Dataset | None:
        # populate_existing: the row as read now, even where this session holds the object with
        # columns changed by an UPDATE statement since (the version bumps)
        stmt = self._lockable(select(Dataset).where(Dataset.name == name), lock)
        return self.session.execute(stmt.execution_options(populate_existing=True)).scalar_one_or_none()

    def get_dataset(self, name: str, *, lock: DatasetLock | None = None) -> Dataset:
        ds = self.find_dataset(name, lock=lock)
        if ds is None:
            raise UnknownDataset(name)
        return ds

    def rating_range(self, dataset_id: int) -> tuple[float, float]:
        ds = self.session.get_one(Dataset, dataset_id)
        return float(ds.rating_min), float(ds.rating_max)

    def dataset_ref(self, name: str) -> DatasetRef:
        ds = self.get_dataset(name)
        return DatasetRef(ds.id, ds.name, ds.rating_min, ds.rating_max)

    def bump_version(self, dataset_id: int, n: int) -> None:
        bump_ratings_version(self.session, dataset_id, n=n)

    def item_row_ids(self, dataset_id: int, external_ids: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for part in chunks(sorted(set(external_ids)), CHUNK):
            rows = self.session.execute(
                select(Item.id, Item.external_id).where(Item.dataset_id == dataset_id, Item.external_id.in_(part)))
            out.update({ext: iid for iid, ext in rows})
        return out

    def item_index(self, dataset_id: int) -> tuple[np.ndarray, np.ndarray]:
        item_rows = self.session.execute(
            select(Item.id, Item.external_id).where(Item.dataset_id == dataset_id).order_by(Item.id)).all()
        item_db = np.fromiter((r[0] for r in item_rows), dtype=np.int64, count=len(item_rows))
        item_ext = np.array([r[1] for r in item_rows], dtype=object)
        return item_db, item_ext

    def upsert_items(self, dataset_id: int, rows: dict[str, tuple[str | None, list[Any]]], now: datetime) -> None:
        for part in chunks(sorted(rows), CHUNK // 2):
            stmt = insert_for(self.session, Item.__table__).values(
                [{"dataset_id": dataset_id, "external_id": e, "title": rows[e][0], "categories": rows[e][1],
                  "features": {}, "active": True, "created_at": now, "updated_at": now} for e in part])
            self.session.execute(stmt.on_conflict_do_update(
                index_elements=["dataset_id", "external_id"],
                set_={"title": stmt.excluded.title, "categories": stmt.excluded.categories, "updated_at": now}))

    def item_facts(self, dataset_id: int, item_id: str) -> ItemFacts | None:
        row = self.session.execute(select(Item.categories, Item.features).where(
            Item.dataset_id == dataset_id, Item.external_id == item_id)).first()
        return None if row is None else ItemFacts(list(row[0] or []), dict(row[1] or {}))

    def upsert_item(self, dataset_id: int, item_id: str, values: dict[str, Any], now: datetime) -> None:
        stmt = insert_for(self.session, Item.__table__).values(
            dataset_id=dataset_id, external_id=item_id, created_at=now, **values)
        self.session.execute(stmt.on_conflict_do_update(index_elements=["dataset_id", "external_id"], set_=values))

    def get_item(self, dataset_id: int, item_id: str) -> Item | None:
        return self.session.scalar(select(Item).where(Item.dataset_id == dataset_id, Item.external_id == item_id))

    def items_page(self, dataset_id: int, offset: int, limit: int) -> tuple[int, list[Item]]:
        total = self.session.scalar(select(func.count()).select_from(Item).where(Item.dataset_id == dataset_id)) or 0
        rows = self.session.scalars(select(Item).where(Item.dataset_id == dataset_id)
                                    .order_by(Item.external_id).offset(offset).limit(limit)).all()
        return int(total), list(rows)

    def model_item_rows(self, dataset_id: int) -> Iterable[tuple[int, str]]:
        return self.session.execute(select(Item.id, Item.external_id).where(Item.dataset_id == dataset_id))

    def items_carrying_a_fact(self, dataset_id: int) -> Iterable[tuple[str, Any, bool]]:
        carries_a_fact = or_(~Item.active, cast(Item.categories, String) != "[]")
        return self.session.execute(select(Item.external_id, Item.categories, Item.active).where(
            Item.dataset_id == dataset_id, carries_a_fact))


_PG_ITEM_IDS = text(
    "SELECT i.id, i.external_id FROM unnest(CAST(:ids AS text[])) AS t(e) "
    "JOIN items i ON i.dataset_id = :ds AND i.external_id = t.e"
)
_DRIVER_ITEM_IDS = driver_sql(_PG_ITEM_IDS)


class PostgresCatalogueStore(_SqlCatalogue):
    """PostgreSQL: many item ids in one statement (an array parameter, the driver's cursor: plain
    tuples, no ``Row`` objects for 10,000 rows); data sets row-locked on request."""

    def _lockable(self, stmt: Any, lock: DatasetLock | None) -> Any:
        if lock is None:
            return stmt
        return stmt.with_for_update(read=lock == "share", key_share=lock == "share")

    def item_row_ids(self, dataset_id: int, external_ids: Sequence[str]) -> dict[str, int]:
        ids = sorted(set(external_ids))
        with driver_connection(self.session).cursor() as cursor:
            rows = cursor.execute(_DRIVER_ITEM_IDS, {"ds": dataset_id, "ids": pg_array(ids)}).fetchall()
        return {ext: iid for iid, ext in rows}


class SqliteCatalogueStore(_SqlCatalogue):
    """SQLite: ids in chunked IN lists; no row locks (one writer at a time)."""


_STORES: dict[str, type[_SqlCatalogue]] = {"postgresql": PostgresCatalogueStore, "sqlite": SqliteCatalogueStore}


def catalogue_store(session: Session) -> CatalogueStore:
    """The catalogue store of ``session``'s database (chosen by its dialect)."""
    return store_for(session, _STORES)
