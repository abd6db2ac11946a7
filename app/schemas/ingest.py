"""Request/response bodies of the ingest routes."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Annotated, Any, Literal, TypedDict, overload

from pydantic import BaseModel, Field, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import to_json

from app.schemas.common import MAX_BATCH_ROWS, ExternalId, FiniteFloat, Label, StrictModel, Text, UtcDateTime, ids_valid

__all__ = [
    "RatingIn",
    "RatingRow",
    "RatingColumns",
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


class RatingColumns(Sequence[RatingRow]):
    """Valid batch rows held as three columns (what the batch service reads), not 10,000 models:
    :func:`plain_rows` builds it only for rows that :class:`RatingRow` accepts unchanged."""

    __slots__ = ("user_ids", "item_ids", "ratings")

    def __init__(self, user_ids: list[str], item_ids: list[str], ratings: list[float]) -> None:
        self.user_ids, self.item_ids, self.ratings = user_ids, item_ids, ratings

    def __len__(self) -> int:
        return len(self.user_ids)

    @overload
    def __getitem__(self, k: int) -> RatingRow: ...

    @overload
    def __getitem__(self, k: slice) -> Sequence[RatingRow]: ...

    def __getitem__(self, k: int | slice) -> RatingRow | Sequence[RatingRow]:
        if isinstance(k, slice):
            return RatingColumns(self.user_ids[k], self.item_ids[k], self.ratings[k])
        return RatingRow.model_construct(user_id=self.user_ids[k], item_id=self.item_ids[k], rating=self.ratings[k])

    def __iter__(self) -> Iterator[RatingRow]:
        return (self[k] for k in range(len(self)))


_EXACT_INT = 2**53  # larger integers may not be floats exactly: left to the model
_ROW_KEYS = (itemgetter("user_id"), itemgetter("item_id"), itemgetter("rating"))


def plain_rows(value: Any) -> RatingColumns | None:
    """``value`` as columns when it is a non-empty list of rows that :class:`RatingRow` would
    accept unchanged (exactly its three keys, string ids of the allowed form, finite JSON
    numbers); None otherwise, and the model then validates the rows one by one (its errors are
    the API's per-row report). Checked column-wise: a few C-level passes instead of 10,000
    model validations."""
    if type(value) is not list or not value or set(map(type, value)) != {dict} or set(map(len, value)) != {3}:
        return None
    try:
        user_ids, item_ids, ratings = (list(map(key, value)) for key in _ROW_KEYS)
    except KeyError:
        return None
    if not (ids_valid(user_ids) and ids_valid(item_ids)):
        return None
    kinds = set(map(type, ratings))
    if int in kinds:  # JSON integers: the model takes them as floats
        if not kinds <= {int, float} or max(map(abs, ratings)) > _EXACT_INT:
            return None
        ratings = [float(r) for r in ratings]
    elif kinds != {float}:
        return None
    if not all(map(math.isfinite, ratings)):
        return None
    return RatingColumns(user_ids, item_ids, ratings)


def _plain_rows_first(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    columns = plain_rows(value)
    return handler(value) if columns is None else columns


class RatingBatchIn(StrictModel):
    # validated as ``list[RatingRow]`` (its schema and its errors), but plain rows arrive as
    # :class:`RatingColumns`: read ``ratings`` as a ``Sequence[RatingRow]``
    ratings: Annotated[list[RatingRow], WrapValidator(_plain_rows_first)] = Field(
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


MAX_FEATURES = 64
MAX_FEATURE_TEXT = 1024
INT64_MAX = 2**63 - 1
FeatureText = Annotated[Text, Field(max_length=MAX_FEATURE_TEXT)]
FeatureInt = Annotated[int, Field(strict=True, ge=-INT64_MAX, le=INT64_MAX)]
FeatureValue = FeatureText | FeatureInt | FiniteFloat | bool | Annotated[list[Label], Field(max_length=MAX_FEATURES)]


class ItemIn(StrictModel):
    """An item and its public features (never private data)."""

    title: Text | None = Field(default=None, max_length=512)
    categories: list[Label] = Field(default_factory=list, max_length=MAX_FEATURES, description=(
        "Public categories (used by the recommendation filter), each 1-128 characters."))
    features: dict[Label, FeatureValue] = Field(default_factory=dict, max_length=MAX_FEATURES, description=(
        "Other public features, e.g. tags, year: names of 1-128 characters; values a string (at most "
        "1,024 characters), a 64-bit integer, a finite number, a boolean or a list of at most 64 labels."))
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
