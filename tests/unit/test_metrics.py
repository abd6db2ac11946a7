"""Known-answer tests for RMSE (user-mean fallback), Recall@k and NDCG@k."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from app.core.data.ratings import Ratings
from app.core.eval import metrics as M


def test_rmse_known_answer_and_validation():
    assert M.rmse([1.0, 2.0, 3.0], [1.0, 4.0, 3.0]) == pytest.approx(math.sqrt(4 / 3))
    with pytest.raises(ValueError):
        M.rmse([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        M.rmse([], [])
    with pytest.raises(ValueError):
        M.rmse([np.nan], [1.0])


def _train_test():
    uids, iids = np.array([10, 11, 12]), np.array([0, 1, 2])
    # user 10 rates items 0,1 -> mean 3; user 11 rates item 0 -> 5; user 12 has no training rating
    train = Ratings.from_arrays([10, 10, 11], [0, 1, 0], [2.0, 4.0, 5.0], user_ids=uids, item_ids=iids)
    test = Ratings.from_arrays([10, 11, 12, 12], [2, 1, 0, 2], [4.0, 4.0, 3.0, 1.0], user_ids=uids, item_ids=iids)
    return train, test


def test_user_means_fall_back_to_global_mean():
    train, _ = _train_test()
    assert M.user_means(train) == pytest.approx([3.0, 5.0, 11.0 / 3.0])


def test_rating_rmse_with_untrained_items_uses_user_mean():
    train, test = _train_test()
    pred = np.array([9.0, 4.5, 2.0, 9.0])  # CSR order: (10,2), (11,1), (12,0), (12,2)
    trained = np.array([True, True, False])  # item 2 not trained
    # (10,2) -> user mean 3 (err 1); (11,1) -> 4.5 (err .5); (12,0) -> 2 (err 1); (12,2) -> global 11/3
    errs = np.array([1.0, 0.5, 1.0, 11.0 / 3.0 - 1.0])
    got = M.rating_rmse(test, pred, train=train, trained_mask=trained)
    assert got == pytest.approx(math.sqrt(np.mean(errs**2)))
    assert M.rating_rmse(test, pred, train=train) == pytest.approx(math.sqrt(np.mean([25, 0.25, 1, 64])))
    assert M.rating_rmse(test, pred, train=train, clip=(1.0, 5.0)) == pytest.approx(
        math.sqrt(np.mean([1, 0.25, 1, 16]))
    )
    with pytest.raises(ValueError, match="predictions"):
        M.rating_rmse(test, pred[:3], train=train)
    other = Ratings.from_arrays([1], [0], [3.0])
    with pytest.raises(ValueError, match="id spaces"):
        M.rating_rmse(test, pred, train=other)


def test_factor_predictions():
    _, test = _train_test()
    U = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    V = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    assert M.factor_predictions(test, U, V, offset=0.5) == pytest.approx([5.5, 4.5, 3.5, 11.5])


# Three users, six items. Scores descending by item index for all users unless noted.
SCORES = np.array(
    [
        [0.9, 0.8, 0.7, 0.6, 0.5, 0.4],
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
        [0.6, 0.5, 0.4, 0.3, 0.2, 0.1],
    ]
)
HISTORY = [[0, 1], [5], []]
TARGETS = [[2, 4, 5], [0], []]  # third user has no target: ignored


def _disc(p):
    return 1.0 / math.log2(p + 2)


def test_recall_and_ndcg_known_answer_with_history_exclusion():
    # user 0: history {0,1} removed -> top-2 = [2, 3]; hits {2}; recall 1/min(2,3)=.5
    # user 1: history {5} removed -> top-2 = [4, 3]; target {0}: recall 0
    recall = M.recall_at_k(SCORES, TARGETS, HISTORY, k=2)
    assert recall == pytest.approx((0.5 + 0.0) / 2)
    ndcg = M.ndcg_at_k(SCORES, TARGETS, HISTORY, k=2)
    assert ndcg == pytest.approx((_disc(0) / (_disc(0) + _disc(1)) + 0.0) / 2)


def test_denominator_is_min_k_and_target_size():
    # k = 4, user 0: top-4 = [2,3,4,5] hits {2,4,5} -> 3 / min(4, 3) = 1.0
    out = M.ranking_metrics(SCORES, TARGETS, HISTORY, k=4, per_user=True)
    assert out["recall"][0] == pytest.approx(1.0)
    assert out["ndcg"][0] == pytest.approx(
        (_disc(0) + _disc(2) + _disc(3)) / (_disc(0) + _disc(1) + _disc(2))
    )
    # user 1: history {5}; top-4 = [4,3,2,1]; target {0} not reached -> 0
    assert out["recall"][1] == 0.0
    assert out["users"] == 2 and not out["has_target"][2]
    assert out["recall@4"] == pytest.approx(0.5)


def test_without_history_exclusion_history_items_take_slots():
    assert M.recall_at_k(SCORES, TARGETS, None, k=2) == pytest.approx(0.0)


def test_callable_and_topk_lists_match_dense_scores():
    dense = M.ranking_metrics(SCORES, TARGETS, HISTORY, k=3)
    by_fn = M.ranking_metrics(lambda idx: SCORES[idx], TARGETS, HISTORY, k=3, n_items=6, batch_size=2)
    assert by_fn == dense
    lists = [np.argsort(-s) for s in SCORES]  # full rankings incl. history: dropped by the metric
    by_lists = M.ranking_metrics(lists, TARGETS, HISTORY, k=3, n_items=6)
    assert by_lists == dense
    with pytest.raises(ValueError, match="twice"):
        M.ranking_metrics([[2, 2], [1, 0], [0, 1]], TARGETS, HISTORY, k=2, n_items=6)


def test_ratings_and_sparse_inputs():
    uids, iids = np.arange(3), np.arange(6)
    t = Ratings.from_arrays([0, 0, 0, 1], [2, 4, 5, 0], np.ones(4), user_ids=uids, item_ids=iids)
    h = Ratings.from_arrays([0, 0, 1], [0, 1, 5], np.ones(3), user_ids=uids, item_ids=iids)
    assert M.recall_at_k(SCORES, t, h, k=2) == pytest.approx(0.25)
    assert M.recall_at_k(SCORES, t.csr, sp.csr_matrix(h.csr), k=2) == pytest.approx(0.25)


def test_fewer_candidates_than_k_are_padded():
    scores = np.array([[0.3, 0.2, 0.1]])
    top = M.top_k(scores, 5, exclude=[[0]])
    assert top.tolist() == [[1, 2, -1, -1, -1]]
    # target {1,2}: both hit; denominator min(5, 2) = 2
    assert M.recall_at_k(scores, [[1, 2]], [[0]], k=5) == pytest.approx(1.0)


def test_top_k_ties_break_by_lower_index():
    assert M.top_k(np.array([[1.0, 2.0, 2.0, 2.0]]), 2).tolist() == [[1, 2]]


def test_ranking_metrics_errors():
    with pytest.raises(ValueError, match="non-empty target"):
        M.recall_at_k(SCORES, [[], [], []], None, k=2)
    with pytest.raises(ValueError, match="NaN"):
        M.recall_at_k(np.full((3, 6), np.nan), TARGETS, None, k=2)
    with pytest.raises(ValueError, match="shape"):
        M.recall_at_k(SCORES[:2], TARGETS, None, k=2, n_items=6)
    with pytest.raises(ValueError, match="out of range"):
        M.recall_at_k(SCORES, [[7], [], []], None, k=2)
    with pytest.raises(ValueError):
        M.recall_at_k(SCORES, TARGETS, None, k=0)


def test_vectorised_matches_bruteforce_on_random_data():
    rng = np.random.default_rng(0)
    n, m, k = 60, 40, 7
    scores = rng.normal(size=(n, m))
    hist = [rng.choice(m, rng.integers(0, 10), replace=False) for _ in range(n)]
    targ = [np.setdiff1d(rng.choice(m, rng.integers(0, 8), replace=False), h) for h in hist]
    rec, nd = [], []
    for s, h, t in zip(scores, hist, targ, strict=True):
        if len(t) == 0:
            continue
        order = [j for j in np.argsort(-s) if j not in set(h.tolist())][:k]
        hits = [1.0 if j in set(t.tolist()) else 0.0 for j in order]
        rec.append(sum(hits) / min(k, len(t)))
        nd.append(sum(x * _disc(p) for p, x in enumerate(hits)) / sum(_disc(p) for p in range(min(k, len(t)))))
    out = M.ranking_metrics(scores, targ, hist, k=k, batch_size=16)
    assert out["recall@7"] == pytest.approx(np.mean(rec))
    assert out["ndcg@7"] == pytest.approx(np.mean(nd))
    assert out["users"] == len(rec)


def test_top_k_ties_at_the_cut_matches_stable_sort():
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 4, size=(50, 30)).astype(float)  # many ties
    got = M.top_k(scores, 5)
    want = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    assert np.array_equal(got, want)
