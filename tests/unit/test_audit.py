"""The empirical audit (benchmarks/audit.py, SNJ 2023 arXiv:2305.08846): the bound, and that it can fail."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import harness
from benchmarks.audit import audit_dpals, epsilon_lower_bound, one_run_audit, p_value, run


def test_the_one_run_bound_tops_out_where_the_paper_says():
    """All r = m guesses right: ≈ 3.5 with 100 canaries, ≈ 6 with 1,000 (95 %, δ = 0)."""
    assert epsilon_lower_bound(100, 100, 100, 0.0) == pytest.approx(3.49, abs=0.02)
    assert epsilon_lower_bound(1000, 1000, 1000, 0.0) == pytest.approx(5.81, abs=0.02)
    assert epsilon_lower_bound(100, 100, 50, 0.0) == 0.0  # coin-flip accuracy proves nothing
    # δ only weakens the null's rejection
    assert p_value(1000, 200, 180, 1.0, 1e-3) >= p_value(1000, 200, 180, 1.0, 0.0)


def test_random_scores_give_no_bound_and_perfect_scores_a_large_one():
    rng = np.random.default_rng(0)
    included = rng.random(400) < 0.5
    assert one_run_audit(rng.random(400), included).epsilon_lower_bound < 0.5
    assert one_run_audit(included.astype(float), included).epsilon_lower_bound > 3.0


def test_audit_fails_a_run_whose_noise_is_switched_off():
    """The negative control: claimed ε <= 1, noise off through the test-only hook: bound > claim."""
    result, claimed = audit_dpals(1.0, 100, noise=False)
    assert claimed <= 1.0 + 1e-6
    assert result.epsilon_lower_bound > claimed


def test_audit_of_the_noisy_run_stays_below_the_claim():
    result, claimed = audit_dpals(1.0, 100)
    assert result.epsilon_lower_bound <= claimed


def test_audit_suite_is_registered_and_its_quick_rows_are_valid():
    assert harness.SUITES["audit"] == "benchmarks.audit"
    rows = run(quick=True)
    metrics = {(row["algorithm"], row["metric"]) for row in rows}
    for algorithm in ("dpals", "dpals-noise-off"):
        assert {(algorithm, "epsilon_lower_bound"), (algorithm, "epsilon_claimed"), (algorithm, "canaries")} <= metrics
    control = {row["metric"]: row["value"] for row in rows if row["algorithm"] == "dpals-noise-off"}
    assert control["epsilon_lower_bound"] > control["epsilon_claimed"]
