"""Items similar to an item: cosine on the public item factors (post-processing, not charged)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.core.mf import foldin
from app.errors import ItemNotInModel
from app.schemas.serving import SimilarOut
from app.services.serving.active import active
from app.services.serving.catalogue_cache import catalog
from app.services.serving.responses import item_mask, scored_items

__all__ = ["similar"]


def similar(session: Session, *, dataset: str, item_id: str, n: int) -> SimilarOut:
    """Items closest to ``item_id`` by cosine on the public V (inactive items left out)."""
    s = active(session, dataset)
    pos = s.positions.get(item_id)
    if pos is None:
        raise ItemNotInModel(f"item {item_id!r} is not in the active model",
                             details={"item_id": item_id, "model_version": s.row.id})
    cat = catalog(session, s.row.dataset_id, dataset)
    idx, scores = foldin.similar_items(s.model, pos, n + len(cat.inactive))
    if cat.inactive:
        keep = ~item_mask(s, ("inactive", cat.stamp), cat.inactive)[idx]
        idx, scores = idx[keep][:n], scores[keep][:n]
    return SimilarOut(model_version=s.row.id, item_id=item_id, items=scored_items(s, idx[:n], scores[:n]))
