"""Request/response bodies of the ingest routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, Field
from pydantic_core import to_json

from app.schemas.common import MAX_BATCH_ROWS, ExternalId, FiniteFloat, StrictModel, UtcDateTime

__all__ = [
    "RatingIn",
    "RatingRow",
    "RatingBatchIn",
    "RowResult",
    "RatingBatchOut",
    "RowResultDict",
    "RatingBatchResult",
    "RatingOut",
    "RatingWriteOut",
    "ItemIn",
    "ItemOut",
    "DeletedOut",
]


class RatingIn(StrictModel):
    rating: FiniteFloat = Field(description="Must lie inside the data set's rating range.")


class RatingRow(StrictModel):
    user_id: ExternalId
    item_id: ExternalId
    rating: FiniteFloat


class RatingBatchIn(StrictModel):
    ratings: list[RatingRow] = Field(
        min_length=1,
        json_schema_extra={"maxItems": MAX_BATCH_ROWS},
        description=f"At most {MAX_BATCH_ROWS:,} rows; more is refused with 413 and nothing is written. "
        "The batch is all-or-nothing: any invalid row (range, unknown item, duplicate pair) "
        "gives 422 with per-row errors and nothing is written.",
    )


class RowResult(BaseModel):
    index: int
    user_id: str
    item_id: str
    status: Literal["created", "updated", "error"]
    error: str | None = None


class RatingBatchOut(BaseModel):
    created: int
    updated: int
    results: list[RowResult]


class RowResultDict(TypedDict):
    """A :class:`RowResult` as the plain dict the batch path builds (same keys, same order)."""

    index: int
    user_id: str
    item_id: str
    status: Literal["created", "updated", "error"]
    error: str | None


@dataclass(frozen=True, slots=True)
class RatingBatchResult:
    """A batch's outcome, already typed by construction: serialised to :class:`RatingBatchOut`'s
    JSON without validating 10,000 row dicts again (pydantic-core encodes plain dicts)."""

    created: int
    updated: int
    results: list[RowResultDict]

    def to_json(self) -> bytes:
        """The body :class:`RatingBatchOut` would give, byte for byte (fields in the model's order)."""
        return to_json({"created": self.created, "updated": self.updated, "results": self.results})

    def to_model(self) -> RatingBatchOut:
        """The validated response model (tests, callers that want one)."""
        return RatingBatchOut.model_validate({"created": self.created, "updated": self.updated,
                                              "results": self.results})


class RatingOut(BaseModel):
    user_id: str
    item_id: str
    rating: float
    updated_at: UtcDateTime | None = None


class RatingWriteOut(RatingOut):
    status: Literal["created", "updated"]


FeatureValue = str | int | float | bool | list[str]


class ItemIn(StrictModel):
    """An item and its public features (never private data)."""

    title: str | None = Field(default=None, max_length=512)
    categories: list[str] = Field(default_factory=list, max_length=64,
                                  description="Public categories (used by the recommendation filter).")
    features: dict[str, FeatureValue] = Field(default_factory=dict, max_length=64,
                                              description="Other public features, e.g. tags, year.")
    active: bool = Field(default=True, description="Inactive items are never recommended.")


class ItemOut(BaseModel):
    item_id: str
    title: str | None
    categories: list[str]
    features: dict[str, Any]
    active: bool


class DeletedOut(BaseModel):
    deleted: int = Field(description="Number of ratings removed.")
    note: str | None = None
