"""Per-user self-calibration of the fold-in: each user's ridge chosen by exact
leave-one-out on her own ratings; privileged post-processing of the public model."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.core.data.ratings import Ratings
from app.core.mf import foldin
from app.core.mf.dpals import DPALSConfig, calibrate, train_dpals
from app.core.mf.foldin import (
    CALIBRATION_RIDGES,
    fold_in,
    fold_in_users,
    leave_one_out_press,
    self_calibrated_solve,
    self_calibrating,
)


def _brute_force_press(x: np.ndarray, y: np.ndarray, ridge: float, shared: np.ndarray) -> float:
    total = 0.0
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        u = np.linalg.solve(x[keep].T @ x[keep] + shared + ridge * np.eye(x.shape[1]), x[keep].T @ y[keep])
        total += (y[i] - x[i] @ u) ** 2
    return total


def test_leave_one_out_shortcut_equals_refitting_without_each_rating():
    rng = np.random.default_rng(0)
    x, y, shared = rng.normal(size=(15, 4)), rng.normal(size=15), 0.3 * np.eye(4)
    ridges = np.array([0.01, 0.5, 3.0, 40.0])
    fast = leave_one_out_press(x, y, ridges, shared)
    assert fast == pytest.approx([_brute_force_press(x, y, lam, shared) for lam in ridges], rel=1e-9)


def test_pure_noise_falls_back_to_the_baseline_and_signal_keeps_the_factors():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 5))
    assert not np.any(self_calibrated_solve(x, rng.normal(size=40), 1e-3, None))
    truth = np.array([1.0, -0.5, 0.2, 0.0, 0.8])
    u = self_calibrated_solve(x, x @ truth + 0.05 * rng.normal(size=40), 1e-3, None)
    assert np.linalg.norm(u - truth) < 0.05
    # a noisy user gets a larger ridge than the model's: her solution is shrunk towards 0
    y = x @ truth + 3.0 * rng.normal(size=40)
    plain = np.linalg.solve(x.T @ x + 1e-3 * np.eye(5), x.T @ y)
    assert np.linalg.norm(self_calibrated_solve(x, y, 1e-3, None)) < np.linalg.norm(plain)
    assert CALIBRATION_RIDGES[0] == 0.0  # the model's own ridge is a candidate (for a user with enough ratings)


def test_a_dozen_ratings_do_not_pick_the_weakest_ridge_by_chance(monkeypatch: pytest.MonkeyPatch):
    """Selection optimism (issue 27): with 6-12 noisy ratings, the smallest leave-out error over
    ridges down to the model's own picks a weak ridge by chance and extrapolates badly; without
    the candidates below 1/4 of the mean eigenvalue for such users the held-out error is clearly lower."""
    rng = np.random.default_rng(0)
    factors = 2.0 * rng.normal(size=(100, 8))

    def held_out_error() -> float:
        draws = np.random.default_rng(5)
        total = 0.0
        for _ in range(300):
            items = draws.permutation(100)
            seen, unseen = items[: draws.integers(6, 13)], items[-20:]
            taste = 0.15 * draws.normal(size=8)
            y = factors[seen] @ taste + 4.0 * draws.normal(size=len(seen))
            user = self_calibrated_solve(factors[seen], y, 1e-3, None)
            truth = factors[unseen] @ taste + 4.0 * draws.normal(size=20)
            total += float(np.mean((factors[unseen] @ user - truth) ** 2))
        return total / 300

    floor = held_out_error()
    monkeypatch.setattr(foldin, "RELIABLE_RATINGS_PER_DIM", 0)  # every candidate for everyone
    assert floor < 0.85 * held_out_error()


def test_service_fold_in_and_batched_evaluation_use_the_same_calibration():
    rng = np.random.default_rng(2)
    n_users, n_items = 300, 40
    taste = rng.normal(size=(n_users, 2)) @ rng.normal(size=(2, n_items))
    mask = rng.random((n_users, n_items)) < 0.5
    rows, cols = np.nonzero(mask)
    values = np.clip(np.round(3 + taste[rows, cols] + 0.5 * rng.normal(size=len(rows))), 1, 5)
    data = Ratings.from_arrays(rows, cols, values, item_ids=np.arange(n_items))
    config = DPALSConfig(rank=4, frequent_fraction=1.0, self_calibration=True, seed=0)
    model = train_dpals(data, calibrate(20.0, 1e-6, config))
    assert self_calibrating(model)
    batched = fold_in_users(model, data)
    for user in range(0, n_users, 29):
        items, ratings = data.user_row(user)
        assert fold_in(model, items, ratings) == pytest.approx(batched[user], abs=1e-9)
    plain = replace(model, config={**model.config, "self_calibration": False})
    assert not np.allclose(fold_in_users(plain, data), batched)  # the calibration changes some users
    ranking = replace(model, config={**model.config, "objective": "ranking"})
    assert not self_calibrating(ranking)  # positives only: no leave-out on all-ones targets
    with pytest.raises(ValueError):
        DPALSConfig(self_calibration="yes")
