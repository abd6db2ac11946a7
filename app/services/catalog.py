"""The public catalogue: data sets by name, items (create, update, list, bulk import).

Items come only from public input (this API, ``privrec import-items``), never from ratings or
votes, so the catalogue never reveals that someone rated an item. A new item, or new categories
or features (DP-CMF's public metadata), bumps the data set's ``ratings_version`` in the same
transaction. Functions never commit; the caller does, and then drops the serving catalogue cache
(:func:`app.services.serving.active.invalidate_catalog`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from app.db.dialect import CHUNK, chunks, driver_connection, driver_sql, insert_for, pg_array
from app.db.models import Dataset, Item, bump_ratings_version, utcnow
from app.db.session import is_postgres
from app.errors import InvalidItemId, UnknownDataset, UnknownItem
from app.schemas.common import Page
from app.schemas.ingest import ItemIn, ItemOut

__all__ = [
    "get_dataset",
    "DatasetRef",
    "dataset_ref",
    "unknown_dataset",
    "item_row_ids",
    "import_items",
    "upsert_item",
    "get_item",
    "list_items",
]


def get_dataset(session: Session, name: str) -> Dataset:
    """The data set called ``name`` (404 when unknown)."""
    ds = session.scalar(select(Dataset).where(Dataset.name == name))
    if ds is None:
        raise unknown_dataset(name)
    return ds


def unknown_dataset(name: str) -> UnknownDataset:
    return UnknownDataset(name)


class DatasetRef(NamedTuple):
    """What a rating write reads of its data set: the row id, the name and the rating range."""

    id: int
    name: str
    rating_min: float
    rating_max: float


def dataset_ref(session: Session, name: str) -> DatasetRef:
    """The data set called ``name`` as a :class:`DatasetRef` (404 when unknown)."""
    ds = get_dataset(session, name)
    return DatasetRef(ds.id, ds.name, ds.rating_min, ds.rating_max)


_PG_ITEM_IDS = text(
    "SELECT i.id, i.external_id FROM unnest(CAST(:ids AS text[])) AS t(e) "
    "JOIN items i ON i.dataset_id = :ds AND i.external_id = t.e"
)
_DRIVER_ITEM_IDS = driver_sql(_PG_ITEM_IDS)


def item_row_ids(session: Session, ds: Dataset | DatasetRef, external_ids: Sequence[str]) -> dict[str, int]:
    """External item id -> row id for the known items among ``external_ids``."""
    ids = sorted(set(external_ids))
    if is_postgres(session):
        with driver_connection(session).cursor() as cursor:  # plain tuples: no Row objects for 10,000 rows
            rows = cursor.execute(_DRIVER_ITEM_IDS, {"ds": ds.id, "ids": pg_array(ids)}).fetchall()  # one driver call
            return {ext: iid for iid, ext in rows}
    out: dict[str, int] = {}
    for part in chunks(ids, CHUNK):
        rows = session.execute(
            select(Item.id, Item.external_id).where(Item.dataset_id == ds.id, Item.external_id.in_(part))
        )
        out.update({ext: iid for iid, ext in rows})
    return out


def import_items(session: Session, *, dataset: str,
                 rows: Sequence[tuple[str, str | None, Sequence[str]]]) -> dict[str, int]:
    """Bulk upsert of public catalogue items ``(item id, title or None, categories)`` (CLI
    ``import-items``): titles and categories are replaced, features kept. Returns
    {"created": n, "updated": n}. A repeated id in ``rows``: the last one wins."""
    ds = get_dataset(session, dataset)
    last = {str(item_id): (title, list(categories)) for item_id, title, categories in rows}
    for item_id in last:
        if not 0 < len(item_id) <= 128:
            raise InvalidItemId("item ids must have 1 to 128 characters; nothing was written",
                                details={"item_id": item_id[:200]})
    known = item_row_ids(session, ds, list(last))
    now = utcnow()
    ids = sorted(last)
    for part in chunks(ids, CHUNK // 2):
        stmt = insert_for(session, Item.__table__).values(
            [{"dataset_id": ds.id, "external_id": e, "title": last[e][0], "categories": last[e][1], "features": {},
              "active": True, "created_at": now, "updated_at": now} for e in part])
        session.execute(stmt.on_conflict_do_update(
            index_elements=["dataset_id", "external_id"],
            set_={"title": stmt.excluded.title, "categories": stmt.excluded.categories, "updated_at": now}))
    if ids:
        bump_ratings_version(session, ds.id, n=len(ids))
    created = sum(1 for e in ids if e not in known)
    return {"created": created, "updated": len(ids) - created}


def _item_out(item: Item) -> ItemOut:
    return ItemOut(item_id=item.external_id, title=item.title, categories=list(item.categories or []),
                   features=dict(item.features or {}), active=bool(item.active))


def upsert_item(session: Session, *, dataset: str, item_id: str, data: ItemIn) -> ItemOut:
    """Create or replace an item's title, categories, features and active flag.

    A new item, or new categories/features (DP-CMF's public metadata), bumps ``ratings_version``
    so that scheduled retraining notices it.
    """
    ds = get_dataset(session, dataset)
    now = utcnow()
    values = {"title": data.title, "categories": list(data.categories), "features": dict(data.features),
              "active": data.active, "updated_at": now}
    before = session.execute(select(Item.categories, Item.features).where(
        Item.dataset_id == ds.id, Item.external_id == item_id)).first()
    stmt = insert_for(session, Item.__table__).values(dataset_id=ds.id, external_id=item_id, created_at=now, **values)
    session.execute(stmt.on_conflict_do_update(index_elements=["dataset_id", "external_id"], set_=values))
    if before is None or (list(before[0] or []), dict(before[1] or {})) != (values["categories"], values["features"]):
        bump_ratings_version(session, ds.id, n=1)
    return ItemOut(item_id=item_id, title=data.title, categories=list(data.categories),
                   features=dict(data.features), active=data.active)


def get_item(session: Session, *, dataset: str, item_id: str) -> ItemOut:
    """One item (404 when unknown)."""
    ds = get_dataset(session, dataset)
    item = session.scalar(select(Item).where(Item.dataset_id == ds.id, Item.external_id == item_id))
    if item is None:
        raise UnknownItem(f"unknown item {item_id!r}", details={"item_id": item_id})
    return _item_out(item)


def list_items(session: Session, *, dataset: str, offset: int, limit: int) -> Page[ItemOut]:
    """One page of the catalogue, ordered by item id."""
    ds = get_dataset(session, dataset)
    total = session.scalar(select(func.count()).select_from(Item).where(Item.dataset_id == ds.id)) or 0
    rows = session.scalars(select(Item).where(Item.dataset_id == ds.id)
                           .order_by(Item.external_id).offset(offset).limit(limit)).all()
    return Page[ItemOut].build([_item_out(r) for r in rows], total=int(total), offset=offset, limit=limit)
