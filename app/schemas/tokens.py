"""Bodies of the token revocation route."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StringConstraints, model_validator

from app.schemas.common import StrictModel, Text, UtcDateTime

__all__ = ["RevocationIn", "RevocationOut", "MAX_TOKEN_LENGTH"]

MAX_TOKEN_LENGTH = 4096
TokenText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TOKEN_LENGTH, pattern=r"^[A-Za-z0-9_.\-]+$")]
TokenId = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]


class RevocationIn(StrictModel):
    """The token to cut off: the token itself (its signature is checked; it may be a dashboard
    session), or only its id (``jti``), which is then held for the longest token lifetime."""

    token: TokenText | None = Field(default=None, description="The leaked token (a signed JWT).")
    token_id: TokenId | None = Field(default=None, description="The token's `jti` claim.")
    reason: Annotated[Text, Field(max_length=500)] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> RevocationIn:
        if (self.token is None) == (self.token_id is None):
            raise ValueError("give exactly one of token or token_id")
        return self


class RevocationOut(BaseModel):
    token_id: str
    expires_at: UtcDateTime = Field(description="When the token expires; the entry may be pruned after it.")
    revoked_at: UtcDateTime
    actor: str
    reason: str | None
    status: Literal["revoked", "already_revoked"]
