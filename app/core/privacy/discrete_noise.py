"""Exact integer noise: discrete Laplace and discrete Gaussian samplers, grid releases.

Floating-point samplers leak through the low-order bits of their output (Mironov 2012): the set
of floats a textbook mechanism can return depends on the true value. Here every draw is an
integer with *exactly* the target pmf (Canonne, Kamath, Steinke 2020, arXiv:2004.00010,
Algorithms 2-3: a discrete Laplace proposal — geometric magnitude, uniform sign — accepted with
probability exp(−(|y| − σ)²/(2σ²))). Every random decision is a comparison "U < e^{−γ}" of a
uniform real U, of which 53 bits are drawn as an integer, with an exactly known rational γ.
Vectorised float64 arithmetic (−ln U > γ) settles a comparison only when it holds for the whole
53-bit cell of U and for every value within a stated error bound of the float result (numpy's
log within 2^-50 relative, margin 32x; tested); the rest (~10^-7 of them at σ <= 2^20) is settled
by drawing more bits of U and bracketing e^{−γ} with exact rational series
(:func:`exp_neg_bounds`). The output's pmf is therefore exactly the target's. The discrete
Gaussian's fast path is a compiled (numba) pass that splits the raw words into cells, numpy's
vectorised log, one compiled pass over the proposals and a compiled compaction of the accepted
draws, ~13-15 ns a draw (numpy array operations alone: ~33 ns; an exact sampler built from
Bernoulli trials: ~1 µs); the compiled passes take the vectorised form's decisions bit for bit,
so the exactness argument is the same. A release rounds the statistic to
a grid of step g (float arithmetic is used *before* the rounding only) and adds integer noise, so
the released float g·(K + N) depends on the integer K + N alone.

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

import functools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol, TypeVar, cast

import numpy as np

from app.core.arrays import BoolArray

__all__ = [
    "GRID_RESOLUTION",
    "bernoulli_exp",
    "discrete_laplace_exact",
    "discrete_gaussian",
    "discrete_gaussian_pmf",
    "exp_neg_bounds",
    "GridGaussian",
    "grid_gaussian",
    "mirror_upper",
    "noise_switched_off",
    "noise_is_off",
]

GRID_RESOLUTION = 256  # R: grid step g = Δ·min(1, z)/(R√d); noise inflation <= 1 + 1/R
_INT_LIMIT = 1 << 62  # draws are int64 below this
_SIGMA_LIMIT = 1 << 40  # |draws| stay below 2^47 (< 2^53: exact floats in the fast path)
_CLIP = float(1 << 52)  # |statistic/g| clipped here (exact integers in float64)
_NOISE_OFF: ContextVar[bool] = ContextVar("privrec_noise_off", default=False)


_F = TypeVar("_F", bound=Callable[..., Any])


def _compiled(fn: _F) -> _F:
    """``fn`` compiled by numba's ``njit`` at its first call (on-disk cache; releases the GIL;
    divides by zero as IEEE floats do, ±inf, as numpy does). numba is imported only then, so a
    process that never samples (the API) does not load it (~50 MiB)."""

    @functools.cache
    def compiled() -> _F:
        from numba import njit  # pylint: disable=import-outside-toplevel

        return cast(_F, njit(cache=True, nogil=True, error_model="numpy")(fn))

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        return compiled()(*args)

    return cast(_F, call)


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


# ----------------------------------------------------------------------------- exact e^{-γ} bounds
def _fixed_exp_neg_fraction(numerator: int, denominator: int, scale_bits: int) -> tuple[int, int]:
    """(lo, hi) with lo <= 2^scale_bits·e^{−f} <= hi for f = numerator/denominator in [0, 1].

    Σ (−f)^n/n! alternates with terms decreasing in size (f <= 1 <= n + 1), so the truncation
    error is at most the last term. Each fixed-point term is the previous one times f/k rounded
    down, so its error e_k <= e_{k−1}·f/k + 1 < 2 units; the loop stops at a term computed as 0
    (exact value < 2 units), so the sum is off by less than 2n + 2 units in all.
    """
    guard = 8
    one = 1 << (scale_bits + guard)
    total, term, n = one, one, 0
    while term:
        n += 1
        term = term * numerator // (denominator * n)
        total += -term if n % 2 else term
    error = 2 * n + 2
    return max((total - error) >> guard, 0), -((-(total + error)) >> guard)


@functools.lru_cache(maxsize=64)
def _fixed_exp_neg_one(scale_bits: int) -> tuple[int, int]:
    """Bounds of 2^scale_bits·e^{−1} (cached per precision)."""
    return _fixed_exp_neg_fraction(1, 1, scale_bits)


def _fixed_pow(lo: int, hi: int, power: int, scale_bits: int) -> tuple[int, int]:
    """Bounds of x^power from bounds lo <= 2^s·x <= hi (0 <= x), rounding outwards at each product."""
    result_lo, result_hi = 1 << scale_bits, 1 << scale_bits
    while power:
        if power & 1:
            result_lo = (result_lo * lo) >> scale_bits
            result_hi = -((-(result_hi * hi)) >> scale_bits)
        lo, hi = (lo * lo) >> scale_bits, -((-(hi * hi)) >> scale_bits)
        power >>= 1
    return result_lo, result_hi


def exp_neg_bounds(gamma: Fraction, precision: int) -> tuple[int, int]:
    """Integers lo <= 2^precision·e^{−γ} <= hi for rational γ >= 0, hi − lo <= 4 (exact arithmetic).

    γ = q + f (q integer, 0 <= f < 1): e^{−γ} = (e^{−1})^q·e^{−f}, each factor bracketed by its
    alternating series, products rounded outwards, with guard bits for the q-fold product.
    """
    if gamma < 0:
        raise ValueError("γ must be >= 0")
    whole, rest = divmod(gamma.numerator, gamma.denominator)
    work = precision + 2 * whole.bit_length() + 16
    lo_f, hi_f = _fixed_exp_neg_fraction(rest, gamma.denominator, work)
    lo_1, hi_1 = _fixed_exp_neg_one(work)
    lo_q, hi_q = _fixed_pow(lo_1, hi_1, whole, work)
    lo = (lo_q * lo_f) >> (2 * work - precision)
    hi = -((-(hi_q * hi_f)) >> (2 * work - precision))
    return lo, hi


class _LazyUniform:
    """A uniform real U in [0, 1) of which only a prefix of bits has been drawn; more bits are
    drawn only as a comparison needs them, so every comparison is exact (U is one real)."""

    def __init__(self, rng: np.random.Generator, prefix: int, bits: int) -> None:
        self._rng, self.prefix, self.bits = rng, int(prefix), bits

    def below_exp(self, gamma: Fraction) -> bool:
        """Whether U < e^{−γ}, exactly."""
        while True:
            lo, hi = exp_neg_bounds(gamma, self.bits + 32)
            if (self.prefix + 1) << 32 <= lo:
                return True
            if self.prefix << 32 >= hi:
                return False
            self.prefix = (self.prefix << 32) | int(self._rng.integers(0, 1 << 32))
            self.bits += 32


def _last_below(uniform: _LazyUniform, gamma_of: Callable[[int], Fraction], guess: int) -> int:
    """max{m >= 0 : U < e^{−γ(m)}} for γ increasing in m with γ(0) = 0 (gallop, then bisect)."""
    low = max(int(guess), 0)
    if not uniform.below_exp(gamma_of(low)):
        low, high = 0, low  # γ(0) = 0: U < 1 always holds
    else:
        step = 1
        while uniform.below_exp(gamma_of(low + step)):
            low, step = low + step, 2 * step
        high = low + step
    while high - low > 1:  # invariant: true at low, false at high
        middle = (low + high) // 2
        low, high = (middle, high) if uniform.below_exp(gamma_of(middle)) else (low, middle)
    return low


# ----------------------------------------------------------------------------- vectorised exact draws
# Fast path: a comparison "U < e^{−γ}" is made as "−ln U > γ" in float64, from U's 53-bit cell
# c (U·2^53 in [c, c + 1]): y = 53·ln 2 − log(c + ½) is within 1/c + 2^-45 of −ln U for every U
# in the cell (|d ln t| <= 1/c over the cell; numpy's float64 ``log`` within 2^-50 relative, i.e.
# <= 37·2^-50 here; the constant and the subtraction each within 2^-48). γ's float value is within
# 2^-49 relative of the exact rational. The decision is taken only when |y − γ| exceeds
# 1/c + (y + γ + 64)·2^-46, at least 32x the float error bound; otherwise the exact path above
# decides (probability ~1/c + 2^-40: ~10^-11 a comparison). The numpy ``log`` bound is checked
# against exact bounds by ``test_numpy_log_is_within_the_assumed_error``.
_UNIFORM_BITS = 53
_CELLS = float(1 << _UNIFORM_BITS)
_LN_CELLS = _UNIFORM_BITS * math.log(2.0)
_MARGIN = 2.0**-46
_BLOCK = 1 << 14  # proposals per vectorised pass (arrays stay in cache)


def _uniform_cells(rng: np.random.Generator, n: int, extra_bits: int = 0) -> np.ndarray:
    """Uniform integers in [0, 2^(53 + extra_bits)) (int64): a 53-bit cell of U plus extra bits
    (the top bits of the bit generator's raw 64-bit words where it exposes them)."""
    bit_generator = getattr(rng, "bit_generator", None)
    if bit_generator is None:
        return rng.integers(0, 1 << (_UNIFORM_BITS + extra_bits), size=n, dtype=np.int64)
    raw = np.asarray(bit_generator.random_raw(n), dtype=np.uint64)  # numpy types random_raw as Any
    raw >>= np.uint64(64 - _UNIFORM_BITS - extra_bits)  # in place: the array is ours
    return raw.view(np.int64)


def _minus_log_uniform(cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(y, cell slack): y ≈ −ln U for U in each 53-bit cell; |y − (−ln U)| <= 1/c + 2^-45."""
    cell = cells.astype(np.float64)
    with np.errstate(divide="ignore"):
        return _LN_CELLS - np.log(cell + 0.5), 1.0 / cell


def _below_exp(rng: np.random.Generator, cells: np.ndarray, gamma: np.ndarray,
               exact_gamma: Callable[[int], Fraction]) -> np.ndarray:
    """U_i < e^{−γ_i} for U_i uniform in cell ``cells[i]`` (53 bits); exact (module comment).

    ``gamma``: float64 approximations (relative error <= 2^-49) of the exact γ_i = exact_gamma(i).
    """
    y, cell_slack = _minus_log_uniform(cells)
    gap = y - gamma
    below: np.ndarray = gap > 0
    for i in np.flatnonzero(np.abs(gap) <= cell_slack + (y + gamma + 64.0) * _MARGIN):
        below[i] = _LazyUniform(rng, int(cells[i]), _UNIFORM_BITS).below_exp(exact_gamma(int(i)))
    return below


def _floor_is_certain(x: np.ndarray, slack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(⌊x⌋, whether every value within ``slack`` of x has that floor)."""
    floor = np.floor(x)
    return floor, (x - floor > slack) & (floor + 1.0 - x > slack)


def _geometric(rng: np.random.Generator, s: int, t: int, n: int, margin: float = _MARGIN) -> np.ndarray:
    """n int64 draws M with P(M >= m) = e^{−m·s/t} (geometric), by exact inversion.

    M = max{m : U < e^{−ms/t}} = ⌊λ·(−ln U)⌋ (λ = t/s, up to a null set); the floor is taken in
    float64 where it is certain for the whole cell and the float error (module comment),
    otherwise exactly.
    """
    scale = t / s  # correctly rounded (Python int division)
    cells = _uniform_cells(rng, n)
    y, cell_slack = _minus_log_uniform(cells)
    x = scale * y
    magnitude, sure = _floor_is_certain(x, scale * cell_slack + (x + 64.0 * scale) * margin)
    sure &= magnitude < _INT_LIMIT
    out = magnitude.astype(np.int64)
    for i in np.flatnonzero(~sure):
        out[i] = _exact_geometric(rng, int(cells[i]), s, t, x[i])
    return out


def _exact_geometric(rng: np.random.Generator, cell: int, s: int, t: int, guess: float) -> int:
    """max{m : U < e^{−ms/t}} for U uniform in the 53-bit ``cell``, exactly."""
    start = int(min(max(guess, 0.0), float(_INT_LIMIT)))
    value = _last_below(_LazyUniform(rng, cell, _UNIFORM_BITS), lambda m: Fraction(m * s, t), start)
    if value >= _INT_LIMIT:
        raise OverflowError("a discrete Laplace draw beyond 2^62 (scale far too large)")
    return value


def bernoulli_exp(rng: np.random.Generator, num: np.ndarray, den: np.ndarray | int) -> np.ndarray:
    """Exact Bernoulli(exp(−num/den)) elementwise for integers num >= 0, den >= 1 (int64)."""
    num = np.asarray(num, dtype=np.int64).ravel()
    den = np.broadcast_to(np.asarray(den, dtype=np.int64), num.shape).ravel()
    if np.any(num < 0) or np.any(den <= 0):
        raise ValueError("bernoulli_exp needs num >= 0 and den > 0")
    gamma = num.astype(np.float64) / den.astype(np.float64)
    return _below_exp(rng, _uniform_cells(rng, num.size), gamma, lambda i: Fraction(int(num[i]), int(den[i])))


# ----------------------------------------------------------------------------- discrete Laplace
def _check_scale(s: int, t: int) -> None:
    if not (isinstance(s, int) and isinstance(t, int) and s >= 1 and t >= 1):
        raise ValueError("the discrete Laplace scale t/s needs integers s, t >= 1")
    if t / s > 2.0**56:
        raise ValueError("the discrete Laplace scale t/s must be at most 2^56")


def _shape(size: int | tuple[int, ...]) -> tuple[int, ...]:
    return (size,) if isinstance(size, (int, np.integer)) else tuple(size)


def _signed_laplace_block(rng: np.random.Generator, s: int, t: int, n: int, margin: float = _MARGIN) -> np.ndarray:
    """Accepted draws of ±M (M geometric, uniform sign, −0 rejected) from n proposals."""
    magnitude = _geometric(rng, s, t, n, margin)
    negative = rng.integers(0, 2, size=n, dtype=np.int64).astype(bool)
    keep: BoolArray = ~(negative & (magnitude == 0))
    signed: np.ndarray = np.where(negative, -magnitude, magnitude)
    return signed[keep]


def _collect(draw_block: Callable[[int], np.ndarray], n: int, acceptance: float, block: int = _BLOCK) -> np.ndarray:
    """n i.i.d. accepted draws, filled from blocks of proposals (block sizes depend on n only)."""
    out = np.empty(n, dtype=np.int64)
    have = 0
    while have < n:
        drawn = draw_block(int(min(block, n - have) / acceptance) + 16)[: n - have]
        out[have: have + drawn.size] = drawn
        have += drawn.size
    return out


def _collect_into(fill_block: Callable[[int, np.ndarray, int], int], n: int, acceptance: float,
                  block: int = _BLOCK) -> np.ndarray:
    """:func:`_collect` with blocks that write their accepted draws straight into the output:
    ``fill_block(m, out, have)`` draws m proposals and writes the first ``min(accepted, n − have)``
    of them to ``out[have:n]``, returning how many (``out`` has n + 1 slots, the last a spare the
    block may overwrite). Same block sizes, same draws, no copies."""
    out = np.empty(n + 1, dtype=np.int64)
    have = 0
    while have < n:
        have += fill_block(int(min(block, n - have) / acceptance) + 16, out, have)
    return out[:n]


def discrete_laplace_exact(rng: np.random.Generator, s: int, t: int, size: int | tuple[int, ...], *,
                           margin: float = _MARGIN, block: int = _BLOCK) -> np.ndarray:
    """int64 draws with pmf ∝ exp(−|x|·s/t) (exact; the construction of CKS 2020 Algorithm 2).

    |X| is geometric with P(|X| >= m) = e^{−ms/t} (exact inversion, :func:`_geometric`), a uniform
    sign, and −0 rejected: P(X = 0) ∝ 1/2·P(M = 0), P(X = ±m) ∝ 1/2·P(M = m) ∝ e^{−ms/t}.

    ``margin`` and ``block`` exist for tests and tuning only (see :func:`discrete_gaussian`).
    """
    _check_scale(s, t)
    shape = _shape(size)
    n = int(np.prod(shape))
    if noise_is_off():
        return np.zeros(shape, dtype=np.int64)
    keep = 1.0 - 0.5 * -math.expm1(-s / t)  # 1 − P(M = 0)/2 (a block size only)
    return _collect(lambda m: _signed_laplace_block(rng, s, t, m, margin), n, max(keep, 0.5), block).reshape(shape)


# ----------------------------------------------------------------------------- discrete Gaussian
def discrete_gaussian_pmf(sigma: int, support: np.ndarray) -> np.ndarray:
    """pmf of N_Z(0, σ²) on ``support`` (normalised over |x| <= 60σ; for tests)."""
    grid = np.arange(-60 * sigma, 60 * sigma + 1)
    weights = np.exp(-(grid.astype(np.float64) ** 2) / (2.0 * sigma * sigma))
    return np.asarray(np.exp(-(np.asarray(support, dtype=np.float64) ** 2) / (2.0 * sigma * sigma)) / weights.sum())


@_compiled
def _gaussian_fast_path(first: np.ndarray, log_first: np.ndarray, second: np.ndarray, log_second: np.ndarray,
                        sigma: float, margin: float, ln_cells: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compiled fast path of :func:`_gaussian_block`, fused into one pass over the proposals:
    (signed proposals ±M, accepted, whether the float bounds settle the decision).

    ``log_first``, ``log_second``: numpy's float64 log(c + ½) of each 53-bit cell c (vectorised,
    the bound tested by ``test_numpy_log_is_within_the_assumed_error``). Every other step is the
    float64 arithmetic of the module comment above :func:`_below_exp`, in the same order and
    without fused multiply-adds (LLVM contracts none without fastmath), so each decision taken
    here holds for the whole cells of U₁, U₂ and every value within the error bounds; the caller
    settles the rest exactly. The exactness argument is unchanged, and so are the draws (the same
    decisions as the vectorised form, bit for bit: ``test_compiled_path_draws_as_numpy_did``).
    """
    n = first.shape[0]
    signed = np.empty(n, dtype=np.int64)
    accept = np.empty(n, dtype=np.bool_)
    sure = np.empty(n, dtype=np.bool_)
    inv = 1.0 / (sigma * math.sqrt(2.0))
    for i in range(n):  # branch-free: LLVM vectorises it
        x = sigma * (ln_cells - log_first[i])
        magnitude = np.floor(x)
        slack = sigma * (1.0 / first[i]) + (x + 64.0 * sigma) * margin
        scaled_gap = (magnitude - sigma) * inv
        gamma = scaled_gap * scaled_gap  # (M − σ)²/(2σ²), relative error <= 2^-49
        y2 = ln_cells - log_second[i]
        gap = y2 - gamma
        sure[i] = ((x - magnitude > slack) & (magnitude + 1.0 - x > slack)
                   & (abs(gap) > (1.0 / (second[i] >> 1)) + (y2 + gamma + 64.0) * margin))
        value = np.int64(magnitude)
        negative = (second[i] & 1) == 1
        signed[i] = (1 - 2 * (second[i] & 1)) * value
        accept[i] = (gap > 0) & ~(negative & (value == 0))
    return signed, accept, sure


@_compiled
def _compact(signed: np.ndarray, accept: np.ndarray, sure: np.ndarray, out: np.ndarray, start: int) -> tuple[int, int]:
    """The accepted ``signed`` draws in order into ``out[start:-1]`` (as many as fit): (how many
    written, how many proposals are not ``sure``). Branch-free: each proposal is written and only
    an accepted one advances; ``out``'s last slot is a spare that takes the writes once the rest
    is full. Where the second count is not 0 the caller discards what was written: the exact path
    settles those proposals first."""
    limit = out.shape[0] - 1  # the spare slot
    written, unsure = start, 0
    for i in range(signed.shape[0]):
        out[min(written, limit)] = signed[i]
        written += int(accept[i]) & int(written < limit)
        unsure += 1 - int(sure[i])
    return written - start, unsure


def _log_cell_centres(cells: np.ndarray) -> np.ndarray:
    """float64 log(c + ½) of each cell c (< 2^53: exact as a float), in place in one buffer."""
    centres: np.ndarray = np.add(cells, 0.5)
    np.log(centres, out=centres)
    return centres


def _gaussian_fill(rng: np.random.Generator, sigma: int, n: int, out: np.ndarray, start: int,
                   margin: float = _MARGIN) -> int:
    """:func:`_gaussian_block` writing its accepted draws to ``out[start:-1]`` (as many as fit; the
    last slot is :func:`_compact`'s spare); returns how many. A block whose float decisions all
    hold (all but ~10^-7 of the proposals do) is compacted by a compiled pass instead of numpy's
    boolean indexing; any other takes :func:`_gaussian_block`'s route from the same proposals (it
    draws the exact path's extra bits), so the draws and the stream are the same either way."""
    first, log_first, second, log_second = _proposal_cells(rng, n)
    signed, accept, sure = _gaussian_fast_path(first, log_first, second, log_second, float(sigma), margin, _LN_CELLS)
    written, unsure = _compact(signed, accept, sure, out, start)
    if unsure:
        accepted = _settle(rng, sigma, first, log_first, second, log_second, margin)[: len(out) - 1 - start]
        out[start : start + len(accepted)] = accepted
        written = len(accepted)
    return int(written)


def _proposal_cells(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(U₁'s cells, log of their centres, U₂'s cells with the sign bit, log of their centres) of n
    proposals, as :func:`_gaussian_block` draws them: n raw words for U₁, then n for U₂ (one
    ``random_raw(2n)``: the same words in the same order), split and converted to the cell centres
    c + ½ by one compiled pass, then numpy's log over both halves at once (the same values)."""
    bit_generator = getattr(rng, "bit_generator", None)
    if bit_generator is None:  # a generator of integers only: as _gaussian_block does it
        first = _uniform_cells(rng, n)
        second = _uniform_cells(rng, n, extra_bits=1)
        return first, _log_cell_centres(first), second, _log_cell_centres(second >> 1)
    raw = np.asarray(bit_generator.random_raw(2 * n), dtype=np.uint64)  # numpy types random_raw as Any
    centres = np.empty(2 * n)
    _split_cells(raw, n, _UNIFORM_BITS, centres)
    np.log(centres, out=centres)
    cells = raw.view(np.int64)
    return cells[:n], centres[:n], cells[n:], centres[n:]


@_compiled
def _split_cells(raw: np.ndarray, n: int, bits: int, centres: np.ndarray) -> None:
    """In place: raw[:n] >>= 64 − bits (U₁'s cells), raw[n:] >>= 63 − bits (U₂'s cells and the
    sign bit); centres = float64(cell) + ½ of each (U₂'s without the sign bit): numpy's
    conversions and sum (cells < 2^53 convert exactly; the sum rounds as IEEE addition does)."""
    first_shift, second_shift, one = np.uint64(64 - bits), np.uint64(63 - bits), np.uint64(1)
    for i in range(n):
        raw[i] >>= first_shift
        centres[i] = np.float64(np.int64(raw[i])) + 0.5
    for i in range(n, raw.shape[0]):
        raw[i] >>= second_shift
        centres[i] = np.float64(np.int64(raw[i] >> one)) + 0.5


def _gaussian_block(rng: np.random.Generator, sigma: int, n: int, margin: float = _MARGIN) -> np.ndarray:
    """Accepted draws of N_Z(0, σ²) from n proposals (CKS 2020 Algorithm 3, t = σ), fused:
    magnitude M = ⌊σ·(−ln U₁)⌋, sign from a bit, accepted iff −ln U₂ > (M − σ)²/(2σ²) and not −0."""
    first = _uniform_cells(rng, n)
    second = _uniform_cells(rng, n, extra_bits=1)  # low bit: sign; the other 53: U₂'s cell
    return _settle(rng, sigma, first, _log_cell_centres(first), second, _log_cell_centres(second >> 1), margin)


def _settle(rng: np.random.Generator, sigma: int, first: np.ndarray, log_first: np.ndarray, second: np.ndarray,
            log_second: np.ndarray, margin: float = _MARGIN) -> np.ndarray:
    """The accepted draws of one block of proposals: the compiled fast path, then the exact path
    for the decisions it leaves open (drawing more bits of their U's from ``rng``, in order)."""
    signed, accept, sure = _gaussian_fast_path(first, log_first, second, log_second, float(sigma), margin, _LN_CELLS)
    for i in np.flatnonzero(~sure):  # exact path: same U₁, U₂ (their cells), more bits as needed
        m = _exact_geometric(rng, int(first[i]), 1, sigma, sigma * (_LN_CELLS - math.log(float(first[i]) + 0.5)))
        negative = bool(second[i] & 1)
        signed[i] = -m if negative else m
        accept[i] = _LazyUniform(rng, int(second[i]) >> 1, _UNIFORM_BITS).below_exp(
            Fraction((m - sigma) ** 2, 2 * sigma * sigma)) and not (negative and m == 0)
    accepted: np.ndarray = signed[accept]
    return accepted


def discrete_gaussian(rng: np.random.Generator, sigma: int, size: int | tuple[int, ...], *,
                      margin: float = _MARGIN, block: int = _BLOCK) -> np.ndarray:
    """int64 draws from N_Z(0, σ²), P(x) ∝ exp(−x²/(2σ²)), for an integer σ >= 1 (exact).

    CKS 2020 Algorithm 3 with t = σ (correct for every t > 0; σ²/t = σ is then an integer): a
    discrete Laplace proposal Y (pmf ∝ e^{−|y|/σ}: geometric magnitude, uniform sign, −0 rejected)
    accepted w.p. exp(−(|Y| − σ)²/(2σ²)); every comparison exact (module comment above
    :func:`_below_exp`). Acceptance ≈ 0.76; ~15-18 ns a draw (σ <= 2^20).

    For tests and tuning only: ``margin``, the relative float error the fast path leaves to the
    exact path (the default, 2^-46, is what the exactness argument needs; a wider one sends more
    comparisons, 1.0 all of them, to the exact path: the same law), and ``block``, the proposals
    per pass (the draws depend on it). Releases use the defaults.
    """
    if not isinstance(sigma, (int, np.integer)) or sigma < 1 or sigma >= _SIGMA_LIMIT:
        raise ValueError(f"sigma must be an integer in [1, 2^40), got {sigma!r}")
    sigma = int(sigma)
    shape = _shape(size)
    n = int(np.prod(shape))
    if noise_is_off():
        return np.zeros(shape, dtype=np.int64)
    return _collect_into(lambda m, out, start: _gaussian_fill(rng, sigma, m, out, start, margin), n, 0.7,
                         block).reshape(shape)


# ----------------------------------------------------------------------------- grid releases
class KeyedNoiseSource(Protocol):
    """Noise drawn per public index (``app.core.privacy.keyed.IndexedNoise``)."""

    def discrete_gaussian(self, sigma: int, shape: tuple[int, ...]) -> np.ndarray: ...


NoiseSource = np.random.Generator | KeyedNoiseSource

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

    def release(self, rng: NoiseSource, value: np.ndarray) -> np.ndarray:
        """g·(round(value/g) + N_Z(0, S²)) elementwise, as float64."""
        statistic = np.asarray(value, dtype=np.float64, order="C")  # 0-d stays 0-d
        noise = _noise(rng, self.sigma, statistic.shape)
        out = np.empty(statistic.shape)
        _grid_release(statistic.reshape(-1), noise.reshape(-1), self.grid, _CLIP, out.reshape(-1))
        return out if out.ndim else out[()]  # a 0-d statistic gives a float64 scalar, as numpy's product did

    def release_symmetric(self, rng: NoiseSource, value: np.ndarray, out: np.ndarray | None = None,
                          mirror: bool = True) -> np.ndarray:
        """The release on the upper triangle (diagonal included) of each matrix, mirrored: the
        same numbers as :meth:`release` of the upper triangles (``np.triu_indices`` order) and
        :func:`mirror_upper`, in one compiled pass (no temporaries the size of the batch).

        ``out`` (float64, C-contiguous, ``value``'s shape) receives the release; it may be ``value``
        itself (each upper entry is read before any write to it; lower entries are only written).
        With ``mirror`` false only the upper triangles are written (for readers of those alone)."""
        rank = value.shape[-1]
        matrices = np.asarray(value, dtype=np.float64, order="C").reshape(-1, rank, rank)
        noise = _noise(rng, self.sigma, (matrices.shape[0], rank * (rank + 1) // 2))
        if out is None:
            out = np.empty(value.shape)
        elif out.shape != value.shape or out.dtype != np.float64 or not out.flags.c_contiguous:
            raise ValueError("out must be a C-contiguous float64 array of the value's shape")
        _grid_release_symmetric(matrices, noise, self.grid, _CLIP, out.reshape(-1, rank, rank), mirror)
        return out


def _noise(rng: NoiseSource, sigma: int, shape: tuple[int, ...]) -> np.ndarray:
    """The release's integer noise: from ``rng`` (a numpy Generator), or from a keyed source with
    its own ``discrete_gaussian(sigma, shape)`` (``app.core.privacy.keyed.IndexedNoise``: each row
    from its public index's stream)."""
    if isinstance(rng, np.random.Generator) or not hasattr(rng, "discrete_gaussian"):  # a generator (or a test double)
        return discrete_gaussian(cast(np.random.Generator, rng), sigma, shape)
    return np.asarray(rng.discrete_gaussian(sigma, shape))


@_compiled
def _grid_release(statistic: np.ndarray, noise: np.ndarray, grid: float, clip: float, out: np.ndarray) -> None:
    """out = g·float(int(rint(clip(x/g, ±clip))) + N) elementwise: numpy's operations of the grid
    release, in its order, fused (IEEE division and product; round half to even; exact integers)."""
    for i in range(statistic.shape[0]):
        counts = np.int64(np.rint(min(max(statistic[i] / grid, -clip), clip)))
        out[i] = grid * np.float64(counts + noise[i])


@_compiled
def _grid_release_symmetric(matrices: np.ndarray, noise: np.ndarray, grid: float, clip: float,
                            out: np.ndarray, mirror: bool) -> None:
    """:func:`_grid_release` of each matrix's upper triangle (row by row: ``np.triu_indices``
    order, noise[j, k] for its k-th entry), written to both triangles of ``out``: each upper row
    first (contiguous, so the loop vectorises), then mirrored into the lower triangle in 16 x 16
    tiles (which stay in cache; only with ``mirror``). Entry by entry the same numbers as before: the rounded count
    (|K| <= 2^52) and the noise are integers whose sum stays below 2^53, so adding them as float64
    is exact, as the int64 sum was (and vectorises: no float-integer conversions); only the lower
    triangle is written from the released upper one."""
    rank = matrices.shape[1]
    for j in range(matrices.shape[0]):
        k = 0
        for p in range(rank):
            for i in range(rank - p):  # integers below 2^53 in float64: the same sums as in int64
                counts = np.rint(min(max(matrices[j, p, p + i] / grid, -clip), clip))
                out[j, p, p + i] = grid * (counts + np.float64(noise[j, k + i]))
            k += rank - p
        if not mirror:
            continue
        released = out[j]
        for p0 in range(0, rank, 16):
            for q0 in range(p0, rank, 16):
                for p in range(p0, min(p0 + 16, rank)):
                    for q in range(max(q0, p + 1), min(q0 + 16, rank)):
                        released[q, p] = released[p, q]


def mirror_upper(upper: np.ndarray, rank: int) -> np.ndarray:
    """Symmetric (..., rank, rank) matrices from their upper triangles (``np.triu_indices`` order)."""
    _, mirror = _triangle_maps(rank)
    return np.take(upper, mirror, axis=-1).reshape(upper.shape[:-1] + (rank, rank))


@functools.lru_cache(maxsize=16)
def _triangle_maps(rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(flat indices of the upper triangle, for each flat entry its position in that list)."""
    rows, cols = np.triu_indices(rank)
    position = np.empty((rank, rank), dtype=np.int64)
    position[rows, cols] = np.arange(rows.size)
    position[cols, rows] = np.arange(rows.size)
    return rows * rank + cols, position.ravel()


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
        if sigma < _SIGMA_LIMIT or resolution == 1:
            break
        resolution = max(1, resolution // 2)
    if sigma >= _SIGMA_LIMIT:
        raise ValueError("noise multiplier too large for the exact discrete Gaussian sampler")
    return GridGaussian(grid=grid, sigma=sigma, sensitivity=float(sensitivity), multiplier=float(multiplier))
