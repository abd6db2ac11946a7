"""Public data (DP-CMF): a user's own choice to make their ratings public, the public users and consent
audit trail (admin), public item-item similarity sources (admin)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from app.api.deps import AdminPrincipal, CurrentPrincipal, PageQ, SessionDep, SettingsDep, WriteSessionDep, require_user_access
from app.api.params import DatasetP, ItemP, UserP
from app.auth import Principal
from app.errors import OwnUserRequired, WrongSubject
from app.schemas.common import Page
from app.schemas.public_data import (
    REVOKE_NOTE,
    ConsentEventOut,
    NeighbourBatchIn,
    NeighbourBatchOut,
    NeighboursOut,
    PublicRatingsIn,
    PublicRatingsOut,
    PublicUserOut,
    SimilaritySourceIn,
    SimilaritySourceOut,
)
from app.services import public_data as public_data_svc

router = APIRouter()

SourceP = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$",
                              description="Similarity source name, unique per data set.")]


CONSENT_DOC = (
    "Only the user's own user token may change this choice: service and admin tokens get 403, so "
    "nobody can make a user's ratings public on their behalf. While `public` is true, the user's "
    "ratings of this data set are public data for DP-CMF trainings (rows of the public matrix) and "
    "are left out of every private statistic. Every change is recorded in an audit trail (who, "
    "when, to what). " + REVOKE_NOTE
)


def _require_own_user(principal: Principal, user_id: str) -> None:
    """403 unless the caller is the user themself (a user token whose subject is ``user_id``)."""
    if principal.kind != "user":
        raise OwnUserRequired(
            "only the user's own token may make their ratings public or private: the choice is the "
            f"user's alone, so {principal.kind} tokens cannot set it")
    if principal.subject != user_id:
        raise WrongSubject("the token may not set another user's choice")


@router.put("/datasets/{dataset}/users/{user_id}/public-ratings", tags=["privileged"], response_model=PublicRatingsOut,
            summary="Make my ratings public (or private again); own user token only",
            description=CONSENT_DOC)
def put_public_ratings(dataset: DatasetP, user_id: UserP, body: PublicRatingsIn, principal: CurrentPrincipal,
                       session: WriteSessionDep) -> PublicRatingsOut:
    _require_own_user(principal, user_id)
    return public_data_svc.set_public_ratings(session, dataset=dataset, user_id=user_id, public=body.public,
                                 actor=f"user:{principal.subject}")


@router.get("/datasets/{dataset}/users/{user_id}/public-ratings", tags=["privileged"], response_model=PublicRatingsOut,
            summary="Whether my ratings are public (false when never set)")
def get_public_ratings(dataset: DatasetP, user_id: UserP, principal: CurrentPrincipal,
                       session: SessionDep) -> PublicRatingsOut:
    require_user_access(principal, user_id)
    return public_data_svc.get_public_ratings(session, dataset=dataset, user_id=user_id)


@router.get("/admin/datasets/{dataset}/public-users", tags=["admin"], response_model=Page[PublicUserOut],
                  summary="Users whose ratings are public (by their own choice)")
def list_public_users(dataset: DatasetP, _: AdminPrincipal, session: SessionDep, page: PageQ) -> Page[PublicUserOut]:
    return public_data_svc.public_users_page(session, dataset=dataset, offset=page.offset, limit=page.limit)


@router.get("/admin/datasets/{dataset}/public-ratings/events", tags=["admin"], response_model=Page[ConsentEventOut],
                  summary="Audit trail of public-ratings choices (oldest first)")
def list_consent_events(dataset: DatasetP, _: AdminPrincipal, session: SessionDep, page: PageQ,
                        user_id: Annotated[str | None, Query(max_length=128, description="Only this user.")] = None,
                        ) -> Page[ConsentEventOut]:
    return public_data_svc.consent_events_page(session, dataset=dataset, offset=page.offset, limit=page.limit, user_id=user_id)


@router.put("/admin/datasets/{dataset}/similarity-sources/{source}", tags=["admin"], response_model=SimilaritySourceOut,
                  responses={201: {"model": SimilaritySourceOut, "description": "Created"}},
                  summary="Create a public similarity source (or update its provenance)",
                  description="The source must declare that it is public (`declared_public: true`) and give a "
                  "non-empty `provenance` (URL or citation); 422 otherwise. Similarities computed from this "
                  "service's ratings are private data and must not be uploaded.")
def put_similarity_source(dataset: DatasetP, source: SourceP, body: SimilaritySourceIn, admin: AdminPrincipal,
                          session: WriteSessionDep, response: Response) -> SimilaritySourceOut:
    out, created = public_data_svc.put_similarity_source(session, dataset=dataset, name=source, provenance=body.provenance,
                                             declared_public=body.declared_public, actor=f"admin:{admin.subject}")
    response.status_code = 201 if created else 200
    return out


@router.get("/admin/datasets/{dataset}/similarity-sources", tags=["admin"], response_model=Page[SimilaritySourceOut],
                  summary="Public similarity sources")
def list_similarity_sources(dataset: DatasetP, _: AdminPrincipal, session: SessionDep,
                            page: PageQ) -> Page[SimilaritySourceOut]:
    return public_data_svc.similarity_sources_page(session, dataset=dataset, offset=page.offset, limit=page.limit)


@router.get("/admin/datasets/{dataset}/similarity-sources/{source}", tags=["admin"], response_model=SimilaritySourceOut,
                  summary="One similarity source with its counts")
def get_similarity_source(dataset: DatasetP, source: SourceP, _: AdminPrincipal,
                          session: SessionDep) -> SimilaritySourceOut:
    return public_data_svc.get_similarity_source(session, dataset=dataset, name=source)


@router.delete("/admin/datasets/{dataset}/similarity-sources/{source}", tags=["admin"], status_code=204,
                     summary="Delete a similarity source and its neighbour lists")
def delete_similarity_source(dataset: DatasetP, source: SourceP, _: AdminPrincipal, session: WriteSessionDep) -> Response:
    public_data_svc.delete_similarity_source(session, dataset=dataset, name=source)
    return Response(status_code=204)


@router.post("/admin/datasets/{dataset}/similarity-sources/{source}/neighbours", tags=["admin"], response_model=NeighbourBatchOut,
                   summary="Replace items' top-K neighbour lists, all or nothing")
def post_neighbours(dataset: DatasetP, source: SourceP, body: NeighbourBatchIn, _: AdminPrincipal,
                    session: WriteSessionDep, settings: SettingsDep) -> NeighbourBatchOut:
    rows = [(r.item_id, [(n.item_id, n.score) for n in r.neighbours]) for r in body.rows]
    return public_data_svc.replace_neighbours(session, dataset=dataset, source=source, rows=rows,
                                              max_rows=settings.max_batch_size)


@router.get("/admin/datasets/{dataset}/similarity-sources/{source}/neighbours/{item_id}", tags=["admin"],
                  response_model=NeighboursOut, summary="One item's neighbour list in a source")
def get_neighbours(dataset: DatasetP, source: SourceP, item_id: ItemP, _: AdminPrincipal,
                   session: SessionDep) -> NeighboursOut:
    return public_data_svc.item_neighbours(session, dataset=dataset, source=source, item_id=item_id)
