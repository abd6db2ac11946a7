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
    with pytest.raises(TokenError):
        decode_token_cached(f"{head}.{body}.{sig[:-2]}AA", secret=SECRET)
    time.sleep(2.1)  # past exp: the cached entry may not outlive the token
    with pytest.raises(TokenError, match="expired"):
        decode_token_cached(good, secret=SECRET)


def test_ratings_digest_names_the_ratings_as_read() -> None:
    digest = trained_scoring.ratings_digest(["a", "b"], [4.0, 2.0])
    assert digest == trained_scoring.ratings_digest(["a", "b"], [4.0, 2.0])
    assert digest != trained_scoring.ratings_digest(["a", "b"], [4.0, 2.5])
    assert digest != trained_scoring.ratings_digest(["b", "a"], [2.0, 4.0])  # order changes the solve's sums
    assert digest != trained_scoring.ratings_digest(["a"], [4.0])
