"""The public catalogue: data sets by name, items (create, update, list, bulk import).

Items come only from public input (this API, ``privrec import-items``), never from ratings or
votes, so the catalogue never reveals that someone rated an item. A new item, or new categories
or features (DP-CMF's public metadata), bumps the data set's ``ratings_version`` in the same
transaction. Functions never commit; the caller does, and then drops the serving catalogue cache
(:func:`app.services.serving.catalogue_cache.invalidate_catalog`). Storage is the catalogue
store's (:mod:`app.db.stores.catalogue`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from app.core.privacy.blocks import USER_PERIOD
from app.db.models import Dataset, Item, utcnow
from app.db.stores import catalogue_store
from app.errors import InvalidItemId, PrivacyUnitNotSupported, UnknownItem
from app.schemas.common import Page
from app.schemas.ingest import ItemIn, ItemOut

__all__ = [
    "refuse_votes_per_period",
    "get_dataset",
    "item_row_ids",
    "import_items",
    "upsert_item",
    "put_item",
    "get_item",
    "list_items",
]


def get_dataset(session: Session, name: str) -> Dataset:
    """The data set called ``name`` (404 when unknown)."""
    return catalogue_store(session).get_dataset(name)


def item_row_ids(session: Session, ds: Dataset, external_ids: Sequence[str]) -> dict[str, int]:
    """External item id -> row id for the known items of ``ds`` among ``external_ids``."""
    return catalogue_store(session).item_row_ids(ds.id, external_ids)


def import_items(session: Session, *, dataset: str,
                 rows: Sequence[tuple[str, str | None, Sequence[str]]]) -> dict[str, int]:
    """Bulk upsert of public catalogue items ``(item id, title or None, categories)`` (CLI
    ``import-items``): titles and categories are replaced, features kept. Returns
    {"created": n, "updated": n}. A repeated id in ``rows``: the last one wins."""
    store = catalogue_store(session)
    ds = store.get_dataset(dataset)
    last = {str(item_id): (title, list(categories)) for item_id, title, categories in rows}
    for item_id in last:
        if not 0 < len(item_id) <= 128:
            raise InvalidItemId("item ids must have 1 to 128 characters; nothing was written",
                                details={"item_id": item_id[:200]})
    known = store.item_row_ids(ds.id, list(last))
    store.upsert_items(ds.id, last, utcnow())
    if last:
        store.bump_version(ds.id, n=len(last))
    created = sum(1 for e in last if e not in known)
    return {"created": created, "updated": len(last) - created}


def _item_out(item: Item) -> ItemOut:
    return ItemOut(item_id=item.external_id, title=item.title, categories=list(item.categories or []),
                   features=dict(item.features or {}), active=bool(item.active))


def upsert_item(session: Session, *, dataset: str, item_id: str, data: ItemIn) -> ItemOut:
    """Create or replace an item's title, categories, features and active flag (:func:`put_item`)."""
    return put_item(session, dataset=dataset, item_id=item_id, data=data)[0]


def put_item(session: Session, *, dataset: str, item_id: str, data: ItemIn) -> tuple[ItemOut, bool]:
    """Create or replace an item's title, categories, features and active flag; ``(item, created)``.

    A new item, or new categories/features (DP-CMF's public metadata), bumps ``ratings_version``
    so that scheduled retraining notices it.
    """
    store = catalogue_store(session)
    ds = store.get_dataset(dataset)
    now = utcnow()
    values = {"title": data.title, "categories": list(data.categories), "features": dict(data.features),
              "active": data.active, "updated_at": now}
    before = store.item_facts(ds.id, item_id)
    store.upsert_item(ds.id, item_id, values, now)
    if before is None or (before.categories, before.features) != (values["categories"], values["features"]):
        store.bump_version(ds.id, n=1)
    return ItemOut(item_id=item_id, title=data.title, categories=list(data.categories),
                   features=dict(data.features), active=data.active), before is None


def get_item(session: Session, *, dataset: str, item_id: str) -> ItemOut:
    """One item (404 when unknown)."""
    store = catalogue_store(session)
    item = store.get_item(store.get_dataset(dataset).id, item_id)
    if item is None:
        raise UnknownItem(f"unknown item {item_id!r}", details={"item_id": item_id})
    return _item_out(item)


def list_items(session: Session, *, dataset: str, offset: int, limit: int) -> Page[ItemOut]:
    """One page of the catalogue, ordered by item id."""
    store = catalogue_store(session)
    total, rows = store.items_page(store.get_dataset(dataset).id, offset, limit)
    return Page[ItemOut].build([_item_out(r) for r in rows], total=total, offset=offset, limit=limit)


def refuse_votes_per_period(ds_name: str, privacy_unit: str) -> None:
    """422 ``privacy_unit_not_supported`` for votes (a votes kind, vote settings, a run on votes) on a
    ``user_period`` data set. Votes are accounted per user: their allowance (``votes_per_user_cap``)
    and the guarantee given at ingestion cover a user's whole life, and what a later period stores
    depends on how much of the allowance earlier periods used, so one (user, period) is not a unit
    of vote data."""
    if privacy_unit == USER_PERIOD:
        raise PrivacyUnitNotSupported(
            f"data set {ds_name!r}: votes are accounted per user (a lifetime allowance and a local guarantee "
            "per user); the user_period unit applies to ratings only", dataset=ds_name, privacy_unit=privacy_unit)
