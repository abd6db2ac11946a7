"""Link functions and numerically stable one-bit log-likelihoods (Davenport et al. 2014,
arXiv:1209.3672; Li et al., arXiv:2110.00719 §3.2).

A vote y ∈ {±1} on entry x has P(y = +1) = h(x), with h(x) = 1/(1+e^{−x}) (logistic) or Φ(x)
(probit, noise scale σ = 1 as in the paper's experiments). Both noises are symmetric, so
1 − h(x) = h(−x) and the per-entry loss is f(yx) with f(t) = −log h(t).
Randomised votes (flip w.p. p, Li et al. eq. (3) with p1 = p2 = p) follow c(x) = h(x)(1−2p) + p,
again symmetric: 1 − c(x) = c(−x), so the debiased loss is −log c(yx).
Everything is computed in log space (logaddexp, log_ndtr) so that |x| up to ~1e3 is safe.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import log_ndtr

from app.core.arrays import FloatArray

__all__ = [
    "LINKS",
    "curvature_bound",
    "dloss",
    "gradient_bound",
    "huber_dloss",
    "huber_loss",
    "log_h",
    "loss",
    "prob_up",
]

LINKS = ("logistic", "probit")
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _check_link(link: str) -> None:
    if link not in LINKS:
        raise ValueError(f"link must be one of {LINKS}, got {link!r}")


def log_h(t: ArrayLike, link: str) -> FloatArray:
    """log h(t)."""
    _check_link(link)
    x = np.asarray(t, dtype=np.float64)
    return np.asarray(-np.logaddexp(0.0, -x) if link == "logistic" else log_ndtr(x), dtype=np.float64)


def _log_dh(t: FloatArray, link: str) -> FloatArray:
    """log h'(t): logistic σ(t)σ(−t), probit φ(t)."""
    if link == "logistic":
        return np.asarray(-np.logaddexp(0.0, -t) - np.logaddexp(0.0, t))
    return -0.5 * t * t - _LOG_SQRT_2PI


def _log_c(t: FloatArray, link: str, flip: float) -> FloatArray:
    """log c(t), c = p + (1 − 2p) h (p = 0: log h)."""
    if flip == 0.0:
        return log_h(t, link)
    return np.asarray(np.logaddexp(math.log(flip), math.log1p(-2.0 * flip) + log_h(t, link)))


def _check_flip(flip: float) -> float:
    flip = float(flip)
    if not 0.0 <= flip < 0.5:
        raise ValueError(f"flip probability must lie in [0, 1/2), got {flip!r}")
    return flip


def prob_up(x: ArrayLike, link: str) -> FloatArray:
    """P(thumbs up) = h(x)."""
    return np.exp(log_h(x, link))


def loss(x: ArrayLike, y: ArrayLike, link: str, flip: float = 0.0) -> FloatArray:
    """Per-entry negative log-likelihood −log c(yx) (Li et al. eq. (2)/(4))."""
    _check_link(link)
    return -_log_c(np.asarray(y) * np.asarray(x, dtype=np.float64), link, _check_flip(flip))


def dloss(x: ArrayLike, y: ArrayLike, link: str, flip: float = 0.0) -> FloatArray:
    """d/dx of :func:`loss`: −y (1−2p) h'(yx) / c(yx)."""
    _check_link(link)
    flip = _check_flip(flip)
    votes = np.asarray(y, dtype=np.float64)
    t = votes * np.asarray(x, dtype=np.float64)
    return -votes * np.exp(math.log1p(-2.0 * flip) + _log_dh(t, link) - _log_c(t, link, flip))


def huber_loss(x: ArrayLike, y: ArrayLike, link: str, alpha: float) -> FloatArray:
    """f(yx) for yx >= −α, its tangent line below: convex, |f'| <= :func:`gradient_bound`.

    f_α is C¹ but not C² at t = −α (f'' jumps from f''(−α) to 0). Objective perturbation only
    needs what this gives: f_α' is monotone and λ_h-Lipschitz, so the map X ↦ B(X) solving the
    first-order condition is Lipschitz and injective, hence differentiable almost everywhere
    (Rademacher), and the area formula gives the density of X* as p_B(B(X))·|det ∇B(X)| for
    almost every X. The non-differentiable set {X : y_ij X_ij = −α for some (i, j) ∈ Ω} is a
    finite union of hyperplanes (Lebesgue-null), and off it every vote's curvature lies in
    [0, λ_h], so the Jacobian ratio bound of train.objp_minimiser holds almost everywhere, which
    suffices for the probability of every event. A C² blend would move ζ or λ_h, so none is made.
    """
    t = np.asarray(y, dtype=np.float64) * np.asarray(x, dtype=np.float64)
    f0 = float(loss(-alpha, 1.0, link))
    slope = float(dloss(-alpha, 1.0, link))
    return np.where(t >= -alpha, loss(np.maximum(t, -alpha), 1.0, link), f0 + slope * (t + alpha))


def huber_dloss(x: ArrayLike, y: ArrayLike, link: str, alpha: float) -> FloatArray:
    """d/dx of :func:`huber_loss`: y·f'(max(yx, −α))."""
    votes = np.asarray(y, dtype=np.float64)
    t = votes * np.asarray(x, dtype=np.float64)
    return votes * dloss(np.maximum(t, -alpha), 1.0, link)


def gradient_bound(link: str, alpha: float) -> float:
    """ζ = sup_t |f'_α(t)| = |f'(−α)| (|f'| decreases in t for both links): σ(α) or φ(α)/Φ(−α)."""
    return float(abs(dloss(-float(alpha), 1.0, link)))


def curvature_bound(link: str) -> float:
    """λ_h = sup_t f''(t): 1/4 for the logistic link, 1 for probit (0 < f'' < 1 for −log Φ)."""
    _check_link(link)
    return 0.25 if link == "logistic" else 1.0
