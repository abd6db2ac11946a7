"""DP-CMF's public inputs as stored: item metadata, declared-public similarities, public users."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Item, ItemSimilarity, PublicRatingConsent, SimilaritySource

__all__ = ["item_metadata", "public_similarities", "public_user_ids"]


def public_user_ids(session: Session, dataset_id: int) -> np.ndarray:
    """Database ids of the users whose ratings of the data set are public now (sorted)."""
    ids = session.scalars(select(PublicRatingConsent.user_id).where(
        PublicRatingConsent.dataset_id == dataset_id, PublicRatingConsent.public.is_(True)))
    return np.sort(np.fromiter(ids, dtype=np.int64))


def item_metadata(session: Session, dataset_id: int) -> list[tuple[int, Any, Any]]:
    """(item id, categories, features) of every item of the data set."""
    rows = session.execute(select(Item.id, Item.categories, Item.features).where(Item.dataset_id == dataset_id))
    return [(int(i), c, f) for i, c, f in rows]


def public_similarities(session: Session, dataset_id: int) -> list[tuple[str, int, int, float]]:
    """(source name, item id, neighbour id, score) of every declared-public source of the data set."""
    rows = session.execute(
        select(SimilaritySource.name, ItemSimilarity.item_id, ItemSimilarity.neighbour_id, ItemSimilarity.score)
        .join(SimilaritySource, SimilaritySource.id == ItemSimilarity.source_id)
        .where(SimilaritySource.dataset_id == dataset_id, SimilaritySource.declared_public.is_(True))
    )
    return [(str(n), int(i), int(k), float(s)) for n, i, k, s in rows]
