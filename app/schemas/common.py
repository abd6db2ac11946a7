"""Shared field types and the paging envelope."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, WithJsonSchema
from pydantic_core import PydanticCustomError

from app.errors import InvalidPage

__all__ = [
    "ExternalId",
    "EXTERNAL_ID_MAX_LENGTH",
    "MAX_INTEGER_ID",
    "ids_valid",
    "is_external_id",
    "NO_NUL_PATTERN",
    "Text",
    "Label",
    "MAX_LABEL_LENGTH",
    "INT32_MAX",
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


ID_PATTERN = r"^[A-Za-z0-9_.:@\-]+$"
EXTERNAL_ID_MAX_LENGTH = 128
MAX_INTEGER_ID = 10**18
"""JSON integer ids are accepted in [0, 10^18] (their decimal string is the id)."""
INT32_MAX = 2**31 - 1
"""The largest value of a 32-bit integer column (ids, counts an admin declares)."""

_ID = re.compile(ID_PATTERN.removesuffix("$") + r"\Z")  # \Z: no trailing newline slips through
_ID_CHARS = ID_PATTERN.removeprefix("^").removesuffix("+$")  # the one character class of an id
_ID_LINES = re.compile(f"(?:{_ID_CHARS}{{1,{EXTERNAL_ID_MAX_LENGTH}}}\n)+\\Z")


def is_external_id(value: object) -> bool:
    """Whether ``value`` is an id string every path accepts: 1-128 characters of ``[A-Za-z0-9_.:@-]``
    (so no control character, no lone surrogate, nothing outside ASCII)."""
    return isinstance(value, str) and 0 < len(value) <= EXTERNAL_ID_MAX_LENGTH and _ID.match(value) is not None


def ids_valid(ids: list[Any]) -> bool:
    """Whether every element of ``ids`` is a string :func:`is_external_id` accepts, checked set-wise
    (one type scan, one regular-expression match over the ids joined by newlines). An id holding a
    newline would split into two valid-looking lines: the line count must equal the id count."""
    if set(map(type, ids)) != {str}:
        return False
    joined = "\n".join(ids) + "\n"
    return joined.count("\n") == len(ids) and _ID_LINES.match(joined) is not None


def _id_to_str(value: Any) -> Any:
    """Accept integer ids in [0, 10^18] in JSON and treat them as their decimal string."""
    if isinstance(value, bool):
        return value  # rejected by the str constraint below
    if isinstance(value, int):
        if not 0 <= value <= MAX_INTEGER_ID:
            raise PydanticCustomError("id_range", "an integer id must lie in [0, {max}]", {"max": MAX_INTEGER_ID})
        return str(value)
    return value


ExternalId = Annotated[
    str,
    BeforeValidator(_id_to_str),
    StringConstraints(min_length=1, max_length=EXTERNAL_ID_MAX_LENGTH, pattern=ID_PATTERN),
    # stated explicitly: pydantic drops the pattern from the schema next to a BeforeValidator
    WithJsonSchema({"anyOf": [{"type": "string", "minLength": 1, "maxLength": EXTERNAL_ID_MAX_LENGTH,
                               "pattern": ID_PATTERN},
                              {"type": "integer", "minimum": 0, "maximum": MAX_INTEGER_ID}]}),
]
"""An external user or item id: 1-128 characters of ``[A-Za-z0-9_.:@-]`` (JSON integers in
[0, 10^18] accepted). Every path checks ids with this type or :func:`ids_valid`."""

NO_NUL_PATTERN = r"^[^\x00]*$"
Text = Annotated[str, StringConstraints(pattern=NO_NUL_PATTERN)]
"""Free text (titles, reasons, descriptions, provenance, keys): no NUL character (PostgreSQL's text
refuses it) and no lone surrogate (a pattern-checked string must be valid Unicode); callers add
``max_length``."""

MAX_LABEL_LENGTH = 128
Label = Annotated[str, StringConstraints(min_length=1, max_length=MAX_LABEL_LENGTH, pattern=NO_NUL_PATTERN)]
"""A short public label (a category, a feature name or a string in a feature's list)."""


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
