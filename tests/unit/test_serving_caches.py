"""Serving hot-path machinery: trained-rows top-N equals the full path bit for bit, the user
state cache is keyed by what it depends on, and cached token verification refuses what
``decode_token`` refuses."""

from __future__ import annotations

import time

import numpy as np
import pytest

from app.auth import TokenError, decode_token_cached, issue_token
from app.core.algorithms import get_algorithm
from app.core.mf import foldin
from app.core.mf.model import PublicModel, UserRegularisation
from app.services.serving import trained_scoring

SECRET = "unit-serving-secret-0123456789abcdef"


def _model(n_items: int = 3_000, rank: int = 16, seed: int = 0) -> PublicModel:
    rng = np.random.default_rng(seed)
    trained = rng.random(n_items) < 0.3
    factors = rng.normal(size=(n_items, rank)) * trained[:, None]
    return PublicModel(algorithm="dpals", item_ids=np.arange(n_items), item_factors=factors, trained_mask=trained,
                       item_counts=np.ones(n_items), global_mean=3.5,
                       user_reg=UserRegularisation(reg=2.0, exponent=0.5, gravity=0.1, bias_shrinkage=5.0),
                       config={"clip_rating": 2.0}, event=None, item_biases=rng.normal(scale=0.3, size=n_items))


@pytest.mark.parametrize("seed", range(5))
def test_trained_rows_top_n_is_the_full_paths_top_n_bit_for_bit(seed: int) -> None:
    model = _model(seed=seed)
    rng = np.random.default_rng(100 + seed)
    rated = rng.choice(model.n_items, size=40, replace=False)
    values = rng.uniform(0.5, 5.0, size=40)
    allowed = rng.random(model.n_items) < 0.8
    allowed[rated] = False
    full = foldin.user_scores(model, rated, values)
    want_idx, want_top = foldin.top_n(full, 25, np.flatnonzero(allowed & model.trained_mask))
    view = trained_scoring.trained_rows(model)
    vector, offset = trained_scoring.user_state(model, ("unit", seed), rated, values)
    scores = trained_scoring.trained_scores(model, view, vector, offset)
    assert np.array_equal(scores, full[view.rows])
    got_idx, got_top = trained_scoring.trained_top_n(view, scores, 25, allowed)
    assert np.array_equal(got_idx, want_idx) and np.array_equal(got_top, want_top)

def _reference_top_n(model: PublicModel, view, vector, offset, n, allowed, scale):
    """Ranked by the unclipped float64 score over every trained row, shown clipped."""
    scores = trained_scoring.trained_scores(model, view, vector, offset)
    rows, top = trained_scoring.trained_top_n(view, scores, n, allowed)
    return rows, top if scale is None else np.clip(top, *scale)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("case", ["plain", "clipped-top", "clipped-bottom", "few-allowed", "duplicate-rows", "near-ties"])
def test_preselected_top_n_is_the_float64_top_n(seed: int, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """top_n_scores (float32 preselection, float64 scores for the candidates) chooses exactly the
    items, order and ties of the float64 product over every trained row, ranked by the unclipped
    score whatever the scale (clipped-top: many items above it; clipped-bottom: the scale's bottom
    above nearly every score) and shown clipped. Its scores are float64
    dot products of the same rows, equal to the full product's up to the last bits: BLAS rounds a
    row differently depending on where it falls in the matrix (OpenBLAS: the last rows beyond a
    multiple of 4), so not even the full and the trained-rows products agree bit for bit in general."""
    model = _model(n_items=6_000, rank=64, seed=seed)
    trained = np.flatnonzero(model.trained_mask)
    if case == "duplicate-rows":  # exactly equal scores: order by row
        model.item_factors[trained[1::2]] = model.item_factors[trained[0]]
        model.item_biases[trained] = 0.25
    rng = np.random.default_rng(200 + seed)
    if case == "near-ties":  # scores ~1e-7 apart, float32's own resolution: the bound must keep them
        jitter = 1 + 1e-7 * rng.normal(size=(len(trained), model.rank))
        model.item_factors[trained] = model.item_factors[trained[0]] * jitter
        model.item_biases[trained] = 0.0
    rated = rng.choice(np.flatnonzero(model.trained_mask), size=40, replace=False)
    vector, offset = trained_scoring.user_state(model, ("pre", case, seed), rated, rng.uniform(0.5, 5.0, size=40))
    allowed = rng.random(model.n_items) < (0.004 if case == "few-allowed" else 0.8)
    scores = trained_scoring.trained_scores(model, trained_scoring.trained_rows(model), vector, offset)
    scale = {"clipped-top": (0.5, float(np.quantile(scores, 0.97))),
             "clipped-bottom": (float(np.quantile(scores, 0.999)), 10.0)}.get(case, (0.5, 5.0))
    view = trained_scoring.trained_rows(model)
    full_products: list[int] = []
    full = trained_scoring.trained_scores
    for n in (1, 10, 25, 200):
        want_idx, want_top = _reference_top_n(model, view, vector, offset, n, allowed, scale)
        monkeypatch.setattr(trained_scoring, "trained_scores", lambda *a, n=n: full_products.append(n) or full(*a))
        got_idx, got_top = trained_scoring.top_n_scores(model, view, vector, offset, n, allowed, scale)
        monkeypatch.undo()
        assert np.array_equal(got_idx, want_idx)
        np.testing.assert_array_max_ulp(got_top, want_top, maxulp=4)
    if case == "few-allowed":  # fewer than n allowed
        assert 200 in full_products
    else:
        assert not full_products  # the float32 preselection decided, clipped scores or not


def test_preselection_scores_every_row_when_float32_cannot_hold_the_factors() -> None:
    model = _model(rank=8)
    model.item_factors[np.flatnonzero(model.trained_mask)[0], 0] = 1e39
    view = trained_scoring.trained_rows(model)
    assert view.factors32 is None
    vector = np.full(8, 1e-40)
    allowed = np.ones(model.n_items, dtype=bool)
    got = trained_scoring.top_n_scores(model, view, vector, 3.0, 5, allowed, None)
    want = _reference_top_n(model, view, vector, 3.0, 5, allowed, None)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@pytest.mark.parametrize(("name", "kind", "expected"), [
    ("dpals", "predicted_rating", True), ("dpcmf", "predicted_rating", True), ("dpals", "ranking_score", False),
    ("dpfw", "predicted_rating", False), ("onebit", "p_thumbs_up", False)])
def test_trained_rows_path_applies_to_the_registered_fold_in_algorithms(name: str, kind: str, expected: bool) -> None:
    assert trained_scoring.applies(get_algorithm(name), kind) is expected


def test_user_state_is_reused_only_under_the_same_key() -> None:
    trained_scoring.clear_user_states()
    model = _model()
    rated, values = np.flatnonzero(model.trained_mask)[:10], np.full(10, 5.0)
    first = trained_scoring.user_state(model, ("v1", "u", 1), rated, values)
    assert trained_scoring.user_state(model, ("v1", "u", 1), rated, values[:0]) is first  # cached
    other = trained_scoring.user_state(model, ("v1", "u", 2), rated, np.full(10, 1.0))
    assert not np.array_equal(other[0], first[0])
    assert not first[0].flags.writeable


def test_cached_token_verification_refuses_what_decode_refuses() -> None:
    good = issue_token("alice", secret=SECRET, ttl_seconds=1)
    assert decode_token_cached(good, secret=SECRET).subject == "alice"
    assert decode_token_cached(good, secret=SECRET).subject == "alice"  # from the cache
    with pytest.raises(TokenError):
        decode_token_cached(good, secret=SECRET + "-rotated")
    head, body, sig = good.split(".")
    tampered = sig[:4] + ("B" if sig[4] == "A" else "A") + sig[5:]  # a changed leading char always changes a byte
    with pytest.raises(TokenError):
        decode_token_cached(f"{head}.{body}.{tampered}", secret=SECRET)
    time.sleep(2.1)  # past exp: the cached entry may not outlive the token
    with pytest.raises(TokenError, match="expired"):
        decode_token_cached(good, secret=SECRET)


def test_ratings_digest_names_the_ratings_as_read() -> None:
    digest = trained_scoring.ratings_digest(["a", "b"], [4.0, 2.0])
    assert digest == trained_scoring.ratings_digest(["a", "b"], [4.0, 2.0])
    assert digest != trained_scoring.ratings_digest(["a", "b"], [4.0, 2.5])
    assert digest != trained_scoring.ratings_digest(["b", "a"], [2.0, 4.0])  # order changes the solve's sums
    assert digest != trained_scoring.ratings_digest(["a"], [4.0])


def _above_the_scale(n_items: int = 3_000) -> tuple[PublicModel, np.ndarray, np.ndarray]:
    """A model whose predicted ratings for four trained items lie above the top of the scale
    (1, 5), the higher the later the row: clipped, all four would tie at 5 and rank by row."""
    model = _model(n_items=n_items, rank=8, seed=7)
    trained = np.flatnonzero(model.trained_mask)
    model.item_factors[trained] *= 1e-3  # every other item's rating ~ m̃ + b̃_j, well inside the scale
    model.item_biases[trained] = np.clip(model.item_biases[trained], -0.4, 0.4)
    high = trained[[10, 200, 400, 600]]
    model.item_biases[high] = [1.75, 2.0, 2.5, 3.5]  # with m̃ = 3.5: 5.25, 5.5, 6.0, 7.0
    return model, high, np.zeros(model.rank)


def test_items_above_the_scale_rank_by_their_unclipped_ratings_in_both_paths() -> None:
    """Ties at the top of the scale (issue 27 item 4): the full path (foldin.top_n / recommend with
    the scale) and the trained fast path rank by the unclipped rating, show the clipped one, and
    agree exactly."""
    model, high, vector = _above_the_scale()
    scale = (1.0, 5.0)
    allowed = np.ones(model.n_items, dtype=bool)
    full = foldin.predict_ratings(model, vector, None)
    want = high[::-1]  # 7.0, 6.0, 5.5, 5.25
    full_idx, full_top = foldin.top_n(full, 4, np.flatnonzero(model.trained_mask), scale)
    view = trained_scoring.trained_rows(model)
    fast_idx, fast_top = trained_scoring.top_n_scores(model, view, vector, None, 4, allowed, scale)
    assert np.array_equal(full_idx, want) and np.array_equal(fast_idx, want)
    assert np.array_equal(full_top, np.full(4, 5.0)) and np.array_equal(fast_top, full_top)
    mask_idx, mask_top = foldin.top_n_allowed(full, 4, model.trained_mask, scale)
    assert np.array_equal(mask_idx, want) and np.array_equal(mask_top, full_top)
    order, shown = foldin.ranked(full[high], scale)  # a given list of items, ranked
    assert np.array_equal(high[order], want) and np.array_equal(shown, full_top)
    # more than the items above the scale: the rest follow, unclipped and unchanged
    full_idx, full_top = foldin.top_n(full, 10, np.flatnonzero(model.trained_mask), scale)
    fast_idx, fast_top = trained_scoring.top_n_scores(model, view, vector, None, 10, allowed, scale)
    assert np.array_equal(fast_idx, full_idx) and np.array_equal(full_idx[:4], want)
    assert np.all(full_top[4:] < 5.0) and np.array_equal(full_top[4:], full[full_idx[4:]])
    np.testing.assert_array_max_ulp(fast_top, full_top, maxulp=4)


def test_recommend_ranks_a_users_items_above_the_scale_by_unclipped_rating() -> None:
    """foldin.recommend with the scale: a user's fold-in puts items above the top; the highest
    unclipped rating comes first, equal unclipped ratings still by row."""
    model, high, _ = _above_the_scale()
    twin = np.flatnonzero(model.trained_mask)[800]  # a copy of the best item, later row: tied with it
    model.item_factors[[high[-1], twin]] = 0.0  # both ratings exactly m̃ + b_u + b̃_j, on any BLAS
    model.item_biases[twin] = model.item_biases[high[-1]]
    rated = np.flatnonzero(model.trained_mask)[1:9]
    idx, top = foldin.recommend(model, rated, np.full(8, 3.5), 5, scale=(1.0, 5.0))
    raw = foldin.user_scores(model, rated, np.full(8, 3.5))
    assert np.all(raw[idx] > 5.0) and np.array_equal(top, np.full(5, 5.0))
    assert list(idx) == sorted(idx, key=lambda j: (-raw[j], j))
    assert list(idx[:2]) == [high[-1], twin]
    view = trained_scoring.trained_rows(model)
    vector, offset = trained_scoring.user_state(model, ("tie", 1), rated, np.full(8, 3.5))
    allowed = np.ones(model.n_items, dtype=bool)
    allowed[rated] = False
    fast_idx, fast_top = trained_scoring.top_n_scores(model, view, vector, offset, 5, allowed, (1.0, 5.0))
    assert np.array_equal(fast_idx, idx) and np.array_equal(fast_top, top)
