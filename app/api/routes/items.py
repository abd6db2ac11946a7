"""The public item catalogue: list and read (anyone), create or update (item writers)."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter

from app.api.deps import CurrentPrincipal, PageQ, SessionDep, WriteSessionDep, require_item_writer
from app.api.params import DatasetP, ItemP
from app.schemas.common import Page
from app.schemas.ingest import ItemIn, ItemOut
from app.services import catalog
from app.services.serving.catalogue_cache import invalidate_catalog
from app.services.unit_of_work import after_commit

router = APIRouter()


@router.get("/datasets/{dataset}/items", tags=["public"], response_model=Page[ItemOut], summary="List items")
def list_items(dataset: DatasetP, session: SessionDep, page: PageQ) -> Page[ItemOut]:
    return catalog.list_items(session, dataset=dataset, offset=page.offset, limit=page.limit)


@router.get("/datasets/{dataset}/items/{item_id}", tags=["public"], response_model=ItemOut, summary="One item")
def get_item(dataset: DatasetP, item_id: ItemP, session: SessionDep) -> ItemOut:
    return catalog.get_item(session, dataset=dataset, item_id=item_id)


@router.put("/datasets/{dataset}/items/{item_id}", tags=["ingest"], response_model=ItemOut,
            summary="Create or update an item and its public features")
def put_item(dataset: DatasetP, item_id: ItemP, body: ItemIn, principal: CurrentPrincipal,
             session: WriteSessionDep) -> ItemOut:
    require_item_writer(principal)
    out = catalog.upsert_item(session, dataset=dataset, item_id=item_id, data=body)
    after_commit(session, partial(invalidate_catalog, dataset))
    return out
