"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def require_data(*parts: str) -> Path:
    """Path inside the shared data folder; skip (fail under CI=true) when it is absent."""
    from app.core.data.datasets import data_root

    path = data_root().joinpath(*parts)
    if not path.exists():
        msg = (
            f"real rating data not found at {path}; put the shared data next to the repo "
            f"(../shared/data) or set PRIVREC_DATA_DIR"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg + " (CI=true: the data folder is required)")
        pytest.skip(msg)
    return path


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The shared real-data folder (../shared/data or $PRIVREC_DATA_DIR)."""
    return require_data()
