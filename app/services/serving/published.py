"""The published release itself: model metadata and the item embeddings (rows of the public V).

Public reads of the active model only; nothing here touches private data.
"""

from __future__ import annotations

import io

import numpy as np
from sqlalchemy.orm import Session

from app.ledger import round_up
from app.schemas.serving import EmbeddingRow, EmbeddingsPage, ModelInfoOut
from app.services.serving.active import active

__all__ = ["model_info", "embeddings_page", "embeddings_npy"]


def model_info(session: Session, *, dataset: str) -> ModelInfoOut:
    """Public metadata of the active model."""
    s = active(session, dataset)
    row, model = s.row, s.model
    meta = dict(row.model_metadata or {})
    eps_pld = None if row.epsilon_pld is None else round_up(row.epsilon_pld)
    return ModelInfoOut(
        model_version=row.id, version=row.id, dataset_version=row.version,
        dataset=dataset, algorithm=row.algorithm, epsilon=round_up(row.epsilon),
        delta=row.delta, epsilon_rdp=round_up(row.epsilon), epsilon_pld=eps_pld, trained_at=row.created_at, n_items=model.n_items,
        n_trained_items=int(np.count_nonzero(model.trained_mask)), rank=model.rank,
        sha256=row.sha256, active=bool(row.active), metrics=dict(row.metrics or {}), privacy=meta,
    )


def embeddings_page(session: Session, *, dataset: str, offset: int, limit: int) -> EmbeddingsPage:
    """One page of item embeddings (rows of the public V)."""
    s = active(session, dataset)
    model = s.model
    total = model.n_items
    stop = min(offset + limit, total)
    ids = np.asarray(model.item_ids)[offset:stop].tolist()
    vecs = np.asarray(model.item_factors[offset:stop], dtype=np.float64).tolist()
    trained = model.trained_mask[offset:stop].tolist()
    rows = [EmbeddingRow(item_id=str(i), trained=bool(t), vector=v) for i, t, v in zip(ids, trained, vecs, strict=True)]
    return EmbeddingsPage(model_version=s.row.id, rank=model.rank, items=rows, total=total,
                          offset=offset, limit=limit, next_offset=stop if stop < total else None)


def embeddings_npy(session: Session, *, dataset: str) -> tuple[bytes, int]:
    """The whole V as a float32 ``.npy`` file (cached per version) and the version id."""
    s = active(session, dataset)
    if s.cache.npy is None:
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(s.model.item_factors, dtype=np.float32), allow_pickle=False)
        s.cache.npy = buf.getvalue()
    return s.cache.npy, s.row.id
