"""Ingest routes: ratings (single, batch, delete), users (delete), items (create/update)."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Response

from app.api.deps import (CurrentPrincipal, SettingsDep, WriteSessionDep, require_batch_within, require_ingest_access,
                          require_item_writer)
from app.api.params import DatasetP, ItemP, UserP
from app.schemas.ingest import (DeletedOut, ItemIn, ItemOut, RatingBatchIn, RatingBatchOut,
                                RatingIn, RatingWriteOut)
from app.services import catalog
from app.services import ingest as svc
from app.services.serving.active import invalidate_catalog
from app.services.unit_of_work import after_commit

router = APIRouter(tags=["ingest"])

DELETE_USER_NOTE = (
    "The user's ratings are gone from the database. Models published before this deletion keep "
    "the user's DP-bounded influence (at most the ledger's epsilon) until the next retrain "
    "publishes a new model."
)


@router.put("/datasets/{dataset}/users/{user_id}/ratings/{item_id}", response_model=RatingWriteOut,
            summary="Upsert one rating (idempotent)")
def put_rating(dataset: DatasetP, user_id: UserP, item_id: ItemP, body: RatingIn,
               principal: CurrentPrincipal, session: WriteSessionDep) -> RatingWriteOut:
    require_ingest_access(principal, user_id)
    return svc.upsert_rating(session, dataset=dataset, user_id=user_id, item_id=item_id,
                            rating=body.rating)


@router.post("/datasets/{dataset}/ratings/batch", response_model=RatingBatchOut,
             summary="Upsert up to 10,000 ratings, all or nothing, with a result per row")
def post_ratings_batch(dataset: DatasetP, body: RatingBatchIn, principal: CurrentPrincipal,
                       session: WriteSessionDep, settings: SettingsDep) -> Response:
    require_batch_within(len(body.ratings), settings)
    for user in {r.user_id for r in body.ratings}:
        require_ingest_access(principal, user)
    out = svc.upsert_ratings_batch(session, dataset=dataset, rows=body.ratings)
    # serialised once here: a returned model would be validated again against response_model
    return Response(content=out.model_dump_json(), media_type="application/json")


@router.delete("/datasets/{dataset}/users/{user_id}/ratings/{item_id}", response_model=DeletedOut,
               summary="Delete one rating")
def delete_rating(dataset: DatasetP, user_id: UserP, item_id: ItemP, principal: CurrentPrincipal,
                  session: WriteSessionDep) -> DeletedOut:
    require_ingest_access(principal, user_id)
    n = svc.delete_rating(session, dataset=dataset, user_id=user_id, item_id=item_id)
    return DeletedOut(deleted=n)


@router.delete("/users/{user_id}", response_model=DeletedOut,
               summary="Delete a user and all of their ratings in every data set",
               description=DELETE_USER_NOTE)
def delete_user(user_id: UserP, principal: CurrentPrincipal, session: WriteSessionDep) -> DeletedOut:
    require_ingest_access(principal, user_id)
    n = svc.delete_user(session, user_id=user_id)
    return DeletedOut(deleted=n, note=DELETE_USER_NOTE)


@router.put("/datasets/{dataset}/items/{item_id}", response_model=ItemOut,
            summary="Create or update an item and its public features")
def put_item(dataset: DatasetP, item_id: ItemP, body: ItemIn, principal: CurrentPrincipal,
             session: WriteSessionDep) -> ItemOut:
    require_item_writer(principal)
    out = catalog.upsert_item(session, dataset=dataset, item_id=item_id, data=body)
    after_commit(session, partial(invalidate_catalog, dataset))
    return out
