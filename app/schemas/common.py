"""Shared field types and the paging envelope."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, WithJsonSchema

from app.errors import InvalidPage

__all__ = [
    "ExternalId",
    "FiniteFloat",
    "ID_PATTERN",
    "UtcDateTime",
    "MAX_PAGE_SIZE",
    "DEFAULT_PAGE_SIZE",
    "MAX_OFFSET",
    "PageRequest",
    "require_valid_page",
    "MAX_BATCH_ROWS",
    "Page",
    "StrictModel",
]

MAX_PAGE_SIZE = 1000
"""The largest page any listing returns (the one place the page limit is stated)."""
DEFAULT_PAGE_SIZE = 100
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
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


UtcDateTime = Annotated[datetime, AfterValidator(_assume_utc)]
"""A timestamp serialised with its zone (UTC when the database returned a naive one)."""

FiniteFloat = Annotated[float, Field(allow_inf_nan=False, strict=True)]
"""A JSON number (not a string) that is neither NaN nor infinite."""


class StrictModel(BaseModel):
    """Request bodies reject unknown fields so typos do not pass silently."""

    model_config = ConfigDict(extra="forbid")


T = TypeVar("T")


@dataclass(frozen=True)
class PageRequest:
    """Which page of a listing: skip ``offset`` entries, return at most ``limit``."""

    offset: int = 0
    limit: int = DEFAULT_PAGE_SIZE


def require_valid_page(offset: int, limit: int) -> None:
    """Refuse a page outside 0 <= offset <= MAX_OFFSET, 1 <= limit <= MAX_PAGE_SIZE (callers other
    than the API, whose query parameters are validated against the same bounds)."""
    if not (0 <= offset <= MAX_OFFSET and 1 <= limit <= MAX_PAGE_SIZE):
        raise InvalidPage(f"offset must lie in [0, {MAX_OFFSET}] and limit in [1, {MAX_PAGE_SIZE}]",
                          offset=offset, limit=limit)


class Page(BaseModel, Generic[T]):
    """One page of a listing."""

    items: list[T]
    total: int = Field(description="Number of entries across all pages.")
    offset: int
    limit: int
    next_offset: int | None = Field(description="Offset of the next page, null on the last one.")

    @classmethod
    def build(cls, items: list[T], *, total: int, offset: int, limit: int) -> Page[T]:
        nxt = offset + len(items)
        return cls(items=items, total=total, offset=offset, limit=limit,
                   next_offset=nxt if nxt < total else None)
