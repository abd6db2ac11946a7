"""What serving builds from a cached model: boolean item masks (cached per model version) and
the response rows."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.schemas.serving import ScoredItem
from app.services.serving.active import ActiveModel

__all__ = ["item_mask", "scored_items", "scored_rows"]


def item_mask(active_: ActiveModel, key: Any, ids: frozenset[str]) -> np.ndarray:
    """Boolean mask over the model's items for ``ids`` (cached per catalogue stamp; read-only)."""
    serving = active_.cache
    mask = serving.masks.get(key)
    if mask is None:
        mask = np.zeros(serving.model.n_items, dtype=bool)
        rows = [serving.positions[i] for i in ids if i in serving.positions]
        mask[np.asarray(rows, dtype=np.int64)] = True
        mask.setflags(write=False)
        if len(serving.masks) > 256:
            serving.masks.clear()
        serving.masks[key] = mask
    return mask


def scored_items(serving: ActiveModel, idx: np.ndarray, scores: np.ndarray | None) -> list[ScoredItem]:
    """The response rows for ``idx``, best first (``tolist``: Python floats, as ``float(x)``)."""
    return [ScoredItem(**row) for row in scored_rows(serving, idx, scores)]


def scored_rows(serving: ActiveModel, idx: np.ndarray, scores: np.ndarray | None) -> list[dict[str, Any]]:
    """:func:`scored_items` as plain dicts, for a response model that validates them all in one
    call (a ``ScoredItem`` built per row cost about as much again)."""
    ids = np.asarray(serving.model.item_ids)[idx].tolist()
    values = [None] * len(ids) if scores is None else scores.tolist()
    return [{"item_id": str(i), "score": v, "rank": k} for k, (i, v) in enumerate(zip(ids, values, strict=True), 1)]
