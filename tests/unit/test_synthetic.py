"""Synthetic generators: the paper's setup and the production-shaped generator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.core.data.synthetic import paper_synthetic, production_synthetic


def test_paper_synthetic_shape_probability_and_unit_std():
    n, m = 2000, 300
    d = paper_synthetic(n, n_items=m, rank=5, seed=0)
    r = d.ratings
    assert (r.n_users, r.n_items) == (n, m)
    p = 20 * math.log(n) / m
    assert d.p == pytest.approx(p)
    # observed fraction within 5 binomial standard deviations of p
    assert abs(r.nnz / (n * m) - p) < 5 * math.sqrt(p * (1 - p) / (n * m))
    assert np.std(r.csr.data) == pytest.approx(1.0, abs=1e-9)
    rows, cols, vals = r.coo()
    assert np.allclose(d.truth(rows, cols), vals)
    # exact rank 5 with equal singular values (orthonormal factors, one common scale)
    s = np.linalg.svd(d.user_factors @ d.item_factors.T, compute_uv=False)
    assert np.allclose(s[:5], s[0]) and s[5] < 1e-8 * s[0]
    q = d.item_factors / np.linalg.norm(d.item_factors[:, 0])
    assert np.allclose(q.T @ q, np.eye(5), atol=1e-9)


def test_paper_synthetic_is_seeded_and_validates():
    a, b = paper_synthetic(500, 400, seed=3), paper_synthetic(500, 400, seed=3)
    c = paper_synthetic(500, 400, seed=4)
    assert (a.ratings.csr != b.ratings.csr).nnz == 0
    assert a.ratings.nnz != c.ratings.nnz or (a.ratings.csr != c.ratings.csr).nnz > 0
    with pytest.raises(ValueError, match="outside"):
        paper_synthetic(5000, n_items=100)  # 20 ln(5000)/100 > 1
    with pytest.raises(ValueError):
        paper_synthetic(100, 50, rank=0)
    assert paper_synthetic(100, 50, p=1.0, seed=0).ratings.nnz == 100 * 50


def test_production_synthetic_counts_range_and_no_duplicates():
    n, m, k = 3000, 800, 60_000
    d = production_synthetic(n, m, k, rank=8, seed=1)
    r = d.ratings  # Ratings.from_indices raises on duplicate pairs, so reaching here proves none
    assert (r.n_users, r.n_items, r.nnz) == (n, m, k)
    vals = r.csr.data
    assert vals.min() >= 1.0 and vals.max() <= 5.0
    assert np.all(vals * 2 == np.round(vals * 2))  # 0.5 steps
    uc = r.user_counts()
    assert uc.min() >= 5 and uc.max() <= int(0.3 * m)
    assert 2.8 < vals.mean() < 4.2 and 0.6 < vals.std() < 1.4
    # values follow the low-rank truth: noise std 0.5 plus rounding/clipping
    rows, cols, _ = r.coo()
    assert np.corrcoef(d.truth(rows, cols), vals)[0, 1] > 0.7


def test_production_synthetic_is_skewed_like_real_data():
    d = production_synthetic(5000, 2000, 100_000, seed=2)
    ic = np.sort(d.ratings.item_counts())[::-1]
    uc = np.sort(d.ratings.user_counts())[::-1]
    top1pct = ic[: len(ic) // 100].sum() / ic.sum()
    assert top1pct > 0.08  # uniform popularity would give ~1%
    assert ic[0] > 20 * np.median(ic)
    assert uc[0] > 10 * np.median(uc)  # heavy-tailed user activity
    # popularity is not tied to item id order
    assert abs(np.corrcoef(np.arange(2000), d.ratings.item_counts())[0, 1]) < 0.2


def test_production_synthetic_continuous_and_seeded():
    a = production_synthetic(500, 200, 8000, seed=5, discrete=False)
    b = production_synthetic(500, 200, 8000, seed=5, discrete=False)
    c = production_synthetic(500, 200, 8000, seed=6, discrete=False)
    assert (a.ratings.csr != b.ratings.csr).nnz == 0
    assert (a.ratings.csr != c.ratings.csr).nnz > 0
    assert not np.all(a.ratings.csr.data * 2 == np.round(a.ratings.csr.data * 2))


def test_production_synthetic_heavy_users_get_distinct_items():
    # users may rate up to 90% of the items: exercises the flattening top-up rounds
    d = production_synthetic(50, 100, 4000, seed=0, max_user_fraction=0.9, min_user_ratings=40)
    uc = d.ratings.user_counts()
    assert d.ratings.nnz == 4000 and uc.max() <= 90 and uc.min() >= 40


def test_production_synthetic_rejects_infeasible():
    with pytest.raises(ValueError, match="cannot be spread"):
        production_synthetic(10, 100, 10 * 100, seed=0)  # > 30% of items per user
    with pytest.raises(ValueError):
        production_synthetic(10, 100, 200, seed=0, noise=-1.0)
