"""Exact integer noise: discrete Laplace and discrete Gaussian samplers, grid releases.

Floating-point samplers leak through the low-order bits of their output (Mironov 2012): the set
of floats a textbook mechanism can return depends on the true value. Here every draw is an
integer sampled *exactly* with integer arithmetic only (Canonne, Kamath, Steinke 2020,
arXiv:2004.00010, Algorithms 1-3), vectorised with numpy (int64; the rare rows whose numbers do
not fit fall back to Python integers, same algorithm). A release rounds the statistic to a grid
of step g (float arithmetic is used *before* the rounding only) and adds integer noise, so the
released float g·(K + N) depends on the integer K + N alone.

Accounting of :func:`grid_gaussian` (what the ledger charges): the integer statistic
K = round(x/g) (clipped per coordinate to ±2^52, a 1-Lipschitz map) moves, between neighbours,
by ‖K − K'‖₂ <= Δ/g + √d, where Δ is the L2 sensitivity of x and d the number of coordinates a
neighbour can change (each rounding moves a coordinate by at most 1/2). The integer noise is
N_Z(0, S²) per coordinate with S = ⌈z·(Δ/g + √d)⌉. The multivariate discrete Gaussian with
integer shift of L2 norm <= Δ_Z satisfies (Δ_Z²/(2S²))-zCDP, i.e. RDP(α) <= αΔ_Z²/(2S²) for
every α (CKS 2020, Thm 14 and §2.2 "for all σ" — no large-σ condition), which is exactly the
continuous Gaussian's RDP at noise multiplier S/Δ_Z >= z. So ``GaussianDpEvent(z)`` under the RDP
accountant (the ledger's cap check) is an upper bound. The PLD figure the ledger also reports is
the continuous Gaussian's; for the discrete Gaussian it is an approximation (CKS Thm 7 bounds
the gap; negligible at S in the hundreds and more, as here). With g = Δ·min(1, z)/(R√d) the
noise in value units is z·Δ·(1 + min(1, z)/R) (R = 256: at most 0.4 % more noise than the
continuous mechanism) and the rounding error (<= g/2 per coordinate) is a small fraction of it.

:func:`noise_switched_off` is a test/benchmark-only hook (the empirical audit): it is never an
API parameter, and it is a context variable, so it affects only the code running inside it.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterator

import numpy as np

__all__ = [
    "GRID_RESOLUTION",
    "bernoulli_exp",
    "discrete_laplace_exact",
    "discrete_gaussian",
    "discrete_gaussian_pmf",
    "GridGaussian",
    "grid_gaussian",
    "noise_switched_off",
    "noise_is_off",
]

GRID_RESOLUTION = 256  # R: grid step g = Δ·min(1, z)/(R√d); noise inflation <= 1 + 1/R
_INT_LIMIT = 1 << 62  # numbers kept below this in the vectorised int64 path
_CLIP = float(1 << 52)  # |statistic/g| clipped here (exact integers in float64)
_NOISE_OFF: ContextVar[bool] = ContextVar("privrec_noise_off", default=False)


# ----------------------------------------------------------------------------- test-only hook
@contextmanager
def noise_switched_off() -> Iterator[None]:
    """Tests/benchmarks only: inside, every sampler of this module returns zeros (the audit's
    negative control). Never reachable from the API: a context variable, not a parameter."""
    token = _NOISE_OFF.set(True)
    try:
        yield
    finally:
        _NOISE_OFF.reset(token)


def noise_is_off() -> bool:
    """Whether :func:`noise_switched_off` is active in this context."""
    return _NOISE_OFF.get()


# ----------------------------------------------------------------------------- exact Bernoullis
def _randbelow(rng: np.random.Generator, n: int) -> int:
    """Uniform integer in [0, n) for any Python int n >= 1 (rejection on random bytes)."""
    if n <= _INT_LIMIT:
        return int(rng.integers(0, n))
    bits = n.bit_length()
    while True:
        value = int.from_bytes(rng.bytes((bits + 7) // 8), "little") >> (8 * ((bits + 7) // 8) - bits)
        if value < n:
            return value


def _bernoulli_exp_scalar(rng: np.random.Generator, gamma: Fraction) -> bool:
    """Bernoulli(exp(−γ)) for rational γ >= 0, Python integers (CKS Algorithm 1)."""
    whole = gamma.numerator // gamma.denominator
    for _ in range(whole):
        if not _bernoulli_exp_le1(rng, Fraction(1)):
            return False
    return _bernoulli_exp_le1(rng, gamma - whole)


def _bernoulli_exp_le1(rng: np.random.Generator, gamma: Fraction) -> bool:
    """Bernoulli(exp(−γ)) for rational 0 <= γ <= 1: K = 1; while Bernoulli(γ/K): K += 1; K odd."""
    k = 1
    while _randbelow(rng, gamma.denominator * k) < gamma.numerator:
        k += 1
    return k % 2 == 1


def _bernoulli_exp_fraction(rng: np.random.Generator, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Bernoulli(exp(−num/den)) elementwise for 0 <= num <= den < 2^62 (CKS Algorithm 1).

    K = 1; while Bernoulli(γ/K): K += 1; return K odd. Bernoulli(γ/K) = Bernoulli(γ)·Bernoulli(1/K)
    (independent draws), so no product overflows.
    """
    out = np.zeros(num.shape, dtype=bool)
    active = np.arange(num.size)
    k = 1
    while active.size:
        hit = rng.integers(0, den[active]) < num[active]
        if k > 1:
            hit &= rng.integers(0, k, size=active.size) == 0
        out[active[~hit]] = k % 2 == 1
        active = active[hit]
        k += 1
    return out


def bernoulli_exp(rng: np.random.Generator, num: np.ndarray, den: np.ndarray | int) -> np.ndarray:
    """Exact Bernoulli(exp(−num/den)) elementwise; ``num`` >= 0 and 0 < ``den`` < 2^62 int64.

    γ = q + r/den: q independent Bernoulli(exp(−1)) must all succeed, then Bernoulli(exp(−r/den)).
    """
    num = np.asarray(num, dtype=np.int64).ravel()
    den = np.broadcast_to(np.asarray(den, dtype=np.int64), num.shape).ravel()
    if np.any(num < 0) or np.any(den <= 0) or np.any(den >= _INT_LIMIT):
        raise ValueError("bernoulli_exp needs num >= 0 and 0 < den < 2^62")
    whole, rest = np.divmod(num, den)
    ok = np.ones(num.shape, dtype=bool)
    active = np.flatnonzero(whole > 0)
    ones = np.ones(num.shape, dtype=np.int64)
    while active.size:
        passed = _bernoulli_exp_fraction(rng, ones[active], ones[active])
        ok[active[~passed]] = False
        whole[active] -= 1
        active = active[passed & (whole[active] > 0)]
    idx = np.flatnonzero(ok)
    ok[idx] = _bernoulli_exp_fraction(rng, rest[idx], den[idx])
    return ok


def _geometric_exp1(rng: np.random.Generator, size: int) -> np.ndarray:
    """V: number of Bernoulli(exp(−1)) successes before the first failure (P(V=v) ∝ e^{−v})."""
    v = np.zeros(size, dtype=np.int64)
    active = np.arange(size)
    one = np.ones(size, dtype=np.int64)
    while active.size:
        hit = _bernoulli_exp_fraction(rng, one[: active.size], one[: active.size])
        v[active[hit]] += 1
        active = active[hit]
    return v


# ----------------------------------------------------------------------------- discrete Laplace
def _check_scale(s: int, t: int) -> None:
    if not (isinstance(s, int) and isinstance(t, int) and s >= 1 and t >= 1):
        raise ValueError("the discrete Laplace scale t/s needs integers s, t >= 1")


def _dlap_scalar(rng: np.random.Generator, s: int, t: int) -> int:
    """One exact DLap(t/s) draw with Python integers (CKS Algorithm 2)."""
    while True:
        u = _randbelow(rng, t)
        if not _bernoulli_exp_scalar(rng, Fraction(u, t)):
            continue
        v = 0
        while _bernoulli_exp_le1(rng, Fraction(1)):
            v += 1
        y = (u + t * v) // s
        negative = _randbelow(rng, 2) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def discrete_laplace_exact(rng: np.random.Generator, s: int, t: int, size: int | tuple[int, ...]) -> np.ndarray:
    """int64 draws with pmf ∝ exp(−|x|·s/t) (CKS 2020 Algorithm 2, exact, vectorised).

    U ~ Unif{0..t−1}, accept w.p. exp(−U/t); V ~ Geometric(1 − e^{−1}); X = U + tV is then
    geometric with P(X = x) ∝ e^{−x/t}; Y = ⌊X/s⌋ has P ∝ e^{−y s/t}; a random sign, rejecting −0.
    """
    _check_scale(s, t)
    shape = (size,) if isinstance(size, int) else tuple(size)
    n = int(np.prod(shape))
    out = np.empty(n, dtype=np.int64)
    if noise_is_off():
        return np.zeros(shape, dtype=np.int64)
    if t >= _INT_LIMIT or s >= _INT_LIMIT:
        out[:] = [_dlap_scalar(rng, s, t) for _ in range(n)]
        return out.reshape(shape)
    todo = np.arange(n)
    while todo.size:
        u = rng.integers(0, t, size=todo.size)
        keep = bernoulli_exp(rng, u, t)
        u, slots = u[keep], todo[keep]
        v = _geometric_exp1(rng, u.size)
        fits = v < (_INT_LIMIT - t) // t
        y = np.empty(u.size, dtype=np.int64)
        y[fits] = (u[fits] + t * v[fits]) // s
        for i in np.flatnonzero(~fits):  # X = U + tV would overflow int64: same draw, Python ints
            y[i] = min((int(u[i]) + t * int(v[i])) // s, _INT_LIMIT)
        negative = rng.integers(0, 2, size=y.size) == 1
        good = ~(negative & (y == 0))
        out[slots[good]] = np.where(negative, -y, y)[good]
        done = np.zeros(n, dtype=bool)
        done[slots[good]] = True
        todo = todo[~done[todo]]
    return out.reshape(shape)


# ----------------------------------------------------------------------------- discrete Gaussian
def discrete_gaussian_pmf(sigma: int, support: np.ndarray) -> np.ndarray:
    """pmf of N_Z(0, σ²) on ``support`` (normalised over |x| <= 60σ; for tests)."""
    grid = np.arange(-60 * sigma, 60 * sigma + 1)
    weights = np.exp(-(grid.astype(np.float64) ** 2) / (2.0 * sigma * sigma))
    return np.exp(-(np.asarray(support, dtype=np.float64) ** 2) / (2.0 * sigma * sigma)) / weights.sum()


def discrete_gaussian(rng: np.random.Generator, sigma: int, size: int | tuple[int, ...]) -> np.ndarray:
    """int64 draws from N_Z(0, σ²), P(x) ∝ exp(−x²/(2σ²)), for an integer σ >= 1 (exact).

    CKS 2020 Algorithm 3 with t = σ (correct for every t > 0; σ²/t = σ is then an integer):
    Y ~ DLap(t), accept w.p. exp(−(|Y| − σ)²/(2σ²)), an exact Bernoulli on integers.
    """
    if not isinstance(sigma, int) or sigma < 1 or 2 * sigma * sigma >= _INT_LIMIT:
        raise ValueError(f"sigma must be an integer in [1, 2^30), got {sigma!r}")
    shape = (size,) if isinstance(size, int) else tuple(size)
    n = int(np.prod(shape))
    if noise_is_off():
        return np.zeros(shape, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    den = 2 * sigma * sigma
    limit = math.isqrt(_INT_LIMIT - 1)
    while todo.size:
        y = discrete_laplace_exact(rng, 1, sigma, todo.size)
        gap = np.abs(np.abs(y) - sigma)
        small = gap < limit
        accept = np.zeros(todo.size, dtype=bool)
        accept[small] = bernoulli_exp(rng, gap[small] ** 2, den)
        for i in np.flatnonzero(~small):  # (|Y| − σ)² would overflow: exact Python path
            accept[i] = _bernoulli_exp_scalar(rng, Fraction(int(gap[i]) ** 2, den))
        out[todo[accept]] = y[accept]
        todo = todo[~accept]
    return out.reshape(shape)


# ----------------------------------------------------------------------------- grid releases
@dataclass(frozen=True)
class GridGaussian:
    """A Gaussian release on a grid: step ``grid``, integer noise std ``sigma`` (see module doc),
    charged as ``GaussianDpEvent(multiplier)`` for L2 sensitivity ``sensitivity``."""

    grid: float
    sigma: int
    sensitivity: float
    multiplier: float

    @property
    def std(self) -> float:
        """Noise std in value units (g·S ≈ z·Δ·(1 + 1/R))."""
        return self.grid * self.sigma

    def release(self, rng: np.random.Generator, value: np.ndarray) -> np.ndarray:
        """g·(round(value/g) + N_Z(0, S²)) elementwise, as float64."""
        counts = np.rint(np.clip(np.asarray(value, dtype=np.float64) / self.grid, -_CLIP, _CLIP)).astype(np.int64)
        return self.grid * (counts + discrete_gaussian(rng, self.sigma, counts.shape)).astype(np.float64)

    def release_symmetric(self, rng: np.random.Generator, value: np.ndarray) -> np.ndarray:
        """The release on the upper triangle (diagonal included) of each matrix, mirrored."""
        rank = value.shape[-1]
        rows, cols = np.triu_indices(rank)
        upper = self.release(rng, value[..., rows, cols])
        out = np.empty(value.shape, dtype=np.float64)
        out[..., rows, cols] = upper
        out[..., cols, rows] = upper
        return out


def grid_gaussian(sensitivity: float, multiplier: float, changed_coordinates: int) -> GridGaussian:
    """Grid and integer σ charging ``GaussianDpEvent(multiplier)`` (module doc, CKS Thm 14).

    ``changed_coordinates``: how many released coordinates one neighbour can change (the
    rounding adds at most 1 per coordinate to the integer shift).
    """
    if not (math.isfinite(sensitivity) and sensitivity > 0 and math.isfinite(multiplier) and multiplier > 0):
        raise ValueError("sensitivity and noise multiplier must be finite and > 0")
    if changed_coordinates < 1:
        raise ValueError("a release has at least one coordinate")
    root_d = math.sqrt(changed_coordinates)
    resolution = GRID_RESOLUTION
    while True:  # keep σ within the exact int64 sampler's range (lower R only for huge z·√d)
        grid = sensitivity * min(1.0, multiplier) / (resolution * root_d)
        shift = sensitivity / grid + root_d  # L2 bound of the integer shift
        sigma = math.ceil(multiplier * shift * (1 + 1e-9))
        if 2 * sigma * sigma < _INT_LIMIT or resolution == 1:
            break
        resolution = max(1, resolution // 2)
    if 2 * sigma * sigma >= _INT_LIMIT:
        raise ValueError("noise multiplier too large for the exact discrete Gaussian sampler")
    return GridGaussian(grid=grid, sigma=sigma, sensitivity=float(sensitivity), multiplier=float(multiplier))
