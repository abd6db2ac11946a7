"""Votes: thumbs up/down ingestion (single, batch, delete), the user's own votes, and the admin vote
settings (randomised response at ingestion)."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, Response

from app.api.deps import (
    AdminPrincipal,
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
from app.auth import Principal
from app.errors import ClientRandomisationForbidden
from app.schemas.common import Page
from app.schemas.votes import (
    VoteBatchIn,
    VoteBatchOut,
    VoteDeletedOut,
    VoteIn,
    VoteOut,
    VoteSettingsIn,
    VoteSettingsOut,
    VoteWriteOut,
)
from app.services import votes as votes_svc

router = APIRouter()

VOTE_DESCRIPTION = (
    "A vote is the integer 1 (thumbs up) or -1 (thumbs down). On a data set that randomises at "
    "ingestion (see the admin vote settings) the vote is randomised once on arrival (flipped with "
    "probability 1/(1+e^epsilon0)) and only the randomised bit is stored, never the raw vote; a "
    "client may randomise itself and send `randomised: true` with the data set's `local_epsilon` "
    "(with the user's own token only: a service token gets 403 and sends raw votes). "
    "A (user, item) that already holds a randomised bit keeps it (`status: unchanged`), and each "
    "user may be given at most `votes_per_user_cap` randomised bits ever (409 beyond). On a raw "
    "data set votes are idempotent upserts."
)


def _require_own_device_for_client_bits(principal: Principal, rows: Sequence[VoteIn]) -> None:
    """403 when a non-user token declares client-side randomisation.

    A bit declared as randomised by the client is stored as is and later trained on for free
    (post-processing of the local guarantee), so only the user's own device, holding the user's
    own token, may make that declaration; a service forwarding votes sends them raw and the
    server randomises them.
    """
    if principal.kind != "user" and any(r.randomised for r in rows):
        raise ClientRandomisationForbidden("only the user's own token may send a client-randomised vote; "
                                           "services send raw votes and the server randomises them")


@router.put("/datasets/{dataset}/users/{user_id}/votes/{item_id}", response_model=VoteWriteOut, tags=["ingest"],
            summary="Store one vote (thumbs up/down)",
            description=VOTE_DESCRIPTION + " 201 when the vote was created, 200 otherwise.",
            status_code=200, responses={201: {"model": VoteWriteOut, "description": "The vote was created."}})
def put_vote(dataset: DatasetP, user_id: UserP, item_id: ItemP, body: VoteIn, principal: CurrentPrincipal,
             session: WriteSessionDep, response: Response) -> VoteWriteOut:
    require_ingest_access(principal, user_id)
    _require_own_device_for_client_bits(principal, [body])
    out = votes_svc.upsert_vote(session, dataset=dataset, user_id=user_id, item_id=item_id, body=body)
    response.status_code = 201 if out.status == "created" else 200
    return out


@router.post("/datasets/{dataset}/votes/batch", response_model=VoteBatchOut, tags=["ingest"],
             summary="Store up to 10,000 votes, all or nothing, with a result per row",
             description=VOTE_DESCRIPTION)
def post_votes_batch(dataset: DatasetP, body: VoteBatchIn, principal: CurrentPrincipal, session: WriteSessionDep,
                     settings: SettingsDep) -> VoteBatchOut:
    require_batch_within(len(body.votes), settings)
    for user in {r.user_id for r in body.votes}:
        require_ingest_access(principal, user)
    _require_own_device_for_client_bits(principal, body.votes)
    return votes_svc.upsert_votes_batch(session, dataset=dataset, rows=body.votes)


@router.delete("/datasets/{dataset}/users/{user_id}/votes/{item_id}", response_model=VoteDeletedOut,
               tags=["ingest"], summary="Delete one vote", description=votes_svc.DELETE_NOTE)
def delete_vote(dataset: DatasetP, user_id: UserP, item_id: ItemP, principal: CurrentPrincipal,
                session: WriteSessionDep) -> VoteDeletedOut:
    require_ingest_access(principal, user_id)
    n = votes_svc.delete_vote(session, dataset=dataset, user_id=user_id, item_id=item_id)
    return VoteDeletedOut(deleted=n, note=votes_svc.DELETE_NOTE)


@router.get("/datasets/{dataset}/users/{user_id}/votes", response_model=Page[VoteOut], tags=["privileged"],
            summary="The user's own stored votes (randomised bits on a randomising data set)")
def list_user_votes(dataset: DatasetP, user_id: UserP, principal: CurrentPrincipal, session: SessionDep,
                    page: PageQ) -> Page[VoteOut]:
    require_user_access(principal, user_id)
    return votes_svc.list_user_votes(session, dataset=dataset, user_id=user_id, offset=page.offset, limit=page.limit)


@router.get("/admin/datasets/{dataset}/vote-settings", tags=["admin"], response_model=VoteSettingsOut,
                  summary="Vote settings: randomisation at ingestion and the per-user cap")
def get_vote_settings(dataset: DatasetP, _: AdminPrincipal, session: SessionDep) -> VoteSettingsOut:
    return votes_svc.get_vote_settings(session, dataset=dataset)


@router.put("/admin/datasets/{dataset}/vote-settings", tags=["admin"], response_model=VoteSettingsOut,
    summary="Set epsilon0 of randomised response at ingestion (null: raw votes) and the per-user cap",
    description=(
        "Only while the data set holds no vote and never gave out a randomised bit (409 "
        "`votes_exist` afterwards). Turning randomisation on needs `votes_per_user_cap` and records "
        "the local guarantee (cap x epsilon0 per user, randomised response) in the ledger once, "
        "checked against the budget cap (409 `budget_exceeded`); later trainings on the bits are "
        "post-processing. A guarantee recorded earlier stays charged (the ledger is append-only)."),
)
def put_vote_settings(dataset: DatasetP, body: VoteSettingsIn, admin: AdminPrincipal,
                      session: WriteSessionDep) -> VoteSettingsOut:
    return votes_svc.set_vote_settings(session, dataset=dataset, local_epsilon=body.local_epsilon,
                                votes_per_user_cap=body.votes_per_user_cap, actor=f"admin:{admin.subject}")
