"""Keyed randomness and exact sums (docs/algorithms.md §7): each draw a function of the secret seed
and a public index only, each released statistic exact in any order, within its sensitivity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.core.privacy import keyed as keyed_module
from app.core.privacy.discrete_noise import discrete_gaussian_pmf, noise_switched_off
from app.core.privacy.exact_sums import exact_bincount, exact_sum, fixed_quantum, fixed_terms, floor_weights
from app.core.privacy.keyed import KeyedRandomness, keyed_discrete_gaussian, stream_discrete_gaussian, user_hashes

SEED = (1 << 127) + 987


@pytest.mark.parametrize("sigma", [1, 3, 977, 1 << 20])
def test_the_compiled_draws_are_the_reference_streams(sigma: int):
    key = KeyedRandomness(SEED).noise(4).at(np.zeros(1))._key
    indices = np.array([0, 5, 3, 1 << 40, 17])
    drawn = keyed_discrete_gaussian(key, sigma, indices, 257)
    for row, index in zip(drawn, indices, strict=True):
        np.testing.assert_array_equal(row, stream_discrete_gaussian(key, sigma, int(index), 257))
    # a row depends on its index only: any subset, order or batch gives the same draws
    again = keyed_discrete_gaussian(key, sigma, indices[::-1][:3], 257)
    np.testing.assert_array_equal(again, drawn[::-1][:3])


def test_indices_the_fast_pass_leaves_open_are_redrawn_exactly(monkeypatch: pytest.MonkeyPatch):
    """A first block too short for the draws (forced here) sends the index to the reference,
    which continues its stream: the same numbers as the reference alone, and as with a long block
    wherever the long block's first proposals suffice."""
    key = KeyedRandomness(SEED).key(3, 9)
    monkeypatch.setattr(keyed_module, "_proposal_budget", lambda n: max(1, n // 3))
    short = keyed_discrete_gaussian(key, 50, np.arange(6), 300)
    for index in range(6):
        np.testing.assert_array_equal(short[index], stream_discrete_gaussian(key, 50, index, 300))


def test_keyed_draws_follow_the_discrete_gaussian():
    key = KeyedRandomness(SEED).key(3, 1)
    draws = keyed_discrete_gaussian(key, 3, np.arange(400), 500).ravel()
    support = np.arange(-15, 16)
    observed = np.array([(draws == x).sum() for x in support])
    expected = discrete_gaussian_pmf(3, support) * draws.size
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 70  # 31 cells: the 99.99 % quantile of chi² with 30 degrees of freedom is ≈ 67
    # rows of different indices are independent: no correlation between neighbouring streams
    rows = keyed_discrete_gaussian(key, 1000, np.arange(200), 200).astype(np.float64)
    assert abs(np.corrcoef(rows[:-1].ravel(), rows[1:].ravel())[0, 1]) < 0.02


def test_keyed_draws_respect_the_audit_switch():
    key = KeyedRandomness(SEED).key(3, 1)
    with noise_switched_off():
        assert not keyed_discrete_gaussian(key, 10, np.arange(3), 8).any()


def test_the_seed_stays_secret_and_every_bit_counts():
    keyed = KeyedRandomness(SEED)
    assert str(SEED) not in repr(keyed) and str(SEED) not in repr(keyed.noise(0))
    assert str(SEED) not in repr(keyed.noise(0).at(np.arange(3)))
    other = KeyedRandomness(SEED + (1 << 100))
    assert not np.array_equal(keyed.key(3, 0), other.key(3, 0))
    assert not np.array_equal(keyed.key(3, 0), keyed.key(3, 1))  # each release its own key


def test_rating_keys_depend_on_the_user_id_and_item_only():
    keyed = KeyedRandomness(SEED)
    ids = np.array([10, 7, 123456789012, -3])
    hashes = user_hashes(ids)
    items = np.array([0, 4, 4, 2])
    keys = keyed.rating_uniforms(0, hashes, items)
    assert np.all((keys >= 0) & (keys < 1))
    # the same (user, item) alone, or with other users, gets the same key
    assert keyed.rating_uniforms(0, user_hashes(ids[2:3]), items[2:3])[0] == keys[2]
    assert not np.array_equal(keyed.rating_uniforms(1, hashes, items), keys)  # stages differ
    strings = user_hashes(np.array(["a", "b", "a"], dtype=object))
    assert strings[0] == strings[2] != strings[1]
    many = keyed.rating_uniforms(0, user_hashes(np.arange(20_000)), np.zeros(20_000, dtype=np.int64))
    assert abs(many.mean() - 0.5) < 0.01 and abs(many.var() - 1 / 12) < 0.003


@pytest.mark.parametrize("bound", [0.7, 1.0, 2.0, 1.5, 1e-3, 4.5])
def test_fixed_terms_stay_within_their_bound_and_sums_are_exact_in_any_order(bound: float):
    rng = np.random.default_rng(int(bound * 1000))
    values = np.concatenate([rng.uniform(-bound, bound, 50_000), [bound, -bound, bound * (1 + 1e-15)]])
    terms = fixed_terms(values, bound)
    step = fixed_quantum(bound)
    assert math.log2(step).is_integer() and 2**20 <= bound / step < 2**21
    assert np.all(np.abs(terms * step) <= bound)  # the per-term bound the sensitivity uses holds
    error = np.abs(terms * step - np.clip(values, -bound, bound))
    assert np.all(error <= step)  # half a quantum, or one within a quantum of the bound (the clip)
    inner = np.abs(values) <= bound - step
    assert np.all(error[inner] <= step / 2)
    total = exact_sum(terms, bound)
    assert exact_sum(terms[rng.permutation(len(terms))], bound) == total
    assert total == float(terms.astype(np.int64).sum()) * step  # the integer sum, scaled
    parts = np.array_split(terms, 7)
    assert sum(exact_sum(p, bound) for p in parts[::-1]) == total
    bins = rng.integers(0, 30, len(terms))
    by_bin = exact_bincount(bins, terms, 30, bound)
    order = rng.permutation(len(terms))
    np.testing.assert_array_equal(exact_bincount(bins[order], terms[order], 30, bound), by_bin)


def test_rounded_weights_keep_each_users_weight_budget():
    """Σ_j ĉ_ij² <= B for every user, checked on the rounded weights themselves (the recount,
    Gram and linear sensitivities all read them)."""
    from app.core.mf.dpals import adaptive_weights

    rng = np.random.default_rng(0)
    for budget, shares in ((1.0, None), (7.0, None), (240.0, None), (1e4, None), (60.0, 0.25), (7.0, 0.01)):
        rows = np.sort(rng.integers(0, 3_000, 60_000))
        counts = rng.uniform(1, 5_000, 60_000)
        # rule 12: some items take a smaller share of each user's budget; the budget itself does not move
        entry_shares = None if shares is None else np.where(rng.random(len(rows)) < 0.3, shares, 1.0)
        weights = adaptive_weights(rows, counts, budget, -0.5, entry_shares)
        per_user = np.bincount(rows, weights=weights**2)
        assert np.all(per_user <= budget)
        if entry_shares is not None:  # within a user, ĉ_ij² ∝ s_j c̃_j^{2μ} (up to the grid's rounding)
            ratio = weights**2 * counts / entry_shares
            assert np.allclose(ratio, np.bincount(rows, weights=ratio)[rows] / np.bincount(rows)[rows], rtol=1e-3)
        assert np.all(per_user[per_user > 0] >= budget * (1 - 1e-5))  # the rounding takes almost nothing
        step = fixed_quantum(math.sqrt(budget))
        assert np.array_equal(weights / step, np.floor(weights / step))  # multiples of the public quantum
    assert np.all(floor_weights(np.array([0.0, 1.0]), 1.0) == [0.0, 2**20 - 1])


def test_stream_states_are_numpy_sfc64_seeded_by_the_keyed_hashes():
    """The compiled seeding equals its definition: three keyed hashes of (key, j) as SFC64's words,
    counter 1, then numpy's own SFC64 stepped 12 times."""
    key = KeyedRandomness(SEED).key(3, 1)
    indices = np.array([0, 1, 5, 1 << 40, 12345])
    states = keyed_module.stream_state(key, indices)
    bit_generator = np.random.SFC64()
    for index, state in zip(indices, states, strict=True):
        words = [keyed_module._keyed_hash(key, np.array([index], dtype=np.uint64), np.array([w], dtype=np.uint64))[0]
                 for w in (1, 2, 3)]
        seeded = np.array([*words, 1], dtype=np.uint64)
        bit_generator.state = {"bit_generator": "SFC64", "state": {"state": seeded}, "has_uint32": 0, "uinteger": 0}
        bit_generator.random_raw(12)
        np.testing.assert_array_equal(np.asarray(bit_generator.state["state"]["state"], dtype=np.uint64), state)
