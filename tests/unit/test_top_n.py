"""foldin.top_n: the n best finite scores, best first, equal scores by candidate order, exactly
(its strided-sample preselection never changes the answer)."""

from __future__ import annotations

import numpy as np
import pytest

from app.core.mf import foldin


def _reference(scores: np.ndarray, n: int, candidates: np.ndarray) -> np.ndarray:
    """Sort every finite candidate by (-score, its position among the candidates)."""
    finite = [(-float(scores[c]), k, int(c)) for k, c in enumerate(candidates) if np.isfinite(scores[c])]
    return np.array([c for _, _, c in sorted(finite)[:n]], dtype=np.int64)


def _scores(rng: np.random.Generator, size: int, kind: str) -> np.ndarray:
    if kind == "continuous":
        return rng.normal(3.5, 0.7, size)
    if kind == "ties":  # few distinct values: ties everywhere, including at the n-th place
        return rng.integers(0, 6, size).astype(np.float64) / 2
    if kind == "constant":
        return np.full(size, 2.5)
    if kind == "ascending":  # the sample sees the smallest values of each stride
        return np.arange(size, dtype=np.float64)
    values = rng.normal(size=size)  # non-finite values sprinkled in
    values[rng.random(size) < 0.2] = np.nan
    values[rng.random(size) < 0.05] = np.inf
    values[rng.random(size) < 0.05] = -np.inf
    return values


@pytest.mark.parametrize("kind", ["continuous", "ties", "constant", "ascending", "non-finite"])
@pytest.mark.parametrize("size", [0, 1, 7, 300, 700, 8_000, 20_000])
@pytest.mark.parametrize("n", [1, 5, 20, 1000])
def test_top_n_is_the_reference_choice(kind: str, size: int, n: int) -> None:
    rng = np.random.default_rng(size * 31 + n)
    scores = _scores(rng, size, kind)
    allowed = rng.random(size) < 0.7
    candidates = np.flatnonzero(allowed)
    want = _reference(scores, n, candidates)
    got, top = foldin.top_n(scores, n, candidates)
    assert np.array_equal(got, want) and np.array_equal(top, scores[want])
    got_mask, top_mask = foldin.top_n_allowed(scores, n, allowed)
    assert np.array_equal(got_mask, want) and np.array_equal(top_mask, scores[want])


def test_few_allowed_items_far_apart() -> None:
    scores = np.random.default_rng(0).normal(size=20_000)
    allowed = np.zeros(20_000, dtype=bool)
    allowed[[5, 9_000, 19_999]] = True  # the strided sample holds fewer than n of them
    got, _ = foldin.top_n_allowed(scores, 20, allowed)
    assert np.array_equal(got, _reference(scores, 20, np.flatnonzero(allowed)))


def test_n_must_be_positive() -> None:
    with pytest.raises(ValueError):
        foldin.top_n(np.ones(3), 0, np.arange(3))
    with pytest.raises(ValueError):
        foldin.top_n_allowed(np.ones(3), 0, np.ones(3, dtype=bool))
