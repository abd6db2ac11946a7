"""The empirical audit (benchmarks/audit.py, SNJ 2023 arXiv:2305.08846): the bound, one canary family
per release of the service's default DPALS, DP-CMF, DPFW (dense and Oja) and one-bit runs (and of
DPALS's per-rating DP mean, one-bit's GraP, OutP and ObjP), and that switching off any one release's
noise is caught.

Cost: 3 honest + 3 per release default-config trainings of small synthetic worlds (≈ 290 users and
720 items; DPFW 336 and 2100 items; one-bit 72 voters, 148 items), 18 for DPALS's and DP-CMF's
``user_count`` (one canary a run): 18 + 7·3 + 18 = 57 DPALS, 57 DP-CMF, 3 + 8·3 DPALS with the
per-rating mean, 2 × 9 DPFW, 4 × 6 one-bit, plus one each for the coverage check; 25-40 s on 2
shared cores once numba's on-disk cache is warm (its first compile adds ≈ 15 s).
Seeds are fixed (worlds and noise 0, 1, 2, and up to 17 for ``user_count``), so the honest runs
cannot flake above their claim; every bound is a 95 % lower bound.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from app.core.privacy.releaser import audit_tap
from benchmarks import harness
from benchmarks.audit import (
    HISTOGRAM_CANARIES,
    RATING_RANGE,
    RELEASES,
    RUNS,
    UNAUDITED,
    USER_MEAN_CANARIES,
    VARIANTS,
    ReleaseAudit,
    audit_algorithm,
    canary_world,
    decoded_audit,
    default_config,
    epsilon_lower_bound,
    family_runs,
    markdown_table,
    one_run_audit,
    p_value,
    released_names,
    rows_for,
    train_run,
)

ROOT = Path(__file__).resolve().parents[2]


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
    assert decoded_audit(included, included).epsilon_lower_bound > 3.0
    assert decoded_audit(rng.random(400) < 0.5, included).epsilon_lower_bound < 0.5


def test_abstaining_canaries_are_never_guessed():
    """NaN scores abstain: perfect scores on half the canaries, NaN on the rest, guess only the half."""
    included = np.arange(200) % 2 == 0
    scores = np.where(np.arange(200) < 100, included.astype(float), np.nan)
    result = one_run_audit(scores, included)
    assert result.correct == result.guesses <= 100


@pytest.fixture(scope="module")
def audits() -> dict[str, list[ReleaseAudit]]:
    return {algorithm: audit_algorithm(algorithm, 1.0) for algorithm in RELEASES}


def test_the_audited_config_is_the_registrys_default():
    """The run is the one an admin's request without hyper-parameters gets (the ε-aware rule)."""
    for algorithm in ("dpals", "dpcmf"):
        config = default_config(algorithm, 1.0, canary_world(0), 0)
        assert config.defaults_rule is not None
        # issue 27: k from a DP quantile (its histogram audited) and the user-level mean
        assert config.bound_quantile is not None and config.bound_min < config.contribution_bound
        assert config.mean_mode == "dp_user"


def test_the_per_rating_mean_variant_pins_the_bound():
    """``dpals-dp-mean`` audits mean_mode "dp" with k pinned at the largest bound (the mean canaries'
    ratings all sampled); it still releases the count histogram."""
    world = canary_world(0, RELEASES["dpals-dp-mean"])
    config = default_config("dpals", 1.0, world, 0, dict(VARIANTS["dpals-dp-mean"].params))
    assert config.mean_mode == "dp" and config.bound_quantile is not None
    assert config.bound_min == config.contribution_bound


def test_decoded_canaries_move_their_release_by_their_own_unit():
    """Histogram canary b has 2^b ratings (bin b, alone there among its family); user-mean canary i
    the mean offset (h/32)·2^i; the user-count canary one rating; the included ones are in the data."""
    world = canary_world(0)
    counts = dict(zip(world.ratings.user_ids.tolist(), world.ratings.user_counts().tolist(), strict=True))
    rows, _, values = world.ratings.coo()
    offsets = np.bincount(rows, weights=values - 3.0) / np.maximum(world.ratings.user_counts(), 1)
    offset = dict(zip(world.ratings.user_ids.tolist(), offsets.tolist(), strict=True))
    half_range = 0.5 * (RATING_RANGE[1] - RATING_RANGE[0])
    for group, m in (("bound_histogram", HISTOGRAM_CANARIES), ("user_mean", USER_MEAN_CANARIES), ("user_count", 1)):
        users, included = world.canary_users[group], world.included[group]
        assert len(users) == len(included) == m and included.any()
        assert set(users[~included].tolist()).isdisjoint(counts)
        for i in np.flatnonzero(included):
            user = int(users[i])
            if group == "bound_histogram":
                assert counts[user] == 2**i and offset[user] == 0.0
            elif group == "user_mean":
                assert offset[user] == pytest.approx(half_range / 32 * 2**i)
            else:
                assert counts[user] == 1


@pytest.mark.parametrize("algorithm", sorted(RELEASES))
def test_every_release_of_the_default_run_has_a_canary_family(algorithm):
    assert released_names(train_run(algorithm, 1.0, 0)) == set(RELEASES[algorithm]) | set(UNAUDITED.get(algorithm, ()))


@pytest.mark.parametrize(("algorithm", "release"), [(a, r) for a, releases in RELEASES.items() for r in releases])
def test_switching_off_one_release_is_caught_and_the_honest_run_is_not(algorithm, release, audits):
    """Noise off for ``release`` alone: its family's bound exceeds the claim (<= 1); with all noise
    on, the same family stays at or below it."""
    (audit,) = [a for a in audits[algorithm] if a.release == release]
    assert audit.claimed <= 1.0 + 1e-6
    assert audit.noise_off.epsilon_lower_bound > audit.claimed
    assert audit.honest.epsilon_lower_bound <= audit.claimed
    assert audit.runs == family_runs(release) and audit.noise_off.canaries >= 18


def test_one_canary_a_run_families_pool_more_worlds(audits):
    """``user_count`` has one canary a run: it pools 6·RUNS worlds, honest and noise off alike."""
    for algorithm in ("dpals", "dpcmf"):
        (audit,) = [a for a in audits[algorithm] if a.release == "user_count"]
        assert audit.runs == 6 * RUNS
        assert audit.honest.canaries == audit.noise_off.canaries == 6 * RUNS


def test_switching_off_a_release_the_run_does_not_make_is_an_error():
    with pytest.raises(ValueError, match="no release named"):
        train_run("dpals", 1.0, 0, noise_off="gravity_gram")  # the default run has no gravity term


def test_the_tap_records_nothing_outside_its_context():
    with audit_tap() as tap:
        pass
    assert not tap.outputs and not tap.rows and not tap.switched_off


def test_only_tests_and_benchmarks_reach_the_noise_hooks():
    """The hooks are context variables set only by tests and benchmarks: no API, service or worker
    module imports them."""
    hooks = {"audit_tap", "noise_switched_off"}
    for path in [*(ROOT / "app").rglob("*.py"), *(ROOT / "workers").rglob("*.py")]:
        if path.parts[-3:-1] == ("core", "privacy"):
            continue  # where they are defined
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                assert not hooks & {alias.name for alias in node.names}, path
            if isinstance(node, ast.Attribute):
                assert node.attr not in hooks, path


def test_audit_suite_is_registered_and_its_rows_are_valid(audits):
    assert harness.SUITES["audit"] == "benchmarks.audit"
    for algorithm, results in audits.items():
        rows = rows_for(algorithm, 1.0, results)
        by_release: dict[str, dict[str, float]] = {}
        for row in rows:
            harness.validate_row(row)
            by_release.setdefault(row["dataset"], {})[row["metric"]] = row["value"]
        assert len(by_release) == len(RELEASES[algorithm])
        for metrics in by_release.values():
            assert metrics["epsilon_lower_bound_noise_off"] > metrics["epsilon_claimed"] >= metrics["epsilon_lower_bound"]
    assert markdown_table(audits).count("\n") == 1 + sum(len(r) for r in audits.values())
