"""Exact, order-free sums of released statistics (fixed point on a public power-of-two scale).

A release's statistic must be the same number however its terms are grouped (chunks, threads,
the partitions of a distributed run; docs/algorithms.md §7), and its sensitivity must hold for
the terms actually summed. Each term x with |x| <= bound (a public constant: a clip norm, half
the rating range) is replaced by q·round(x/q), the integer clipped to ±⌊bound/q⌋, with the
public quantum

    q = 2^(⌊log₂ bound⌋ − FIXED_BITS),  so bound/q lies in [2^20, 2^21),

so |q·round(x/q)| <= bound: every per-term bound, hence every sensitivity, holds for the rounded
terms. Terms are integers below 2^21 in magnitude, carried as float64: any sum of fewer than 2^32
of them (4·10⁹ terms per statistic entry) has every partial sum an integer below 2^53, so
float64 addition is exact in any order and the total times the power of two q is exact too.
(That capacity is a documented limit, not checked: a refusal would depend on the data's size.)
Rounding moves each term by at most q/2 (q within a quantum of the bound, where the clip acts),
q <= bound·2^-20 ≈ 9.5·10⁻⁷·bound, against noise of at least the release's sensitivity (>= bound)
times its multiplier: n terms move a sum by at most n·q, and by about √n·q/√12 when the
rounding errors are spread.

Non-negative weights whose squares a user's sensitivity sums (the adaptive weights c_ij, Σ_j c_ij²
<= B) are rounded down instead (:func:`floor_weights`), after a 2^-30 relative margin that covers
their float computation, so Σ_j ĉ_ij² <= B holds exactly for the weights used.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["FIXED_BITS", "fixed_quantum", "fixed_terms", "exact_sum", "exact_bincount", "floor_weights"]

FIXED_BITS = 20
_WEIGHT_MARGIN = 1.0 - 2.0**-30


def fixed_quantum(bound: float, bits: int = FIXED_BITS) -> float:
    """q = 2^(⌊log₂ bound⌋ − bits): a power of two with bound/q in [2^bits, 2^(bits+1))."""
    if not (math.isfinite(bound) and bound > 0):
        raise ValueError("a fixed-point bound must be positive and finite")
    _, exponent = math.frexp(bound)  # bound = m·2^e, m in [0.5, 1)
    return math.ldexp(1.0, exponent - 1 - bits)


def fixed_terms(values: np.ndarray, bound: float, out: np.ndarray | None = None) -> np.ndarray:
    """round(x/q) clipped to ±⌊bound/q⌋, as integer-valued float64 (q = :func:`fixed_quantum`);
    into ``out`` if given (float64, ``values``' shape; may be ``values`` itself: no temporary)."""
    step = fixed_quantum(bound)
    limit = math.floor(bound / step)
    terms = np.divide(np.asarray(values, dtype=np.float64), step, out=out)  # a power of two: exact
    np.rint(terms, out=terms)
    return np.clip(terms, -limit, limit, out=terms)


def exact_sum(terms: np.ndarray, bound: float) -> float:
    """q·Σ terms of :func:`fixed_terms` (exact in any order, fewer than 2^32 terms)."""
    return float(np.sum(terms)) * fixed_quantum(bound)


def exact_bincount(bins: np.ndarray, terms: np.ndarray | None, length: int, bound: float = 1.0) -> np.ndarray:
    """q·Σ terms per bin (``terms`` None: counts), exact in any order (fewer than 2^32 terms a bin)."""
    if terms is None:
        return np.bincount(bins, minlength=length).astype(np.float64)
    return np.bincount(bins, weights=terms, minlength=length) * fixed_quantum(bound)


def floor_weights(weights: np.ndarray, bound: float, out: np.ndarray | None = None) -> np.ndarray:
    """ĉ = q·⌊c·(1 − 2^-30)/q⌋ for weights 0 <= c <= bound: ĉ <= c, so Σ ĉ² <= Σ c² (module doc).
    Returns the integer-valued multiples ĉ/q (float64; into ``out`` if given, which may be
    ``weights`` itself); scale by ``fixed_quantum(bound)``."""
    step = fixed_quantum(bound)
    scaled = np.multiply(np.asarray(weights, dtype=np.float64), _WEIGHT_MARGIN, out=out)
    scaled /= step
    return np.floor(scaled, out=scaled)

