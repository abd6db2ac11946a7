"""Users: delete a user and all of their ratings."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import CurrentPrincipal, WriteSessionDep, require_ingest_access
from app.api.params import UserP
from app.schemas.ingest import DeletedOut
from app.services import ingest as ingest_svc

router = APIRouter()

DELETE_USER_NOTE = (
    "The user's ratings are gone from the database. Models published before this deletion keep "
    "the user's DP-bounded influence (at most the ledger's epsilon) until the next retrain "
    "publishes a new model."
)


@router.delete("/users/{user_id}", tags=["ingest"], response_model=DeletedOut,
               summary="Delete a user and all of their ratings in every data set",
               description=DELETE_USER_NOTE)
def delete_user(user_id: UserP, principal: CurrentPrincipal, session: WriteSessionDep) -> DeletedOut:
    require_ingest_access(principal, user_id)
    n = ingest_svc.delete_user(session, user_id=user_id)
    return DeletedOut(deleted=n, note=DELETE_USER_NOTE)
