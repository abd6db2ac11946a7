"""Popular items by the popularity released with the model: DP counts, or one-bit's mean P(thumbs up)
(post-processing, not charged)."""

from __future__ import annotations

import numpy as np
from sqlalchemy.orm import Session

from app.core.algorithms import get_algorithm
from app.core.mf import foldin
from app.schemas.serving import PopularItem, PopularOut
from app.services.serving.active import ActiveModel, active
from app.services.serving.catalogue_cache import catalog
from app.services.serving.responses import item_mask

__all__ = ["popular", "popular_indices"]


def popular_indices(s: ActiveModel, n: int, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-``n`` candidates by the popularity the model's algorithm released (and those values)."""
    return foldin.top_n_allowed(get_algorithm(s.cache.algorithm).popularity(s.model), n, candidates)


def popular(session: Session, *, dataset: str, n: int) -> PopularOut:
    """Most popular active items by the released popularity; ``popularity_kind`` says what it is."""
    s = active(session, dataset)
    cat = catalog(session, s.row.dataset_id, dataset)
    allowed = ~item_mask(s, ("inactive", cat.stamp), cat.inactive)
    idx, values = popular_indices(s, n, allowed)
    ids = np.asarray(s.model.item_ids)[idx].tolist()
    kind = get_algorithm(s.cache.algorithm).popularity_kind
    return PopularOut(model_version=s.row.id, popularity_kind=kind, items=[
        PopularItem(item_id=str(i), popularity=float(v), dp_count=float(v) if kind == "dp_count" else None,
                    rank=k + 1) for k, (i, v) in enumerate(zip(ids, values, strict=True))])
