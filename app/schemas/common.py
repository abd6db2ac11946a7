"""Shared field types and the paging envelope."""

from __future__ import annotations

from typing import Annotated, Any, Generic, TypeVar

from datetime import datetime, timezone

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, WithJsonSchema

__all__ = [
    "ExternalId",
    "FiniteFloat",
    "ID_PATTERN",
    "UtcDateTime",
    "MAX_PAGE_SIZE",
    "MAX_OFFSET",
    "MAX_BATCH_ROWS",
    "Page",
    "StrictModel",
]

MAX_PAGE_SIZE = 1000
MAX_OFFSET = 10_000_000
MAX_BATCH_ROWS = 10_000


def _id_to_str(value: Any) -> Any:
    """Accept integer ids in JSON and treat them as their decimal string."""
    if isinstance(value, bool):
        return value  # rejected by the str constraint below
    if isinstance(value, int):
        return str(value)
    return value


ID_PATTERN = r"^[A-Za-z0-9_.:@\-]+$"

ExternalId = Annotated[
    str,
    BeforeValidator(_id_to_str),
    StringConstraints(min_length=1, max_length=128, pattern=ID_PATTERN),
    # stated explicitly: pydantic drops the pattern from the schema next to a BeforeValidator
    WithJsonSchema({"anyOf": [{"type": "string", "minLength": 1, "maxLength": 128, "pattern": ID_PATTERN},
                              {"type": "integer", "minimum": 0, "maximum": 10**18}]}),
]
"""An external user or item id: 1-128 characters of ``[A-Za-z0-9_.:@-]`` (JSON integers accepted)."""

def _assume_utc(value: datetime) -> datetime:
    """SQLite stores timestamps without their zone; every stored timestamp is UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


UtcDateTime = Annotated[datetime, AfterValidator(_assume_utc)]
"""A timestamp serialised with its zone (UTC when the database returned a naive one)."""

FiniteFloat = Annotated[float, Field(allow_inf_nan=False, strict=True)]
"""A JSON number (not a string) that is neither NaN nor infinite."""


class StrictModel(BaseModel):
    """Request bodies reject unknown fields so typos do not pass silently."""

    model_config = ConfigDict(extra="forbid")


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """One page of a listing."""

    items: list[T]
    total: int = Field(description="Number of entries across all pages.")
    offset: int
    limit: int
    next_offset: int | None = Field(description="Offset of the next page, null on the last one.")

    @classmethod
    def build(cls, items: list[T], *, total: int, offset: int, limit: int) -> "Page[T]":
        nxt = offset + len(items)
        return cls(items=items, total=total, offset=offset, limit=limit,
                   next_offset=nxt if nxt < total else None)
