"""Popular items by the DP counts released with the model (post-processing, not charged)."""

from __future__ import annotations

import numpy as np
from sqlalchemy.orm import Session

from app.core.mf import foldin
from app.schemas.serving import PopularItem, PopularOut
from app.services.serving.active import ActiveModel, active, catalog, item_mask

__all__ = ["popular", "popular_indices"]


def popular_indices(s: ActiveModel, n: int, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = np.asarray(s.model.item_counts, dtype=np.float64)
    return foldin.top_n(counts, n, np.flatnonzero(candidates))


def popular(session: Session, *, dataset: str, n: int) -> PopularOut:
    """Most popular active items by the DP counts released with the model."""
    s = active(session, dataset)
    cat = catalog(session, s.row.dataset_id, dataset)
    allowed = ~item_mask(s, ("inactive", cat.stamp), cat.inactive)
    idx, counts = popular_indices(s, n, allowed)
    ids = np.asarray(s.model.item_ids)[idx].tolist()
    return PopularOut(model_version=s.row.id, items=[
        PopularItem(item_id=str(i), dp_count=float(c), rank=k + 1) for k, (i, c) in enumerate(zip(ids, counts))])
