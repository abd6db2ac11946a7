"""Projections and projected-gradient solvers over nuclear-norm balls (Davenport et al. 2014,
arXiv:1209.3672 §5).

Two kinds of solver:

* :func:`projected_gradient` — K fixed steps X ← P_C(X − η·G(X)) over C = {‖X‖_* <= τ, ‖X‖_∞ <= α}
  with a user-supplied (possibly noisy) gradient. P_C is approximated by the nuclear-ball
  projection followed by clipping (the last step, so ‖X‖_∞ <= α holds exactly). Used by the
  non-private fit, InP and GraP, where any deterministic map of private inputs is post-processing.
* :func:`minimise_strongly_convex` — the exact minimiser (to a proven, data-independent Frobenius
  distance ρ) of a μ-strongly convex, L-smooth objective over the nuclear ball {‖X‖_* <= τ}, as
  ObjP and OutP need. Projected gradient with η = 2/(L+μ) contracts the distance to the
  minimiser by q = (L−μ)/(L+μ) per step (the gradient map of a μ-strongly convex L-smooth function
  is q-Lipschitz for this η; the projection is non-expansive), and ‖X_0 − X*‖_F = ‖X*‖_F <= τ from
  X_0 = 0. So T = ⌈log(ρ/(2τ))/log q⌉ steps give ‖X_T − X*‖_F <= ρ/2 for every data set, and
  privacy.solver_tolerance_floor keeps floating-point error within the other ρ/2. The
  nuclear-ball projection here is exact: a truncated SVD is accepted only when the unseen
  singular values are certified below the threshold (from the residual, with a margin), else a
  full SVD is taken. The proof is in exact arithmetic, so ρ must be far above machine error.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.sparse.linalg import svds

__all__ = [
    "contraction_steps",
    "l1_threshold",
    "minimise_strongly_convex",
    "project_feasible",
    "project_nuclear",
    "projected_gradient",
    "truncated_svd",
]

Gradient = Callable[[np.ndarray], np.ndarray]
_FULL_SVD_MAX_DIM = 256
_CERT_SLACK = 1e-10  # relative margin on the certified bound of the unseen singular values


def l1_threshold(s: np.ndarray, tau: float) -> float:
    """θ >= 0 with Σ max(s_i − θ, 0) = τ for sorted-descending s >= 0 (0 when Σ s <= τ)."""
    if float(np.sum(s)) <= tau:
        return 0.0
    cums = np.cumsum(s)
    ks = np.arange(1, len(s) + 1)
    thetas = (cums - tau) / ks
    k = int(np.max(np.flatnonzero(s - thetas > 0))) + 1
    return float(thetas[k - 1])


def _shrink(u: np.ndarray, s: np.ndarray, vt: np.ndarray, theta: float) -> np.ndarray:
    keep = s > theta
    return np.asarray((u[:, keep] * (s[keep] - theta)) @ vt[keep])


def _full_projection(y: np.ndarray, tau: float) -> np.ndarray:
    u, s, vt = np.linalg.svd(y, full_matrices=False)
    return _shrink(u, s, vt, l1_threshold(s, tau))


def _top_svd(y: np.ndarray, q: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    u, s, vt = svds(y, k=q, random_state=0)
    order = np.argsort(-s)
    return u[:, order], s[order], vt[order]


def project_nuclear(y: np.ndarray, tau: float, rank_hint: int = 8) -> np.ndarray:
    """Exact Euclidean projection onto {‖X‖_* <= τ}.

    With the top-q triplets (U, s, V) and the residual R = Y − U diag(s) Vᵀ, every other singular
    value of Y is <= ‖R‖_2 <= ‖R‖_F (Weyl: U diag(s) Vᵀ has rank q), and ‖Y‖_* <= Σ s + ‖R‖_* <=
    Σ s + sqrt(min(d))·‖R‖_F. ‖R‖_F is computed from R itself, not as sqrt(‖Y‖² − Σ s²), which
    cancels catastrophically when the top q carry almost all of ‖Y‖ and could certify a truncated
    projection wrongly; a margin of ``_CERT_SLACK``·‖Y‖_F covers the rounding in R and in the
    triplets. The truncated result is exact if θ (from the top q) >= that bound, or if Y is
    certified inside the ball; otherwise q doubles, then a full SVD. "Exact" means up to floating
    point (~1e-13 relative): the proven tolerance ρ of :func:`minimise_strongly_convex` must be
    far above machine error × ‖Y‖_F × steps (the default ρ = 1e-6 is).
    """
    small = min(y.shape)
    if small <= _FULL_SVD_MAX_DIM:
        return _full_projection(y, tau)
    slack = _CERT_SLACK * float(np.linalg.norm(y))
    q = max(1, min(rank_hint, small - 2))
    while q <= small // 4:
        u, s, vt = _top_svd(y, q)
        rest = float(np.linalg.norm(y - (u * s) @ vt)) + slack
        if float(np.sum(s)) + math.sqrt(small) * rest <= tau:
            return y.copy()
        theta = l1_threshold(s, tau)
        if theta > 0 and rest <= theta:
            return _shrink(u, s, vt, theta)
        q *= 2
    return _full_projection(y, tau)


def truncated_svd(y: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Approximate top-``rank`` singular triplets, largest first (full SVD for small matrices).

    Randomised range finder with power iterations (Halko, Martinsson, Tropp 2011, Alg. 4.4) and a
    fixed seed; used only where any deterministic map is post-processing (InP, GraP, publishing).
    """
    rank = max(1, min(rank, min(y.shape)))
    if min(y.shape) <= _FULL_SVD_MAX_DIM or rank >= min(y.shape) - 1:
        u, s, vt = np.linalg.svd(y, full_matrices=False)
        return u[:, :rank], s[:rank], vt[:rank]
    sketch = np.random.default_rng(0).normal(size=(y.shape[1], rank + 10))
    q, _ = np.linalg.qr(y @ sketch)
    for _ in range(4):
        q, _ = np.linalg.qr(y.T @ q)
        q, _ = np.linalg.qr(y @ q)
    u, s, vt = np.linalg.svd(q.T @ y, full_matrices=False)
    return (q @ u)[:, :rank], s[:rank], vt[:rank]


def project_feasible(y: np.ndarray, tau: float, alpha: float, rank_hint: int = 8) -> np.ndarray:
    """Approximate P_C: rank-``rank_hint`` nuclear-ball projection, then clip to [−α, α]."""
    if min(y.shape) <= _FULL_SVD_MAX_DIM:
        x = _full_projection(y, tau)
    else:
        u, s, vt = truncated_svd(y, rank_hint)
        x = _shrink(u, s, vt, l1_threshold(s, tau))
    return np.clip(x, -alpha, alpha, out=x)


def projected_gradient(gradient: Gradient, shape: tuple[int, int], *, tau: float, alpha: float,
                       n_steps: int, step_size: float, rank_hint: int = 8) -> np.ndarray:
    """K fixed steps from X_0 = 0 with a fixed step size (no line search: see GraP)."""
    x = np.zeros(shape)
    for _ in range(n_steps):
        x = project_feasible(x - step_size * gradient(x), tau, alpha, rank_hint)
    return x


def contraction_steps(tau: float, smooth: float, strong: float, tolerance: float) -> int:
    """T with q^T·τ <= ρ, q = (L − μ)/(L + μ): the data-independent step count."""
    if not (strong > 0 and smooth >= strong and tolerance > 0 and tau > 0):
        raise ValueError("need L >= mu > 0, tau > 0 and tolerance > 0")
    if tolerance >= tau:
        return 0
    q = (smooth - strong) / (smooth + strong)
    return 0 if q == 0 else math.ceil(math.log(tolerance / tau) / math.log(q))


def minimise_strongly_convex(gradient: Gradient, shape: tuple[int, int], *, tau: float, smooth: float,
                             strong: float, tolerance: float, rank_hint: int = 8) -> tuple[np.ndarray, int]:
    """(X_T, T) with ‖X_T − X*‖_F <= ``tolerance`` for every data set (module docstring): the
    contraction reaches ``tolerance``/2 in exact arithmetic and the other half is left to
    rounding (privacy.solver_tolerance_floor bounds it from the config)."""
    n_steps = contraction_steps(tau, smooth, strong, tolerance / 2.0)
    step = 2.0 / (smooth + strong)
    x = np.zeros(shape)
    for _ in range(n_steps):
        x = project_nuclear(x - step * gradient(x), tau, rank_hint)
    return x, n_steps
