"""The DPALS item step's statistics: the upper-triangle Grams (``dsyrk``) release the same numbers
as the full batched products did, so the trained models are the same, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from app.core.data.synthetic import production_synthetic
from app.core.mf import dpals
from app.core.mf.als import Bucket, bucket_gram
from app.core.mf.dpals import DPALSConfig, train_dpals


def _full_product_statistics(chunk, padded, rank, counts):
    """The item statistics as formed before (gather, batched GEMM, both triangles)."""
    if isinstance(chunk, Bucket):
        return (chunk.rows, *bucket_gram(chunk, padded))
    return chunk, np.zeros((len(chunk), rank, rank)), np.zeros((len(chunk), rank))


@pytest.mark.parametrize(("mode", "rank"), [("tail", 16), ("tail", 64), ("adaptive_weights", 32)])
def test_upper_grams_train_the_same_model(mode: str, rank: int, monkeypatch: pytest.MonkeyPatch):
    ratings = production_synthetic(3_000, 400, 60_000, seed=1).ratings
    config = DPALSConfig(rank=rank, n_steps=2, contribution_bound=30, contribution_mode=mode, frequent_fraction=0.9,
                         noise_multiplier=1.0, seed=3)
    model = train_dpals(ratings, config)
    monkeypatch.setattr(dpals, "_chunk_statistics", _full_product_statistics)
    before = train_dpals(ratings, config)
    assert np.array_equal(model.item_factors, before.item_factors)
    assert np.array_equal(model.item_biases, before.item_biases)
