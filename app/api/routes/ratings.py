"""Ratings: upsert one or a batch, delete one (the user or an ingest service); read one's own."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, Response

from app.api.deps import (
    CurrentPrincipal,
    PageQ,
    SessionDep,
    SettingsDep,
    WriteSessionDep,
    require_batch_within,
    require_ingest_access,
    require_user_access,
)
from app.api.params import DatasetP, ItemP, UserP
from app.schemas.common import Page
from app.schemas.ingest import (
    DeletedOut,
    RatingBatchIn,
    RatingBatchOut,
    RatingColumns,
    RatingIn,
    RatingOut,
    RatingRow,
    RatingWriteOut,
)
from app.services import ingest as ingest_svc

router = APIRouter()


@router.put("/datasets/{dataset}/users/{user_id}/ratings/{item_id}", tags=["ingest"], response_model=RatingWriteOut,
            summary="Upsert one rating (idempotent)",
            description="201 when the rating was created, 200 when an existing rating was updated.",
            status_code=200, responses={201: {"model": RatingWriteOut, "description": "The rating was created."}})
def put_rating(dataset: DatasetP, user_id: UserP, item_id: ItemP, body: RatingIn,
               principal: CurrentPrincipal, session: WriteSessionDep, response: Response) -> RatingWriteOut:
    require_ingest_access(principal, user_id)
    out = ingest_svc.upsert_rating(session, dataset=dataset, user_id=user_id, item_id=item_id,
                                   rating=body.rating)
    response.status_code = 201 if out.status == "created" else 200
    return out


@router.post("/datasets/{dataset}/ratings/batch", tags=["ingest"], response_model=RatingBatchOut,
             summary="Upsert up to 10,000 ratings, all or nothing, with a result per row")
def post_ratings_batch(dataset: DatasetP, body: RatingBatchIn, principal: CurrentPrincipal,
                       session: WriteSessionDep, settings: SettingsDep) -> Response:
    rows: Sequence[RatingRow] = body.ratings  # RatingColumns when every row is plain
    require_batch_within(len(rows), settings)
    for user in set(rows.user_ids if isinstance(rows, RatingColumns) else [r.user_id for r in rows]):
        require_ingest_access(principal, user)
    out = ingest_svc.upsert_ratings_batch(session, dataset=dataset, rows=rows)
    # encoded here from the typed result: a returned model would be validated again (10,000 rows)
    return Response(content=out.to_json(), media_type="application/json")


@router.delete("/datasets/{dataset}/users/{user_id}/ratings/{item_id}", tags=["ingest"], response_model=DeletedOut,
               summary="Delete one rating")
def delete_rating(dataset: DatasetP, user_id: UserP, item_id: ItemP, principal: CurrentPrincipal,
                  session: WriteSessionDep) -> DeletedOut:
    require_ingest_access(principal, user_id)
    n = ingest_svc.delete_rating(session, dataset=dataset, user_id=user_id, item_id=item_id)
    return DeletedOut(deleted=n)


@router.get("/datasets/{dataset}/users/{user_id}/ratings", tags=["privileged"], response_model=Page[RatingOut],
            summary="The user's own ratings")
def list_user_ratings(dataset: DatasetP, user_id: UserP, principal: CurrentPrincipal,
                      session: SessionDep, page: PageQ) -> Page[RatingOut]:
    require_user_access(principal, user_id)
    return ingest_svc.list_user_ratings(session, dataset=dataset, user_id=user_id,
                                        offset=page.offset, limit=page.limit)
