"""Exact integer noise (CKS 2020, arXiv:2004.00010): pmf, moments, tails, grid releases, laplace fix."""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from app.core.privacy import discrete_noise
from app.core.privacy.discrete_noise import (
    bernoulli_exp,
    discrete_gaussian,
    discrete_gaussian_pmf,
    discrete_laplace_exact,
    exp_neg_bounds,
    grid_gaussian,
    mirror_upper,
    noise_switched_off,
)
from app.core.privacy.laplace import discrete_laplace_noise
from app.core.privacy.releaser import GaussianReleaser


class IntegersOnly:
    """A generator exposing uniform integers and bytes only: no float sampler can be used."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def integers(self, *args, **kwargs):
        return self._rng.integers(*args, **kwargs)

    def bytes(self, n: int) -> bytes:
        return self._rng.bytes(n)


def _chi_square_p(draws: np.ndarray, pmf) -> float:
    """p-value of a chi-square goodness-of-fit test, tails pooled into the end bins."""
    lo, hi = int(draws.min()), int(draws.max())
    support = np.arange(lo, hi + 1)
    observed = np.bincount(draws - lo, minlength=len(support)).astype(float)
    expected = pmf(support) * len(draws)
    keep = expected >= 5
    obs = np.concatenate([observed[keep], [observed[~keep].sum()]])
    exp = np.concatenate([expected[keep], [len(draws) - expected[keep].sum()]])
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("gamma", [(0, 1), (1, 3), (1, 1), (5, 2), (37, 10)])
def test_bernoulli_exp_is_exact_in_distribution(gamma):
    num, den = gamma
    draws = bernoulli_exp(np.random.default_rng(0), np.full(200_000, num), den)
    p = math.exp(-num / den)
    assert abs(draws.mean() - p) < 5 * math.sqrt(p * (1 - p) / len(draws)) + 1e-12


@pytest.mark.parametrize("sigma", [1, 2, 5])
def test_discrete_gaussian_matches_its_pmf_on_small_sigma(sigma: int):
    draws = discrete_gaussian(IntegersOnly(sigma), sigma, 300_000)
    assert _chi_square_p(draws, lambda x: discrete_gaussian_pmf(sigma, x)) > 1e-3


@pytest.mark.parametrize("bit_generator", [np.random.PCG64, np.random.SFC64])  # SFC64: the noise streams'
@pytest.mark.parametrize("sigma", [7, 1000, 2**24])
def test_discrete_gaussian_moments_and_tails(sigma: int, bit_generator):
    draws = discrete_gaussian(np.random.Generator(bit_generator(sigma)), sigma, 400_000).astype(np.float64)
    n = len(draws)
    assert abs(draws.mean()) < 5 * sigma / math.sqrt(n)
    assert draws.var() / sigma**2 == pytest.approx(1.0, abs=0.02)
    assert stats.kurtosis(draws) == pytest.approx(0.0, abs=0.05)  # Gaussian, not Laplace (3)
    beyond = np.mean(np.abs(draws) > 3 * sigma)
    tail = 2 * stats.norm.sf((3 * sigma + 0.5) / sigma)  # P(|X| > 3σ), continuity-corrected
    assert beyond == pytest.approx(tail, abs=5 * math.sqrt(tail / n))
    assert np.abs(draws).max() < 6 * sigma


@pytest.mark.parametrize("s,t", [(1, 1), (3, 2), (1, 7)])
def test_discrete_laplace_matches_its_pmf(s: int, t: int):
    a = s / t
    draws = discrete_laplace_exact(IntegersOnly(t), s, t, 300_000)
    assert _chi_square_p(draws, lambda x: math.tanh(a / 2) * np.exp(-a * np.abs(x))) > 1e-3


@pytest.mark.parametrize("a", [0.05, 0.7, 1e-3])
def test_laplace_module_samples_with_integers_only(a: float):
    """numpy's geometric inverts a float CDF for small p: the fixed sampler needs uniform integers only."""
    draws = discrete_laplace_noise(IntegersOnly(1), a, 200_000)
    assert draws.dtype == np.int64
    variance = 2 * math.exp(-a) / (1 - math.exp(-a)) ** 2
    assert draws.var() / variance == pytest.approx(1.0, abs=0.03)
    assert abs(draws.mean()) < 5 * math.sqrt(variance / len(draws))


def test_grid_release_is_on_the_grid_and_hides_the_value_within_a_cell():
    """The released float is g·(integer): its bits depend on the integer alone (Mironov 2012)."""
    spec = grid_gaussian(sensitivity=2.0, multiplier=3.0, changed_coordinates=10)
    value = spec.grid * np.arange(-5000, 5000, 1000)  # grid points: ±0.4 g stays in their cells
    out = spec.release(np.random.default_rng(3), value)
    assert np.array_equal(out, spec.grid * np.rint(out / spec.grid))
    # two values in the same grid cell give bit-identical releases under the same draws
    nudged = value + spec.grid * np.linspace(-0.4, 0.4, 10)
    assert np.array_equal(spec.release(np.random.default_rng(3), nudged), out)
    # the accounting: S covers the rounded shift z·(Δ/g + √d), noise in value units ≈ zΔ
    assert spec.sigma >= 3.0 * (2.0 / spec.grid + math.sqrt(10))
    assert spec.std == pytest.approx(6.0, rel=1 / 200)


def _numpy_release(spec, rng: np.random.Generator, value: np.ndarray) -> np.ndarray:
    """The grid release as numpy operations: g·(rint(clip(x/g, ±2^52)) + N), N drawn for x's shape."""
    counts = np.rint(np.clip(value / spec.grid, -float(1 << 52), float(1 << 52))).astype(np.int64)
    return spec.grid * (counts + discrete_gaussian(rng, spec.sigma, counts.shape)).astype(np.float64)


def _awkward_values(rng: np.random.Generator, spec, shape: tuple[int, ...]) -> np.ndarray:
    """Values with exact half-grid ties (rounded to even), huge ones (clipped) and ordinary ones."""
    value = rng.normal(0.0, 40.0 * spec.grid, size=shape).ravel()
    value[:6] = spec.grid * np.array([2.5, 3.5, -0.5, -1.5, 1e300, -1e300])
    return value.reshape(shape)


@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5)])
def test_compiled_grid_release_equals_the_numpy_operations(shape: tuple[int, ...]):
    spec = grid_gaussian(sensitivity=2.0, multiplier=0.7, changed_coordinates=40)
    value = _awkward_values(np.random.default_rng(1), spec, (max(int(np.prod(shape)), 6),))[: int(np.prod(shape))]
    value = value.reshape(shape)
    got = spec.release(np.random.default_rng(5), value)
    assert np.shape(got) == shape
    assert np.array_equal(got, _numpy_release(spec, np.random.default_rng(5), value))


@pytest.mark.parametrize("rank", [1, 2, 9, 33, 64])
def test_symmetric_release_is_the_release_of_the_upper_triangles_mirrored(rank: int):
    """The fused symmetric release: the same draws, in the same order, as releasing each matrix's
    upper triangle (``np.triu_indices`` order) elementwise and mirroring it."""
    spec = grid_gaussian(sensitivity=1.5, multiplier=2.0, changed_coordinates=4 * rank * (rank + 1) // 2)
    value = _awkward_values(np.random.default_rng(rank), spec, (2, 3, rank, rank))
    rows, cols = np.triu_indices(rank)
    want = mirror_upper(_numpy_release(spec, np.random.default_rng(9), value[..., rows, cols]), rank)
    got = spec.release_symmetric(np.random.default_rng(9), value)
    assert got.shape == value.shape
    assert np.array_equal(got, want)
    assert np.array_equal(got, np.swapaxes(got, -1, -2))
    in_place = value.copy()  # the release written over its own statistic: the same numbers
    assert spec.release_symmetric(np.random.default_rng(9), in_place, out=in_place) is in_place
    assert np.array_equal(in_place, want)


def test_releaser_draws_are_on_its_grid_and_recorded():
    releaser = GaussianReleaser(np.random.default_rng(0))
    value = np.array([0.123456789, 1.0, 2.5])
    out = releaser.vector("v", value, 1.0, 2.0)
    spec = grid_gaussian(1.0, 2.0, 3)
    assert np.array_equal(out, spec.grid * np.rint(out / spec.grid))
    sym = releaser.symmetric("s", np.eye(3), 1.0, 2.0)
    assert np.array_equal(sym, sym.T)
    assert releaser.releases == [("v", 1.0, 2.0), ("s", 1.0, 2.0)]


def test_noise_hook_switches_every_sampler_off_inside_only():
    rng = np.random.default_rng(0)
    with noise_switched_off():
        assert not discrete_gaussian(rng, 50, 100).any()
        assert not discrete_laplace_noise(rng, 0.1, 100).any()
        spec = grid_gaussian(1.0, 5.0, 4)
        value = np.array([0.5, 1.5, -2.0, 3.0])
        assert np.allclose(spec.release(rng, value), value, atol=spec.grid)
    assert discrete_gaussian(rng, 50, 100).any()


# ---------------------------------------------------------------------------- the exact slow path and the fast path's bound
@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(37, 10),
                                   Fraction(2**40 + 7, 2**41), Fraction(745), Fraction(7001, 7)])
def test_exp_neg_bounds_bracket_the_exact_value(gamma: Fraction):
    precision = 120
    lo, hi = exp_neg_bounds(gamma, precision)
    assert 0 <= hi - lo <= 4
    with decimal.localcontext() as context:
        context.prec = 80
        exact = (-(decimal.Decimal(gamma.numerator) / decimal.Decimal(gamma.denominator))).exp()
        scaled = exact * (decimal.Decimal(2) ** precision)
        slack = scaled * decimal.Decimal(10) ** -70
        assert decimal.Decimal(lo) <= scaled + slack and scaled - slack <= decimal.Decimal(hi)


def test_numpy_log_is_within_the_assumed_error():
    """The fast path assumes numpy's float64 log(c + ½) within 2^-50·max(|ln|, 1) (module comment)."""
    rng = np.random.default_rng(0)
    cells = rng.integers(0, 1 << 53, size=6000) >> rng.integers(0, 54, size=6000)
    t = cells.astype(np.float64) + 0.5
    with decimal.localcontext() as context:
        context.prec = 50
        for x, got in zip(t, np.log(t), strict=True):
            exact = decimal.Decimal(float(x)).ln()
            assert abs(decimal.Decimal(float(got)) - exact) <= max(abs(exact), 1) * decimal.Decimal(2) ** -50
    assert abs(discrete_noise._LN_CELLS - 53 * math.log(2)) <= 2.0**-48


EXACT_PATH_ONLY = {"margin": 1.0, "block": 1 << 10}  # the float fast path decides nothing: all exact


@pytest.mark.parametrize("sigma", [1, 3])
def test_exact_path_alone_samples_the_discrete_gaussian(sigma: int):
    draws = discrete_gaussian(np.random.default_rng(11), sigma, 20_000, **EXACT_PATH_ONLY)
    assert _chi_square_p(draws, lambda x: discrete_gaussian_pmf(sigma, x)) > 1e-3


def test_exact_path_alone_samples_the_discrete_laplace():
    draws = discrete_laplace_exact(np.random.default_rng(12), 2, 3, 20_000, **EXACT_PATH_ONLY)
    assert _chi_square_p(draws, lambda x: math.tanh(1 / 3) * np.exp(-(2 / 3) * np.abs(x))) > 1e-3


def test_a_wider_margin_does_not_change_the_law_at_large_sigma():
    """With a margin of 2^-16 a few percent of the comparisons take the exact path: same moments."""
    sigma = 2**12
    draws = discrete_gaussian(np.random.default_rng(13), sigma, 40_000, margin=2.0**-16).astype(np.float64)
    assert abs(draws.mean()) < 5 * sigma / math.sqrt(len(draws))
    assert draws.var() / sigma**2 == pytest.approx(1.0, abs=0.04)
    assert stats.kurtosis(draws) == pytest.approx(0.0, abs=0.12)


def test_draws_are_int64_and_shaped_and_sigma_is_bounded():
    rng = np.random.default_rng(0)
    draws = discrete_gaussian(rng, 2**20, (3, 70_000))
    assert draws.dtype == np.int64 and draws.shape == (3, 70_000)
    assert discrete_gaussian(rng, 5, 0).shape == (0,)
    with pytest.raises(ValueError):
        discrete_gaussian(rng, 2**40, 3)
    with pytest.raises(ValueError):
        discrete_gaussian(rng, 2.5, 3)


def _vectorised_gaussian_block(rng: np.random.Generator, sigma: int, n: int,
                               margin: float = discrete_noise._MARGIN) -> np.ndarray:
    """The fast path as numpy array operations (the sampler before it was compiled): the reference."""
    first = discrete_noise._uniform_cells(rng, n)
    second = discrete_noise._uniform_cells(rng, n, extra_bits=1)
    y1, slack1 = discrete_noise._minus_log_uniform(first)
    x = sigma * y1
    magnitude, sure = discrete_noise._floor_is_certain(x, sigma * slack1 + (x + 64.0 * sigma) * margin)
    scaled_gap = (magnitude - sigma) * (1.0 / (sigma * math.sqrt(2.0)))
    gamma = scaled_gap * scaled_gap
    y2, slack2 = discrete_noise._minus_log_uniform(second >> 1)
    gap = y2 - gamma
    sure &= np.abs(gap) > slack2 + (y2 + gamma + 64.0) * margin
    accept = gap > 0
    negative = (second & 1).astype(bool)
    for i in np.flatnonzero(~sure):
        magnitude[i] = m = discrete_noise._exact_geometric(rng, int(first[i]), 1, sigma, x[i])
        accept[i] = discrete_noise._LazyUniform(rng, int(second[i]) >> 1, 53).below_exp(
            Fraction((m - sigma) ** 2, 2 * sigma * sigma))
    accept &= ~(negative & (magnitude == 0))
    return np.where(negative, -magnitude, magnitude)[accept].astype(np.int64)


@pytest.mark.parametrize(("sigma", "margin"), [(1, None), (3, None), (2**10, None), (2**20, None), (2**40 - 1, None),
                                               (2**12, 2.0**-16), (5, 1.0)])
def test_compiled_path_draws_as_numpy_did(sigma: int, margin: float | None):
    """The compiled fast path takes the same decisions as the vectorised float64 form, bit for bit,
    the exact path included (a wide margin sends a few percent, or all, of the draws there)."""
    margin = discrete_noise._MARGIN if margin is None else margin
    compiled = discrete_gaussian(np.random.default_rng(21), sigma, 60_000, margin=margin)
    rng = np.random.default_rng(21)  # the sampler before the compiled pass: vectorised blocks, collected
    reference = discrete_noise._collect(lambda m: _vectorised_gaussian_block(rng, sigma, m, margin), 60_000, 0.7)
    assert np.array_equal(compiled, reference)
    rng = np.random.default_rng(21)  # the compiled pass returning arrays, collected (the previous sampler)
    blocks = discrete_noise._collect(lambda m: discrete_noise._gaussian_block(rng, sigma, m, margin), 60_000, 0.7)
    assert np.array_equal(compiled, blocks)


@pytest.mark.parametrize("margin", [None, 2.0**-36, 1.0])  # none, some (~1 in 6), every block settled exactly
def test_blocks_written_in_place_leave_the_stream_as_it_was(margin: float | None):
    """Draws written straight into the output (the compiled compaction, and its fallback where the
    exact path settles a block) continue the generator's stream exactly as collected blocks did:
    later draws from the same generator are equal too."""
    margin = discrete_noise._MARGIN if margin is None else margin
    sigma, sizes = 2**12 + 3, (1, 17, 20_000, 50_001)
    fast, slow = np.random.default_rng(5), np.random.default_rng(5)
    for size in sizes:
        written = discrete_gaussian(fast, sigma, size, margin=margin)
        collected = discrete_noise._collect(lambda m: _vectorised_gaussian_block(slow, sigma, m, margin), size, 0.7)
        assert np.array_equal(written, collected)
    assert fast.integers(0, 2**62) == slow.integers(0, 2**62)


def test_compiled_path_with_an_integers_only_generator():
    draws = discrete_gaussian(IntegersOnly(3), 7, 20_000)
    assert _chi_square_p(draws, lambda x: discrete_gaussian_pmf(7, x)) > 1e-3


def test_unmirrored_symmetric_release_writes_the_same_upper_triangles_only():
    spec = grid_gaussian(sensitivity=1.5, multiplier=2.0, changed_coordinates=60)
    value = _awkward_values(np.random.default_rng(3), spec, (4, 9, 9))
    mirrored = spec.release_symmetric(np.random.default_rng(9), value)
    out = np.full(value.shape, np.nan)
    upper_only = spec.release_symmetric(np.random.default_rng(9), value, out=out, mirror=False)
    assert np.array_equal(np.triu(upper_only), np.triu(mirrored))
    lower_rows, lower_cols = np.tril_indices(9, -1)
    assert np.isnan(upper_only[:, lower_rows, lower_cols]).all()


def test_noise_streams_are_the_spawned_children_on_sfc64():
    """Parallel noise streams: the seed sequences ``Generator.spawn`` would give (so independent
    and seed-deterministic), driving SFC64; the parent's later spawns continue after them."""
    streams = GaussianReleaser(np.random.default_rng(42)).noise_streams(3)
    twins = np.random.default_rng(42).spawn(3)
    for stream, twin in zip(streams, twins, strict=True):
        assert isinstance(stream.bit_generator, np.random.SFC64)
        assert stream.bit_generator.seed_seq.spawn_key == twin.bit_generator.seed_seq.spawn_key
        assert stream.bit_generator.seed_seq.entropy == twin.bit_generator.seed_seq.entropy
    again = GaussianReleaser(np.random.default_rng(42)).noise_streams(3)
    assert all(np.array_equal(a.integers(0, 1 << 62, 8), b.integers(0, 1 << 62, 8)) for a, b in zip(streams, again, strict=True))
    assert len({int(s.integers(0, 1 << 62)) for s in again}) == 3
    releaser = GaussianReleaser(np.random.default_rng(42))
    releaser.noise_streams(3)
    assert releaser.rng.spawn(1)[0].bit_generator.seed_seq.spawn_key == (3,)


def test_noise_streams_of_a_generator_without_seed_sequence_are_its_own_children():
    class Double:
        def spawn(self, n):
            return [f"child {i}" for i in range(n)]

    assert GaussianReleaser(Double()).noise_streams(2) == ["child 0", "child 1"]
