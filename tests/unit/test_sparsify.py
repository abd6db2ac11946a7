"""Sparsified variants (issue 27): each user's training ratings subsampled to a target median by a
fixed public seed; the median hits its target, the test split and ranking targets are untouched,
every kept rating is one of the user's own, and the result is deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from app.core.data.ratings import Ratings
from app.core.data.sparsify import kept_counts, sparsify_ranking_split, sparsify_rating_split, subsample_rows
from app.core.data.splits import heldout_users_split, random_split
from tests.conftest import require_data


def _skewed(n_users: int = 600, n_items: int = 400, seed: int = 0) -> Ratings:
    """Heavy-tailed activity like real rating data: counts 20..n_items, median ~60."""
    rng = np.random.default_rng(seed)
    counts = np.minimum(n_items, 20 + rng.lognormal(3.5, 0.9, n_users).astype(int))
    users = np.repeat(np.arange(n_users), counts)
    items = np.concatenate([rng.choice(n_items, c, replace=False) for c in counts])
    return Ratings.from_arrays(users + 10, items + 7, rng.integers(1, 6, len(users)).astype(float))


def _pairs(r: Ratings) -> set[tuple[int, int, float]]:
    rows, cols, vals = r.coo()
    return set(zip(r.user_ids[rows].tolist(), r.item_ids[cols].tolist(), vals.tolist(), strict=True))


@pytest.mark.parametrize("target", [10, 20, 35])
def test_the_training_median_hits_its_target_and_the_test_split_is_untouched(target: int) -> None:
    train, valid, test = random_split(_skewed(), (0.8, 0.1, 0.1), seed=0)
    assert np.median(train.user_counts()) > 35
    sparse_train, sparse_valid, sparse_test = sparsify_rating_split(train, valid, test, target)
    counts = sparse_train.user_counts()
    assert np.median(counts) == target
    assert counts.min() >= 1 and np.all(counts <= train.user_counts())
    assert sparse_test is test
    assert _pairs(sparse_train) <= _pairs(train) and _pairs(sparse_valid) <= _pairs(valid)
    assert sparse_valid.nnz < valid.nnz
    for part, whole in ((sparse_train, train), (sparse_valid, valid)):  # same id spaces, evaluable together
        assert np.array_equal(part.user_ids, whole.user_ids) and np.array_equal(part.item_ids, whole.item_ids)


def test_kept_counts_are_a_monotone_proportional_thinning() -> None:
    counts = np.array([0, 13, 20, 41, 60, 60, 77, 100, 585])
    kept = kept_counts(counts, 10)
    assert kept[0] == 0 and np.all(kept[1:] >= 1) and np.all(kept <= counts)
    assert np.all(np.diff(kept[1:]) >= 0)  # a heavier user keeps at least as many
    assert float(np.median(kept[1:])) == 10
    assert np.array_equal(kept_counts(counts, 1000), counts)  # already sparser than the target: untouched
    with pytest.raises(ValueError):
        kept_counts(counts, 0.5)


def test_subsampling_is_deterministic_and_seeded() -> None:
    train, valid, test = random_split(_skewed(), (0.8, 0.1, 0.1), seed=0)
    first = sparsify_rating_split(train, valid, test, 20)
    again = sparsify_rating_split(train, valid, test, 20)
    assert all(_pairs(a) == _pairs(b) for a, b in zip(first, again, strict=True))
    other = sparsify_rating_split(train, valid, test, 20, seed=1)
    assert _pairs(other[0]) != _pairs(first[0])
    keep = np.full(train.n_users, 3)
    assert _pairs(subsample_rows(train, keep, 5)) == _pairs(subsample_rows(train, keep, 5))
    assert np.all(subsample_rows(train, keep, 5).user_counts() == 3)


def test_ranking_variant_thins_train_and_queries_and_keeps_every_target() -> None:
    ratings = _skewed(seed=1)
    split = heldout_users_split(ratings, 50, 50, seed=0)
    sparse = sparsify_ranking_split(split, ratings, 10)
    assert sparse.train.nnz < split.train.nnz and _pairs(sparse.train) <= _pairs(split.train)
    for held, whole in ((sparse.valid, split.valid), (sparse.test, split.test)):
        assert held.target is whole.target
        assert _pairs(held.query) <= _pairs(whole.query) and held.query.nnz < whole.query.nnz
        assert np.all(held.query.user_counts()[whole.query.user_counts() > 0] >= 1)  # nobody loses her history
    again = sparsify_ranking_split(split, ratings, 10)
    assert _pairs(again.train) == _pairs(sparse.train) and _pairs(again.test.query) == _pairs(sparse.test.query)


@pytest.mark.parametrize("target", [10, 20, 35])
def test_ml100k_variants_hit_their_medians(target: int) -> None:
    """The quality-defaults variants on the real ML-100K split (median 53 training ratings a user)."""
    require_data("ml-100k", "u.data.gz")
    from app.core.data.datasets import load_ml100k

    train, valid, test = random_split(load_ml100k().ratings, (0.8, 0.1, 0.1), seed=0)
    sparse_train, _, sparse_test = sparsify_rating_split(train, valid, test, target)
    assert np.median(sparse_train.user_counts()) == target and sparse_test is test
