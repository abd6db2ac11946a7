"""Seeded splits: determinism, fractions, disjointness, no user leakage; canonical ML-1M splits."""

from __future__ import annotations

import numpy as np
import pytest

from app.core.data.ratings import Ratings
from app.core.data.splits import heldout_users_split, load_ml1m_ranking_split, load_ml1m_rating_split, random_split
from tests.conftest import require_data


def _ratings(n_users=300, n_items=120, density=0.15, seed=0) -> Ratings:
    rng = np.random.default_rng(seed)
    u, i = np.nonzero(rng.random((n_users, n_items)) < density)
    vals = rng.integers(1, 6, len(u)).astype(float)
    return Ratings.from_arrays(u + 1000, i + 5000, vals)


def _pairs(r: Ratings) -> set[tuple[int, int]]:
    rows, cols, _ = r.coo()
    return set(zip(r.user_ids[rows].tolist(), r.item_ids[cols].tolist(), strict=True))


def test_random_split_fractions_disjoint_and_complete():
    r = _ratings()
    parts = random_split(r, (0.8, 0.1, 0.1), seed=3)
    sizes = [p.nnz for p in parts]
    assert sum(sizes) == r.nnz
    assert abs(sizes[0] - 0.8 * r.nnz) <= 1 and abs(sizes[1] - 0.1 * r.nnz) <= 1
    sets = [_pairs(p) for p in parts]
    assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])
    assert sets[0] | sets[1] | sets[2] == _pairs(r)
    for p in parts:  # shared id spaces and values preserved
        assert np.array_equal(p.user_ids, r.user_ids) and np.array_equal(p.item_ids, r.item_ids)
    assert (parts[0].csr + parts[1].csr + parts[2].csr - r.csr).count_nonzero() == 0


def test_random_split_is_seeded():
    r = _ratings()
    a, b = random_split(r, seed=7), random_split(r, seed=7)
    c = random_split(r, seed=8)
    assert all(_pairs(x) == _pairs(y) for x, y in zip(a, b, strict=True))
    assert _pairs(a[1]) != _pairs(c[1])


@pytest.mark.parametrize("fractions", [(0.8, 0.3), (1.0,), (0.5, -0.1, 0.6), (0.5, float("nan"), 0.5)])
def test_random_split_rejects_bad_fractions(fractions):
    with pytest.raises(ValueError):
        random_split(_ratings(), fractions, seed=0)


def test_heldout_split_structure_and_no_leakage():
    r = _ratings(n_users=400, density=0.2)
    s = heldout_users_split(r, n_valid=30, n_test=40, seed=5)
    assert s.valid.n_users == 30 and s.test.n_users == 40
    train_users = set(s.train.user_ids.tolist())
    valid_users, test_users = set(s.valid.user_ids.tolist()), set(s.test.user_ids.tolist())
    assert not (train_users & valid_users) and not (train_users & test_users) and not (valid_users & test_users)
    # train holds only positives, binarised; every train user is eligible (>= 5 positives)
    assert np.all(s.train.csr.data == 1.0)
    rows, cols, vals = r.coo()
    pos_counts = np.bincount(rows[vals >= 4], minlength=r.n_users)
    eligible = set(r.user_ids[pos_counts >= 5].tolist())
    assert train_users | valid_users | test_users == eligible
    # item space = items positively rated by train users, shared by train/query/target
    for hs in (s.valid, s.test):
        assert np.array_equal(hs.query.item_ids, s.train.item_ids)
        assert np.array_equal(hs.target.item_ids, s.train.item_ids)
        for u in range(hs.n_users):
            q, t = hs.query_items(u), hs.target_items(u)
            assert not set(q.tolist()) & set(t.tolist())
            n = len(q) + len(t)
            assert len(q) == int(np.ceil(0.8 * n - 1e-9))  # 80% query, rounded up
            uid = hs.user_ids[u]
            orig = r.user_row(r.user_index(uid))
            liked = set(r.item_ids[orig[0][orig[1] >= 4]].tolist()) & set(s.train.item_ids.tolist())
            assert set(s.train.item_ids[np.concatenate([q, t])].tolist()) == liked
    assert s.train.item_counts().min() >= 1


def test_heldout_split_is_seeded():
    r = _ratings(n_users=400, density=0.2)
    a = heldout_users_split(r, 20, 20, seed=1)
    b = heldout_users_split(r, 20, 20, seed=1)
    c = heldout_users_split(r, 20, 20, seed=2)
    assert np.array_equal(a.test.user_ids, b.test.user_ids)
    assert (a.test.target.csr != b.test.target.csr).nnz == 0
    assert not np.array_equal(a.test.user_ids, c.test.user_ids)


def test_heldout_split_keeps_original_values_when_not_binary():
    r = _ratings(n_users=200, density=0.3)
    s = heldout_users_split(r, 10, 10, seed=0, binary=False)
    assert set(np.unique(s.train.csr.data)) <= {4.0, 5.0}
    assert set(np.unique(s.test.query.csr.data)) <= {4.0, 5.0}


def test_heldout_split_small_users_have_empty_target_but_are_kept():
    # every user has exactly 5 positives, query_fraction 0.9 -> ceil(4.5) = 5 query, 0 target
    u = np.repeat(np.arange(20), 5)
    i = np.concatenate([np.arange(k, k + 5) for k in range(20)])
    r = Ratings.from_arrays(u, i, np.full(len(u), 5.0))
    s = heldout_users_split(r, 3, 3, seed=0, query_fraction=0.9)
    assert s.test.n_users == 3 and s.test.n_with_target() == 0


def test_heldout_split_rejects_bad_arguments():
    r = _ratings(n_users=50)
    with pytest.raises(ValueError, match="cannot hold out"):
        heldout_users_split(r, 40, 40, seed=0)
    with pytest.raises(ValueError):
        heldout_users_split(r, 1, 1, seed=0, query_fraction=1.0)


@pytest.mark.data
def test_canonical_ml1m_rating_split():
    require_data("ml-1m", "splits")
    train, valid, test = load_ml1m_rating_split()
    assert (train.nnz, valid.nnz, test.nnz) == (800_161, 100_020, 100_021)
    assert train.n_users == valid.n_users == test.n_users == 6040
    assert (train.csr.multiply(test.csr)).nnz == 0


@pytest.mark.data
def test_canonical_ml1m_ranking_split():
    require_data("ml-1m", "splits")
    s = load_ml1m_ranking_split()
    assert (s.train.n_users, s.valid.n_users, s.test.n_users) == (4834, 600, 600)
    assert s.train.n_items == 3504 and np.all(s.train.csr.data == 1.0)
    assert (s.valid.query.nnz, s.valid.target.nnz) == (45_164, 11_001)
    assert (s.test.query.nnz, s.test.target.nnz) == (44_254, 10_763)
    assert s.test.n_with_target() == 600
    assert not set(s.train.user_ids.tolist()) & set(s.test.user_ids.tolist())


def test_heldout_split_with_no_validation_users_and_string_ids():
    rng = np.random.default_rng(0)
    u, i = np.nonzero(rng.random((100, 50)) < 0.3)
    r = Ratings.from_arrays(np.array([f"u{k:03d}" for k in u]), i, np.full(len(u), 5.0))
    s = heldout_users_split(r, 0, 10, seed=0)
    assert s.valid.n_users == 0 and s.valid.query.nnz == 0
    assert s.test.n_users == 10 and s.test.n_with_target() == 10
    assert s.test.user_ids.dtype.kind == "U"


def test_merge_restores_the_union_and_rejects_overlap():
    from app.core.data.splits import merge

    r = _ratings()
    train, valid, test = random_split(r, seed=1)
    both = merge(train, valid)
    assert both.nnz == train.nnz + valid.nnz and _pairs(both) == _pairs(train) | _pairs(valid)
    assert (merge(train, valid, test).csr != r.csr).nnz == 0
    with pytest.raises(ValueError, match="duplicate"):
        merge(train, train)
    with pytest.raises(ValueError, match="id spaces"):
        merge(train, _ratings(n_users=50))
