"""Discrete Laplace noise: integer draws with pmf ∝ exp(−a|x|), no floating-point inversion.

DLap(a) is sampled exactly (Canonne, Kamath, Steinke 2020, arXiv:2004.00010, Algorithm 2's
construction, in ``app.core.privacy.discrete_noise``): the float a is a dyadic rational p/q, and the pmf
tanh(a/2)·e^{−a|x|} ∝ e^{−|x|p/q} is sampled from uniform integers by exact comparisons with
e^{−mp/q} (numpy's ``geometric`` inverts a float CDF for small success probabilities without
any bound on the rounding, which is exactly what this module must avoid). The draw is an
integer, so a released value g·(statistic + draw) on a grid of step g carries no low-order float
bits that depend on the statistic (the attack of Mironov 2012 on textbook Laplace samplers).
Accounted by ``dp_event.DiscreteLaplaceDpEvent(a, Δ)`` with Δ the integer L1 sensitivity on the grid.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from app.core.privacy.discrete_noise import discrete_laplace_exact

__all__ = ["discrete_laplace_noise", "dithered_laplace_noise", "snap_to_grid"]


def _check(noise_parameter: float) -> float:
    a = float(noise_parameter)
    if not math.isfinite(a) or a <= 0:
        raise ValueError(f"the discrete Laplace parameter must be finite and > 0, got {noise_parameter!r}")
    return a


def discrete_laplace_noise(rng: np.random.Generator, noise_parameter: float, size: int | tuple[int, ...]) -> np.ndarray:
    """int64 draws from DLap(a): pmf tanh(a/2)·e^{−a|x|} on the integers (exact: a = p/q as a
    fraction of Python integers, pmf ∝ e^{−|x|p/q}, CKS 2020 Algorithm 2's construction)."""
    ratio = Fraction(_check(noise_parameter))
    return discrete_laplace_exact(rng, ratio.numerator, ratio.denominator, size)


def dithered_laplace_noise(rng: np.random.Generator, scale: float, grid: float, size: int | tuple[int, ...]) -> np.ndarray:
    """Continuous noise g·(K + U), K ~ DLap(g/scale), U ~ Uniform(−½, ½): density ∝ exp(−|round(x/g)|·g/scale).

    For any shift s its density ratio is at most exp((|s| + g)/scale): a Laplace(scale) bound with
    the shift enlarged by one grid step (|round(u + v) − round(u)| <= |v| + 1). Used where a
    continuous density is needed (objective perturbation's change of variables).
    """
    if not (math.isfinite(scale) and scale > 0 and math.isfinite(grid) and grid > 0):
        raise ValueError("scale and grid must be finite and > 0")
    k = discrete_laplace_noise(rng, grid / scale, size)
    return grid * (k + rng.random(size=size) - 0.5)


def snap_to_grid(values: np.ndarray, grid: float) -> np.ndarray:
    """Round ``values`` to integer multiples of ``grid`` (returned as int64 grid counts)."""
    return np.rint(np.asarray(values, dtype=np.float64) / grid).astype(np.int64)
