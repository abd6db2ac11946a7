"""Request/response bodies of the vote routes (thumbs up/down) and of the vote settings."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, model_validator

from app.schemas.common import MAX_BATCH_ROWS, ExternalId, FiniteFloat, StrictModel, UtcDateTime

__all__ = [
    "MAX_VOTES_PER_USER_CAP",
    "VoteValue",
    "VoteIn",
    "VoteRow",
    "VoteBatchIn",
    "VoteWriteOut",
    "VoteRowResult",
    "VoteBatchOut",
    "VoteOut",
    "VoteDeletedOut",
    "VoteSettingsIn",
    "VoteSettingsOut",
]

MAX_VOTES_PER_USER_CAP = 100_000
MAX_LOCAL_EPSILON = 20.0  # flip probability ~2e-9 above this: randomisation would be a formality


def _sign(value: int) -> int:
    if value not in (1, -1):
        raise ValueError("a vote is the integer 1 (thumbs up) or -1 (thumbs down)")
    return value


VoteValue = Annotated[int, Field(strict=True, json_schema_extra={"enum": [1, -1]},
                                 description="1 (thumbs up) or -1 (thumbs down); "
                                 "booleans, floats, strings and 0 are refused."), AfterValidator(_sign)]


class VoteIn(StrictModel):
    vote: VoteValue
    randomised: bool = Field(default=False, strict=True, description=(
        "True when the client already applied randomised response to this vote (only on a data set "
        "that randomises at ingestion); it must then declare `local_epsilon`, equal to the data "
        "set's epsilon0, and the bit is stored as sent."))
    local_epsilon: FiniteFloat | None = Field(default=None, gt=0, description=(
        "The epsilon0 the client randomised with (only together with `randomised: true`)."))

    @model_validator(mode="after")
    def _declared(self) -> VoteIn:
        if self.randomised and self.local_epsilon is None:
            raise ValueError("a client-randomised vote must declare the local_epsilon it was randomised with")
        if not self.randomised and self.local_epsilon is not None:
            raise ValueError("local_epsilon is only given with randomised: true")
        return self


class VoteRow(VoteIn):
    user_id: ExternalId
    item_id: ExternalId


class VoteBatchIn(StrictModel):
    votes: list[VoteRow] = Field(
        min_length=1,
        json_schema_extra={"maxItems": MAX_BATCH_ROWS},
        description=f"At most {MAX_BATCH_ROWS:,} rows; more is refused with 413 and nothing is written. "
        "All or nothing: any invalid row (unknown item, repeated pair, wrong randomisation "
        "declaration) gives 422 with per-row errors, a user over the vote cap gives 409; either "
        "way nothing is written.",
    )


Status = Literal["created", "updated", "unchanged"]


class VoteWriteOut(BaseModel):
    user_id: str
    item_id: str
    status: Status = Field(description=(
        '"unchanged": the data set randomises at ingestion and this (user, item) already holds a '
        "randomised bit; it is never re-randomised or replaced (delete it first to vote afresh, "
        "which uses one more of the user's randomised votes)."))
    stored_vote: int = Field(description="The stored bit: the randomised one on a randomising data set.")
    randomised: bool
    randomised_by: Literal["server", "client"] | None = None
    local_epsilon: float | None = None


class VoteRowResult(BaseModel):
    index: int
    user_id: str
    item_id: str
    status: Literal["created", "updated", "unchanged", "error"]
    error: str | None = None


class VoteBatchOut(BaseModel):
    created: int
    updated: int
    unchanged: int
    results: list[VoteRowResult]


class VoteOut(BaseModel):
    item_id: str
    vote: int = Field(description="The stored bit (randomised when `randomised` is true).")
    randomised: bool
    randomised_by: Literal["server", "client"] | None = None
    local_epsilon: float | None = None
    updated_at: UtcDateTime | None = None


class VoteDeletedOut(BaseModel):
    deleted: int
    note: str | None = None


class VoteSettingsIn(StrictModel):
    local_epsilon: FiniteFloat | None = Field(default=None, gt=0, le=MAX_LOCAL_EPSILON, description=(
        "epsilon0 of randomised response at ingestion (each vote flipped once with probability "
        "1/(1+e^epsilon0)); null stores raw votes."))
    votes_per_user_cap: int | None = Field(default=None, strict=True, ge=1, le=MAX_VOTES_PER_USER_CAP, description=(
        "Most votes one user may hold (raw) or ever be given (randomised; deletes do not give any back). "
        "Required with local_epsilon: the user-level guarantee is cap x epsilon0."))

    @model_validator(mode="after")
    def _cap_given(self) -> VoteSettingsIn:
        if self.local_epsilon is not None and self.votes_per_user_cap is None:
            raise ValueError("randomisation at ingestion needs votes_per_user_cap (the user-level bound)")
        return self


class VoteSettingsOut(BaseModel):
    dataset: str
    local_epsilon: float | None
    votes_per_user_cap: int | None
    randomised_at_ingestion: bool
    flip_probability: float | None = Field(description="1/(1+e^epsilon0), null for raw votes.")
    user_level_epsilon: float | None = Field(description="cap x epsilon0: the local guarantee per user.")
    n_votes: int = Field(description=(
        "Private admin view: the exact number of stored votes (not differentially private; never publish it)."))
    local_ledger_seq: int | None = Field(default=None, description=(
        "Sequence number of the ledger entry recording the current local guarantee."))
