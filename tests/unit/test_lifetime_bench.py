"""The ``lifetime`` suite's pieces (issue 29): registered; the arrival generator is a function of its
parameters and seed; the window metric scores the right users, items and positives; the count-level
trained share and the crossings are counted as stated."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pytest

from app.core.mf import dpals
from app.core.mf.dpals import DPALSConfig, calibrate, event_scale
from app.core.mf.model import PublicModel, UserRegularisation
from app.core.privacy.blocks import LEGACY, USER_PERIOD
from benchmarks import harness
from benchmarks import lifetime as L

SMALL = replace(L.STEADY, days=60, arrivals_per_year=3_000.0, initial_items=80, items_per_day=0.5)


def test_the_suite_is_registered() -> None:
    assert harness.SUITES["lifetime"] == "benchmarks.lifetime" and harness.load_suite("lifetime") is L
    assert [p.name for p in L.POLICIES] == ["single-cap", "cohort-blocks", "user-period"]


def test_the_arrival_generator_is_a_function_of_its_parameters_and_seed() -> None:
    one, two, other = L.generate_life("a", SMALL, seed=3), L.generate_life("a", SMALL, seed=3), L.generate_life(
        "a", SMALL, seed=4)
    for name in ("arrival", "release", "users", "items", "values", "day"):
        assert np.array_equal(getattr(one, name), getattr(two, name)), name
    assert not np.array_equal(one.items, other.items)
    assert np.all(np.diff(one.day) >= 0) and np.all(np.diff(one.release) >= 0) and np.all(np.diff(one.arrival) >= 0)
    assert np.all(one.day >= one.arrival[one.users])  # nobody rates before she joins
    assert np.all(one.release[one.items] <= one.day)  # nor an item before its release
    keys = one.users * len(one.release) + one.items
    assert len(np.unique(keys)) == len(keys)  # one rating per (user, item)
    assert set(np.unique(one.values)) <= set(np.arange(1.0, 5.01, 0.5))
    assert one.n_items_at(0) == SMALL.initial_items


def test_a_growing_product_gets_more_users_late_than_early() -> None:
    steady = L.generate_life("s", replace(SMALL, days=365), seed=0)
    growing = L.generate_life("g", replace(SMALL, days=365, growth_per_year=1.0), seed=0)
    late = lambda life: int((life.arrival >= 300).sum())  # noqa: E731
    assert late(growing) > 1.6 * late(steady)
    assert abs(len(steady.arrival) - SMALL.arrivals_per_year) < 5 * np.sqrt(SMALL.arrivals_per_year)


def _tiny_life() -> L.Life:
    """Three users, four items; the window [10, 20)."""
    users = np.array([0, 0, 1, 0, 0, 1, 2, 2])
    items = np.array([0, 1, 0, 2, 3, 1, 0, 3])
    values = np.array([5.0, 2.0, 4.0, 5.0, 3.0, 5.0, 5.0, 4.0])
    day = np.array([1, 2, 3, 12, 13, 14, 15, 16])
    return L.Life("tiny", datetime(2030, 1, 1, tzinfo=UTC), 30, np.array([1, 3, 15]), np.array([0, 0, 0, 11]),
                  users, items, values, day, 10, 10)


def test_the_window_scores_users_with_history_on_the_next_windows_positives() -> None:
    data = L.window_data(_tiny_life(), 10, 10, "ranking")
    assert data.test.user_ids.tolist() == [0, 1]  # user 2 joined inside the window: no history before it
    assert data.history.n_items == 4  # item 3 was released inside the window
    rows, cols = data.test.csr.nonzero()
    assert sorted(zip(rows.tolist(), cols.tolist(), strict=True)) == [(0, 2), (1, 1)]  # user 0's 3.0 is no positive
    rating = L.window_data(_tiny_life(), 10, 10, "rating")
    assert rating.test.nnz == 3 and rating.history.nnz == 3


def _popularity(counts: list[float]) -> PublicModel:
    n = len(counts)
    return PublicModel(algorithm="dpals", item_ids=np.arange(n), item_factors=np.zeros((n, 2)),
                       trained_mask=np.zeros(n, dtype=bool), item_counts=np.asarray(counts), global_mean=0.0,
                       user_reg=UserRegularisation(reg=1.0, exponent=0.0),
                       config={"objective": "ranking", "rating_range": [1.0, 5.0]}, event=None)


def test_window_recall_excludes_every_rated_item_and_counts_the_positives() -> None:
    data = L.window_data(_tiny_life(), 10, 10, "ranking")
    # popularity order 1 > 0 > 2 > 3: user 0 rated 0 and 1, so her top-1 is item 2 (hit); user 1
    # rated item 0, her top-1 is item 1 (hit)
    model = L.popularity_model(_popularity([50.0, 90.0, 20.0, 1.0]))
    assert L.window_recall(model, data, k=1) == pytest.approx(1.0)
    worse = L.popularity_model(_popularity([50.0, 10.0, 20.0, 90.0]))  # item 3 first, then 0, 2, 1
    # user 0: unrated {2, 3} -> top-1 item 3 (miss); user 1: unrated {1, 2, 3} -> item 3 (miss)
    assert L.window_recall(worse, data, k=1) == pytest.approx(0.0)
    assert L.window_recall(worse, data, k=2) == pytest.approx(0.5)  # user 0 finds item 2 second


def test_a_model_is_padded_to_the_catalogue_of_its_window() -> None:
    model = _popularity([3.0, 4.0])
    padded = L.pad_model(model, 4)
    assert padded.n_items == 4 and not padded.trained_mask[2:].any() and np.all(padded.item_counts[2:] == 1.0)
    assert L.pad_model(model, 2) is model


def test_the_count_level_share_counts_only_items_above_three_sigma() -> None:
    counts = np.array([100.0, 31.0, 29.0, 5.0])
    trained = np.array([True, False, True, True])
    assert L.level_share(counts, 10.0, trained) == pytest.approx(0.5)  # items 0 and 1 are above 30
    assert L.level_share(counts, 50.0, trained) is None


def test_a_crossing_counts_when_trained_within_two_periods() -> None:
    above = np.zeros((8, 3), dtype=bool)
    trained = np.zeros((8, 3), dtype=bool)
    above[1:, 0] = True  # crosses on day 1, trained on day 3: in time
    trained[3:, 0] = True
    above[2:, 1] = True  # crosses on day 2, trained on day 5: too late
    trained[5:, 1] = True
    above[[1, 2, 4, 5, 6], 2] = True  # crosses on days 1 and 4 (back above after day 3), never trained
    days, ok = L.crossed_trained(above, trained)
    assert sorted(zip(days.tolist(), ok.tolist(), strict=True)) == [(1, False), (1, True), (2, False), (4, False)]
    late = np.zeros((8, 1), dtype=bool)
    late[6:] = True  # its two periods are not over at the end: left out
    assert len(L.crossed_trained(late, np.zeros((8, 1), dtype=bool))[0]) == 0


def test_the_trained_set_follows_the_count_release_and_the_frequent_rule() -> None:
    config = DPALSConfig(contribution_bound=4, noise_multiplier=1e-6, count_noise_ratio=2.0, frequent_fraction=0.5)
    mask = L.trained_from_counts(np.array([5.0, 50.0, 7.0, 40.0]), config, np.random.default_rng(0))
    assert mask.tolist() == [False, True, False, True]
    # rule 10's count floor frequent_snr·rank·√B·z_gram = 1·2·2·1 = 4: every count from 4 up is trained
    floored = replace(config, noise_multiplier=1.0, frequent_snr=1.0, rank=2, gram_noise_ratio=1.0,
                      count_noise_ratio=1e-6)
    mask = L.trained_from_counts(np.array([5.0, 50.0, 3.0, 40.0]), floored, np.random.default_rng(0))
    assert mask.tolist() == [True, True, False, True]
    # rule 11: the model in force's items stay trained from keep_trained_sigmas·σ = 2·(√4·1·2) = 8 up
    keeping = replace(config, keep_trained_sigmas=2.0, noise_multiplier=1.0, count_noise_ratio=2.0)
    kept = np.array([True, False, True, False, True])
    counts = np.array([9.0, 500.0, 7.5, 400.0, 300.0]) + 1e-9
    rng = np.random.default_rng(0)
    noise = np.random.default_rng(0).normal(0.0, 4.0, 5)
    mask = L.trained_from_counts(counts - noise, keeping, rng, kept)  # the noisy counts are the ones above
    assert mask.tolist() == [True, True, False, True, True]


def test_a_runs_count_noise_is_read_at_the_bound_its_histogram_releases() -> None:
    """The count level's σ is √B·z·ratio at the B the run's own histogram release sets (with the
    run's noise seed, as the trained run draws it), not at the declared largest bound."""
    config = {"contribution_bound": 60, "bound_quantile": 0.5, "bound_scale": 1.0, "bound_min": 5,
              "noise_multiplier": 1e-3, "count_noise_ratio": 2.0, "frequent_fraction": 0.5}
    counts = np.array([9, 10, 12, 11, 0, 13, 10, 9, 10, 11])  # a median of 10 (the user without data is in no bin)
    released = L.released_config(config, counts, L.run_seed(0, 3))
    assert 8 <= released.contribution_bound <= 15 < config["contribution_bound"]
    assert dpals.count_noise_std(released) == pytest.approx(math.sqrt(released.contribution_bound) * 2e-3)
    per_user_block = np.array([[3, 0], [0, 4], [2, 5]])
    assert L.Blocks(["a", "b"], np.array([0, 1])).unit_counts(per_user_block, ["b"]).tolist() == [0, 4, 5]
    assert L.Blocks(["a", "b"], np.array([0, 1])).unit_counts(per_user_block, ["a", "b"]).tolist() == [3, 4, 7]
    periods = L.Blocks(["a", "b"], np.array([0, 1]), unit=USER_PERIOD)
    assert periods.unit_counts(per_user_block, ["a", "b"]).tolist() == [3, 0, 0, 4, 2, 5]


def test_single_cap_keeps_the_last_model_that_read_its_one_block() -> None:
    runs = [L.RunRecord(0, (LEGACY, "2030-01"), {}), L.RunRecord(1, (LEGACY, "2030-01"), {}),
            L.RunRecord(2, ("2030-02",), {}), L.RunRecord(3, (), None)]
    single, blocks, periods = L.POLICIES
    assert L.runs_in_force(runs, single) == [0, 1, 1, 1]
    assert L.runs_in_force(runs, blocks) == [0, 1, 2, 2]  # a refused run changes nothing
    assert L.runs_in_force(runs, periods) == [0, 1, 2, 2]


def _two_month_life() -> L.Life:
    """The tiny life's ratings spread over January and February 2030 (everyone joined in January)."""
    return replace(_tiny_life(), days=60, day=np.array([1, 2, 3, 35, 36, 40, 41, 45]))


def test_user_period_blocks_hold_the_ratings_of_their_month_and_train_one_row_per_user_and_month() -> None:
    life = _two_month_life()
    _, blocks, periods = L.POLICIES
    assert blocks.rating_blocks(life)[0] == ["2030-01"]  # a user's block is the month she joined
    names, codes = periods.rating_blocks(life)
    assert names == ["2030-01", "2030-02"] and codes.tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    every = periods.training_data(life, np.ones(8, dtype=bool), 4)
    assert every.user_ids.tolist() == ["0@2030-01", "0@2030-02", "1@2030-01", "1@2030-02", "2@2030-02"]
    assert every.nnz == 8 and every.n_items == 4
    cols, vals = every.user_row(1)  # user 0's February: items 2 and 3
    assert cols.tolist() == [2, 3] and vals.tolist() == [5.0, 3.0]
    february = periods.training_data(life, L.Blocks(names, codes).reads(["legacy", "2030-02"]), 4)
    assert february.user_ids.tolist() == ["0@2030-02", "1@2030-02", "2@2030-02"] and february.nnz == 5
    users = blocks.training_data(life, np.ones(8, dtype=bool), 4)
    assert users.user_ids.tolist() == [0, 1, 2] and users.nnz == 8


def test_the_per_period_bound_counts_what_each_unit_declares() -> None:
    life = replace(_two_month_life(), max_users_per_period=7)
    single, blocks, periods = L.POLICIES
    assert single.declared_per_period(life) is None and blocks.declared_per_period(life) == 7
    assert periods.declared_per_period(life) == 10  # 3 users rate in February: the next power of ten


def test_the_targets_pass_and_fail_on_their_numbers() -> None:
    life = replace(_tiny_life(), name="x")
    rows = []
    for t, (value, baseline) in {60: (0.90, 1.0), 90: (0.95, 1.0), 120: (1.05, 1.0)}.items():
        rows.append(harness.make_row("lifetime", f"x-rating@day{t:03d}", "cohort-blocks", "rmse", value,
                                     baseline=baseline))
        rows.append(harness.make_row("lifetime", f"x-rating@day{t:03d}", "cohort-blocks", "max_block_epsilon", 9.9))
    rows.append(harness.make_row("lifetime", "x-rating", "cohort-blocks", "crossed_trained_life", 0.96))
    verdicts = {r["metric"]: r["value"] for r in L.targets(rows, life, "rating", [60, 90, 120])}
    assert verdicts == {"target_quality_within_10pct": 0.0, "target_quality_not_below_baseline": 0.0,
                        "target_count_level_trained": 1.0, "target_blocks_within_cap": 1.0}


def test_dpals_calibration_is_memoised_on_the_event_shape() -> None:
    """The memo gives exactly the root search's answer, and configs that differ only outside the
    event (rank, ridge, popularity prior) share one search."""
    from dataclasses import replace as with_

    from app.core.mf.dpals import dpals_event
    from app.core.privacy import accounting

    config = DPALSConfig(rank=4, n_steps=2, noise_multiplier=3.0)
    direct = accounting.calibrate_scale(lambda s: dpals_event(with_(config, noise_multiplier=3.0 * s)), 1.0, 1e-6,
                                        lower=1e-4 / 3.0, upper=1e6 / 3.0)
    assert calibrate(1.0, 1e-6, config).noise_multiplier == 3.0 * direct
    before = event_scale.cache_info()
    other = calibrate(1.0, 1e-6, with_(config, rank=16, reg_item=10.0, user_bias_shrinkage=1.0))
    after = event_scale.cache_info()
    assert other.noise_multiplier == 3.0 * direct and other.rank == 16
    assert after.hits == before.hits + 1 and after.misses == before.misses
    assert calibrate(2.0, 1e-6, config).noise_multiplier < 3.0 * direct
    assert calibrate(1.0, 1e-6, with_(config, n_steps=3)).noise_multiplier > 3.0 * direct  # the shape changed
