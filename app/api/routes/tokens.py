"""Token revocation: an admin cuts off a leaked bearer token or dashboard session by its id,
without rotating the signing secret."""

from __future__ import annotations

import time
from functools import partial

from fastapi import APIRouter, Request, Response

from app.api.deps import AdminPrincipal, WriteSessionDep, revocation_list
from app.auth import REVOCATION_REFRESH_S, TokenError, revocation_target
from app.config import Settings
from app.errors import ValidationFailed
from app.schemas.tokens import RevocationIn, RevocationOut
from app.services import revocations
from app.services.unit_of_work import after_commit

router = APIRouter()

REVOKE_DESCRIPTION = (
    "Adds the token's id (`jti`) to the revocation list until the token expires. Send the token "
    "itself (its signature is checked; a dashboard session cookie's value works too) or only its "
    "`token_id`, which is then held for the longest token lifetime (`MAX_TOKEN_TTL_S`). Every API "
    f"process refuses the token with 401 `token_revoked` within {REVOCATION_REFRESH_S:g} seconds "
    "(this one at once). 201 when newly revoked, 200 when it already was. Entries of expired tokens "
    "are pruned."
)


@router.post("/admin/tokens/revocations", tags=["admin"], response_model=RevocationOut, status_code=201,
             responses={200: {"model": RevocationOut, "description": "The token was already revoked."}},
             summary="Revoke a bearer token or dashboard session", description=REVOKE_DESCRIPTION)
def revoke_token(request: Request, body: RevocationIn, admin: AdminPrincipal, session: WriteSessionDep,
                 response: Response) -> RevocationOut:
    token_id, expires_at = _target(body, request.app.state.settings)
    row, created = revocations.revoke(session, token_id=token_id, expires_at=expires_at,
                                      actor=f"admin:{admin.subject}", reason=body.reason)
    after_commit(session, partial(revocation_list(request.app).add, token_id))
    response.status_code = 201 if created else 200
    return RevocationOut(token_id=row.jti, expires_at=revocations.expiry_of(row), revoked_at=row.revoked_at,
                         actor=row.actor, reason=row.reason, status="revoked" if created else "already_revoked")


def _target(body: RevocationIn, settings: Settings) -> tuple[str, int]:
    """(jti, exp) of the token the body names; 422 for a token this service did not sign."""
    if body.token is None:  # the body's validator requires token_id then
        return str(body.token_id), int(time.time()) + settings.max_token_ttl_s
    try:
        return revocation_target(body.token, secret=settings.secret_key, algorithm=settings.jwt_algorithm,
                                 max_lifetime_s=settings.max_token_ttl_s)
    except TokenError:
        raise ValidationFailed("request validation failed; nothing was written", details=[
            {"loc": ["body", "token"], "msg": "not a token this service signed", "type": "value_error"}]) from None
