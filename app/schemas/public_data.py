"""Bodies of the public-data routes (DP-CMF, docs/algorithms.md §3): similarity sources and their neighbour
lists, and users' consent to make their ratings public."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StringConstraints

from app.schemas.common import NO_NUL_PATTERN, ExternalId, FiniteFloat, StrictModel, UtcDateTime

__all__ = [
    "MAX_NEIGHBOURS",
    "MAX_PAIRS_PER_BATCH",
    "REVOKE_NOTE",
    "SimilaritySourceIn",
    "SimilaritySourceOut",
    "Neighbour",
    "NeighbourRow",
    "NeighbourBatchIn",
    "NeighbourRowError",
    "NeighbourBatchOut",
    "NeighboursOut",
    "PublicRatingsIn",
    "PublicRatingsOut",
    "PublicUserOut",
    "ConsentEventOut",
]

MAX_NEIGHBOURS = 200  # K: the longest top-K list one item may have per source
MAX_PAIRS_PER_BATCH = 100_000  # (item, neighbour) pairs in one upload

REVOKE_NOTE = (
    "Revoking (public=false) stops future trainings from using these ratings as public data; from "
    "then on they are private ratings like any other. It cannot recall models already published "
    "while the ratings were public."
)

Provenance = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=2000, pattern=NO_NUL_PATTERN)]


class SimilaritySourceIn(StrictModel):
    """A public source of item-item similarities (never derived from private users' ratings)."""

    provenance: Provenance = Field(
        description="Where the similarities come from: a URL or a citation (required, non-empty).")
    declared_public: Literal[True] = Field(
        description="Must be `true`: the caller declares that the similarities are public data, "
        "not computed from this service's (private) ratings.")


class SimilaritySourceOut(BaseModel):
    name: str
    provenance: str
    declared_public: bool
    created_by: str
    created_at: UtcDateTime
    updated_at: UtcDateTime
    n_items: int = Field(description="Items with a neighbour list in this source.")
    n_pairs: int = Field(description="(item, neighbour) pairs stored.")


class Neighbour(StrictModel):
    item_id: ExternalId
    score: FiniteFloat = Field(description="Public similarity score (finite).")


class NeighbourRow(StrictModel):
    item_id: ExternalId
    neighbours: list[Neighbour] = Field(
        max_length=MAX_NEIGHBOURS,
        description=f"The item's top-K list (K <= {MAX_NEIGHBOURS}); replaces the stored list of this item "
        "in this source; an empty list clears it. No self pairs, no repeated neighbour.")


class NeighbourBatchIn(StrictModel):
    rows: list[NeighbourRow] = Field(
        min_length=1,
        description="One row per item, all or nothing: any invalid row (unknown item or neighbour, self "
        "or repeated neighbour, repeated item) gives 422 with per-row errors and nothing is written. "
        f"At most the ingest batch size of rows and {MAX_PAIRS_PER_BATCH:,} pairs (413 otherwise).")


class NeighbourRowError(BaseModel):
    index: int
    item_id: str
    error: str


class NeighbourBatchOut(BaseModel):
    source: str
    items: int = Field(description="Items whose list was replaced.")
    pairs_written: int
    pairs_removed: int = Field(description="Pairs of the replaced lists that were removed first.")


class NeighboursOut(BaseModel):
    source: str
    item_id: str
    neighbours: list[Neighbour]


class PublicRatingsIn(StrictModel):
    public: bool = Field(strict=True, description=(
        "A JSON boolean (1, \"yes\" etc. are refused). true: my ratings of this data set may be used as public data. "
        + REVOKE_NOTE))


class PublicRatingsOut(BaseModel):
    dataset: str
    user_id: str
    public: bool
    changed: bool = Field(description="Whether this request changed the stored choice (audited).")
    updated_at: UtcDateTime | None
    note: str = REVOKE_NOTE


class PublicUserOut(BaseModel):
    user_id: str
    public: bool
    updated_at: UtcDateTime


class ConsentEventOut(BaseModel):
    id: int
    user_id: str
    public: bool
    actor: str
    created_at: UtcDateTime
