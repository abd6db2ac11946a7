"""Validated path parameters shared by the routers (patterns and lengths as constants: the
recommendation fast path, :mod:`app.api.fast_path`, checks the same ones)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from app.schemas.common import EXTERNAL_ID_MAX_LENGTH, ID_PATTERN, INT32_MAX

DATASET_PATTERN = r"^[A-Za-z0-9_\-]+$"
DATASET_MAX_LENGTH = 64
EXTERNAL_ID_PATTERN = ID_PATTERN  # the one id rule (app.schemas.common.is_external_id)

DatasetP = Annotated[str, Path(min_length=1, max_length=DATASET_MAX_LENGTH, pattern=DATASET_PATTERN,
                               description="Data set name (the budget scope), e.g. `default`.")]
UserP = Annotated[str, Path(min_length=1, max_length=EXTERNAL_ID_MAX_LENGTH, pattern=EXTERNAL_ID_PATTERN,
                            description="External user id.")]
IdP = Annotated[int, Path(ge=1, le=INT32_MAX, description="Numeric id (a 32-bit database key).")]
ItemP = Annotated[str, Path(min_length=1, max_length=EXTERNAL_ID_MAX_LENGTH, pattern=EXTERNAL_ID_PATTERN,
                            description="External item id.")]
