"""The public item catalogue: list and read (anyone), create or update (item writers)."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Response

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
            summary="Create or update an item and its public features",
            description="201 when the item was created, 200 when an existing item was updated.",
            status_code=200, responses={201: {"model": ItemOut, "description": "The item was created."}})
def put_item(dataset: DatasetP, item_id: ItemP, body: ItemIn, principal: CurrentPrincipal,
             session: WriteSessionDep, response: Response) -> ItemOut:
    require_item_writer(principal)
    out, created = catalog.put_item(session, dataset=dataset, item_id=item_id, data=body)
    after_commit(session, partial(invalidate_catalog, dataset))
    response.status_code = 201 if created else 200
    return out
