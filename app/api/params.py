"""Validated path parameters shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

DatasetP = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$",
                               description="Data set name (the budget scope), e.g. `default`.")]
UserP = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@\-]+$",
                            description="External user id.")]
IdP = Annotated[int, Path(ge=1, le=2**31 - 1, description="Numeric id (a 32-bit database key).")]
ItemP = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@\-]+$",
                            description="External item id.")]
