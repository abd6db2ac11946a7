"""Data set administration: the listing and the emptiness check (the rest goes through budgets)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.models import Dataset, Item, Rating

__all__ = ["dataset_exists", "datasets_page", "holds_nothing"]


def dataset_exists(session: Session, name: str) -> bool:
    """Whether a data set is called ``name``."""
    return session.scalar(select(Dataset.id).where(Dataset.name == name)) is not None


def datasets_page(session: Session, offset: int, limit: int) -> tuple[list[Dataset], int]:
    """One page of data sets by name and their total count."""
    total = session.scalar(select(func.count()).select_from(Dataset)) or 0
    rows = session.scalars(select(Dataset).order_by(Dataset.name).offset(offset).limit(limit)).all()
    return list(rows), int(total)


def holds_nothing(session: Session, dataset_id: int) -> bool:
    """Whether the data set has neither an item nor a rating."""
    n_items = session.scalar(select(func.count()).select_from(Item).where(Item.dataset_id == dataset_id)) or 0
    n_ratings = session.scalar(select(func.count()).select_from(Rating).where(Rating.dataset_id == dataset_id)) or 0
    return n_items == 0 and n_ratings == 0
