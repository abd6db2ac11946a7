"""DPFW: private Frank-Wolfe matrix completion (Jain, Thakkar & Thakurta 2018, arXiv:1712.09765).

The paper's Algorithm 1 with the corrections of docs/algorithms.md §2; the private top eigenvector is
either the dense noisy Gram matrix (Algorithm 1) or private Oja (Algorithm 2).
Privacy unit: one user and all of their ratings; neighbouring data sets add or remove one user.

Pre-processing (privileged, nothing released): each user's ratings are centred by her own mean
(over all of her ratings), at most ξ of them are kept (uniformly at random, seeded) and the
centred row is clipped to L2 norm <= L. This is Π_{L,Ω} applied to the data, so ‖P_Ω(Y*_i)‖ <= L.

Local state (privileged): Y_i^(0) = 0 and, for s = 1..T−1 with the released (v̂_s, λ̂'_s),
    A_i = P_Ω(Y_i − Y*_i),  û_i = A_i v̂_s / λ̂'_s,
    Y_i ← Π_{L,Ω}((1 − 1/T) Y_i − (k/T) û_i v̂_sᵀ)                                   (Alg. 1, local)
where Π_{L,Ω} rescales the whole row so that its norm over Ω_i is <= L. Hence ‖P_Ω(Y_i)‖ <= L and
‖A_i‖ <= ‖P_Ω(Y_i)‖ + ‖P_Ω(Y*_i)‖ <= 2L at every step. Y_i = Σ_s c_{i,s} v̂_s is kept as
coefficients C (m × (T−1)) plus its values on Ω (one array of nnz), so a step costs O(nnz + m·T).

Releases (T−1 eigen-steps; the paper's first local update uses v̂ = 0 and is a no-op, its T-th
returns no statistic). Each is a Gaussian mechanism recorded as a ``GaussianDpEvent`` with noise
multiplier = noise std / L2 sensitivity:

========================  ==========================  ==============================================
release (per step)        statistic                   L2 sensitivity, add/remove one user i
========================  ==========================  ==============================================
dense: Ŵ                  W = Σ_i A_iᵀA_i (upper      ‖A_iᵀA_i‖_F = ‖A_i‖² <= 4L² (the upper
                          triangle, mirrored)         triangle's norm is at most the Frobenius norm)
Oja: Γ products           AᵀA v + g, v public          ‖A_iᵀ(A_i v)‖ <= ‖A_i‖²‖v‖ <= 4L²
                          (the previous iterate)
Oja: eigenvalue           ‖A v̂‖² = Σ_i (A_i v̂)²       (A_i v̂)² <= 4L²
once: item counts c̃       ratings per item after the  sqrt(ξ): <= ξ distinct items, +1 each
                          ξ-cap (floored at 1)
========================  ==========================  ==============================================

Other users' statistics depend on user i only through earlier public releases (adaptive
composition). Under *replacement* of one user the Gram statistic moves by A_iᵀA_i − A'_iᵀA'_i,
whose Frobenius norm the paper bounds by 4·sqrt(2)·L²; we account add/remove (4L²) and state it.

The DP item counts serve the DP-popular fallback and the public popularity endpoint.
The run's event is ComposedDpEvent([counts, SelfComposedDpEvent(one step, T − 1)]) with one step = one
Gaussian (dense) or Γ + 1 Gaussians (Oja); :func:`dpfw_event` builds it from the config alone and
training rebuilds it from the record of releases actually made (RuntimeError if they differ).
It is calibrated by the RDP accountant (:func:`calibrate`); the paper's closed-form zCDP σ
(:func:`paper_sigma`) is kept for comparison only.

The λ̂ inflation λ̂' = λ̂ + sqrt(σ·log(n/β))·n^{1/4} (σ = the noise std of the step's matrix or
product releases) is optional (λ̂ is published in the artifact, never logged); it keeps ‖û‖ <= 1 w.h.p. but can dominate λ̂.
The public artifact is the released sequence (v̂_s, λ̂'_s) plus the config (without the seed);
a user's scores are obtained by replaying the local updates from her own row (post-processing).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from dp_accounting import dp_event

from app.core.data.ratings import Ratings
from app.core.mf.artifact import ArtifactError, read_sealed, storable_ids, write_sealed
from app.core.mf.foldin import candidate_items, top_n
from app.core.privacy import accounting
from app.core.privacy.releaser import GaussianReleaser
from app.core.privacy.sampling import clip_scale, per_user_sample

__all__ = [
    "EIGEN_METHODS",
    "DPFWConfig",
    "FrankWolfeModel",
    "TrainingTrace",
    "PrivateRows",
    "calibrate",
    "dpfw_event",
    "count_noise_std",
    "gram_sensitivity",
    "paper_sigma",
    "prepare_rows",
    "gram_statistic",
    "gram_product",
    "top_eigenvector_dense",
    "top_eigenvector_oja",
    "train_dpfw",
    "fold_in_users_dpfw",
    "predict_dpfw",
    "replay_user",
    "recommend_dpfw",
    "save_frank_wolfe",
    "load_frank_wolfe",
]

EIGEN_METHODS = ("auto", "dense", "oja")
FORMAT_VERSION = 1
Progress = Callable[[float, str], None]
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DPFWConfig:
    """DPFW hyper-parameters; every field but ``seed`` is published with the model.

    ``noise_multiplier`` z is the multiplier of the dense Gram release or of each Oja product;
    the Oja eigenvalue release uses z·``eigenvalue_noise_ratio``. :func:`calibrate` scales both.
    """

    nuclear_norm: float = 1000.0  # k
    n_steps: int = 10  # T (T − 1 releases)
    row_clip: float = 5.0  # L
    max_ratings_per_user: int = 80  # ξ
    eigen_method: str = "auto"  # "auto": dense up to dense_max_items items, else Oja
    dense_max_items: int = 2000
    oja_iterations: int = 10  # Γ
    oja_learning_rate: float | None = None  # None: the paper's η = 1/(Γ σ sqrt(n))
    noise_multiplier: float = 5.0
    eigenvalue_noise_ratio: float = 1.0
    count_noise_ratio: float = 4.0  # the DP item counts: z·ratio
    eigen_inflation: bool = False
    failure_probability: float = 0.1  # β of the inflation
    default_mean: float = 0.0  # public offset for a user without ratings
    seed: int = 0

    def __post_init__(self) -> None:
        if self.eigen_inflation and not (self.noise_multiplier > 0):
            raise ValueError("eigen_inflation needs noise (sigma > 0): the noise multiplier must be > 0")
        if self.eigen_method not in EIGEN_METHODS:
            raise ValueError(f"eigen_method must be one of {EIGEN_METHODS}, got {self.eigen_method!r}")
        if not isinstance(self.n_steps, int) or self.n_steps < 2:
            raise ValueError("n_steps (T) must be an integer >= 2: T − 1 eigen-steps are released")
        for name in ("max_ratings_per_user", "oja_iterations", "dense_max_items"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.eigen_inflation, bool):
            raise ValueError("eigen_inflation must be a boolean")
        for name in ("nuclear_norm", "row_clip", "noise_multiplier", "eigenvalue_noise_ratio", "count_noise_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        if not 0 < self.failure_probability < 1:
            raise ValueError("failure_probability (beta) must lie in (0, 1)")
        if self.oja_learning_rate is not None and not (math.isfinite(self.oja_learning_rate) and self.oja_learning_rate > 0):
            raise ValueError("oja_learning_rate must be finite and > 0 (or None for the paper's value)")
        if not math.isfinite(self.default_mean):
            raise ValueError("default_mean must be finite")

    def method(self, n_items: int | None) -> str:
        """The eigen method used for a catalogue of ``n_items`` items (public)."""
        if self.eigen_method != "auto":
            return self.eigen_method
        if n_items is None:
            raise ValueError("eigen_method 'auto' needs the (public) number of items")
        return "oja" if n_items > self.dense_max_items else "dense"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DPFWConfig:
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown DPFW parameters: {sorted(unknown)}")
        return cls(**data)


def count_noise_std(config: DPFWConfig) -> float:
    """The std of the item-count release's noise: sensitivity √(max ratings a user) times its multiplier."""
    return math.sqrt(config.max_ratings_per_user) * config.noise_multiplier * config.count_noise_ratio


def public_config(config: DPFWConfig) -> dict[str, Any]:
    """The config as published: everything but the seed."""
    data = config.to_dict()
    del data["seed"]
    return data


# ---------------------------------------------------------------------------- accounting
def gram_sensitivity(row_clip: float) -> float:
    """L2 sensitivity 4L² of every DPFW release under add/remove of one user (‖A_i‖ <= 2L)."""
    return 4.0 * row_clip**2


def _per_step_releases(config: DPFWConfig, method: str) -> list[float]:
    z = config.noise_multiplier
    if method == "dense":
        return [z]
    return [z] * config.oja_iterations + [z * config.eigenvalue_noise_ratio]


def dpfw_event(config: DPFWConfig, n_items: int | None = None) -> dp_event.DpEvent:
    """The run's event, known before any data is touched: DP counts, then T − 1 identical eigen-steps."""
    step = accounting.compose([accounting.gaussian(m) for m in _per_step_releases(config, config.method(n_items))])
    counts = accounting.gaussian(config.noise_multiplier * config.count_noise_ratio)
    return accounting.compose([counts, dp_event.SelfComposedDpEvent(step, config.n_steps - 1)])


def calibrate(target_epsilon: float, delta: float, config: DPFWConfig, n_items: int | None = None) -> DPFWConfig:
    """``config`` with its noise scaled so the run is (target ε, δ)-DP by the RDP accountant."""
    accounting.validate_privacy_target(target_epsilon, delta)
    config.method(n_items)  # raises early for 'auto' without n_items
    base = config.noise_multiplier
    scale = accounting.calibrate_scale(
        lambda s: dpfw_event(replace(config, noise_multiplier=base * s), n_items), target_epsilon, delta,
        lower=1e-4 / base, upper=1e6 / base,
    )
    return replace(config, noise_multiplier=base * scale)


def paper_sigma(epsilon: float, delta: float, n_steps: int, row_clip: float) -> float:
    """The paper's σ = L²·sqrt(64·T·log(1/δ))/ε (zCDP; Alg. 1 input). For comparison only.

    The zCDP -> (ε, δ) conversion it relies on needs ε <= 2 log(1/δ); larger ε raise.
    """
    accounting.validate_privacy_target(epsilon, delta)
    if epsilon > 2.0 * math.log(1.0 / delta):
        raise ValueError(f"the paper's sigma needs epsilon <= 2 log(1/delta) = {2 * math.log(1 / delta):.4g}")
    if n_steps < 1 or row_clip <= 0:
        raise ValueError("n_steps must be >= 1 and row_clip > 0")
    return row_clip**2 * math.sqrt(64.0 * n_steps * math.log(1.0 / delta)) / epsilon


def _inflation(config: DPFWConfig, sigma: float, n_items: int) -> float:
    """sqrt(σ·log(n/β))·n^{1/4} (Alg. 1) when enabled, else 0."""
    if not config.eigen_inflation:
        return 0.0
    return float(math.sqrt(sigma * max(math.log(n_items / config.failure_probability), 0.0)) * n_items**0.25)


# ---------------------------------------------------------------------------- private rows
@dataclass(frozen=True)
class PrivateRows:
    """Users' centred, capped, clipped rows P_Ω(Y*) in CSR layout (private, never released)."""

    indptr: np.ndarray
    indices: np.ndarray
    target: np.ndarray  # Y*_ij on Ω, each row's norm <= L
    row_of: np.ndarray  # user of each stored entry
    means: np.ndarray  # each user's own mean (default_mean when she has no rating)
    n_items: int

    @property
    def n_users(self) -> int:
        return len(self.indptr) - 1

    def matrix(self, values: np.ndarray) -> sp.csr_matrix:
        return sp.csr_matrix((values, self.indices, self.indptr), shape=(self.n_users, self.n_items))


def _row_norms(row_of: np.ndarray, values: np.ndarray, n_users: int) -> np.ndarray:
    return np.sqrt(np.bincount(row_of, weights=values * values, minlength=n_users))


def _rows_from_arrays(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, n_users: int, n_items: int,
                      config: DPFWConfig, keep: np.ndarray | None) -> PrivateRows:
    counts = np.bincount(rows, minlength=n_users)
    sums = np.bincount(rows, weights=values, minlength=n_users)
    means = np.full(n_users, float(config.default_mean))
    means[counts > 0] = sums[counts > 0] / counts[counts > 0]
    centred = values - means[rows]
    if keep is not None:
        rows, cols, centred = rows[keep], cols[keep], centred[keep]
    centred = centred * clip_scale(_row_norms(rows, centred, n_users), config.row_clip)[rows]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n_users))]).astype(np.int64)
    return PrivateRows(indptr=indptr, indices=cols.astype(np.int64), target=centred, row_of=rows,
                       means=means, n_items=n_items)


def prepare_rows(ratings: Ratings, config: DPFWConfig, rng: np.random.Generator | None, *, cap: bool = True) -> PrivateRows:
    """Own-mean centring (all of a user's ratings), ξ-cap (uniform, ``rng``), clip to norm L.

    ``cap=False`` (fold-in) keeps all of the user's ratings.
    """
    rows, cols, values = ratings.coo()
    if cap and rng is None:
        raise ValueError("the per-user cap samples with a generator: pass rng")
    keep = per_user_sample(ratings, config.max_ratings_per_user, rng) if cap and rng is not None else None
    return _rows_from_arrays(rows, cols, values, ratings.n_users, ratings.n_items, config, keep)


# ---------------------------------------------------------------------------- statistics
def _row_products(rows: PrivateRows, a: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(A_i · v) for every user: O(nnz)."""
    return np.bincount(rows.row_of, weights=a * v[rows.indices], minlength=rows.n_users)


def gram_product(rows: PrivateRows, a: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Aᵀ(A v) without forming AᵀA: O(nnz + n)."""
    u = _row_products(rows, a, v)
    return np.bincount(rows.indices, weights=a * u[rows.row_of], minlength=rows.n_items)


def gram_statistic(rows: PrivateRows, a: np.ndarray, chunk_entries: int = 1 << 22) -> np.ndarray:
    """W = Σ_i A_iᵀA_i (n × n), sparse product or dense user chunks, whichever is cheaper."""
    m, n = rows.n_users, rows.n_items
    counts = np.diff(rows.indptr).astype(np.float64)
    matrix = rows.matrix(a)
    if 16.0 * float(np.sum(counts**2)) <= float(m) * n * n:
        w = (matrix.T @ matrix).toarray()
    else:
        w = np.zeros((n, n))
        step = max(1, chunk_entries // max(n, 1))
        for lo in range(0, m, step):
            block = matrix[lo : lo + step].toarray()
            w += block.T @ block
    return np.asarray(0.5 * (w + w.T))


def top_eigenvector_dense(
    rows: PrivateRows, a: np.ndarray, config: DPFWConfig, releaser: GaussianReleaser
) -> tuple[np.ndarray, float, float]:
    """(v̂, λ̂², σ): top eigenpair of W + symmetric Gaussian noise (one release)."""
    w = gram_statistic(rows, a)
    sensitivity = gram_sensitivity(config.row_clip)
    noisy = releaser.symmetric("gram", w, sensitivity, config.noise_multiplier)
    del w
    eigval, eigvec = np.linalg.eigh(noisy)
    return eigvec[:, -1].copy(), float(eigval[-1]), sensitivity * config.noise_multiplier


def top_eigenvector_oja(
    rows: PrivateRows, a: np.ndarray, config: DPFWConfig, releaser: GaussianReleaser
) -> tuple[np.ndarray, float, float]:
    """(v̂, λ̂², σ) by private Oja (Algorithm 2): Γ noisy products AᵀA v + g, then a noisy ‖A v̂‖²."""
    n = rows.n_items
    sensitivity = gram_sensitivity(config.row_clip)
    sigma = sensitivity * config.noise_multiplier
    eta = config.oja_learning_rate or 1.0 / (config.oja_iterations * sigma * math.sqrt(n))
    v = releaser.rng.normal(0.0, 1.0, size=n)  # data-free start
    v /= max(float(np.linalg.norm(v)), 1e-300)
    for _ in range(config.oja_iterations):
        noisy = releaser.vector("oja_product", gram_product(rows, a, v), sensitivity, config.noise_multiplier)
        step = v + eta * noisy
        norm = np.linalg.norm(step)
        if norm > 0:
            v = step / norm
    value = float(np.sum(_row_products(rows, a, v) ** 2))
    lam2 = float(releaser.vector(
        "oja_eigenvalue", np.array(value), sensitivity, config.noise_multiplier * config.eigenvalue_noise_ratio
    ))
    return v, lam2, sigma


# ---------------------------------------------------------------------------- local updates
@dataclass
class LocalState:
    """Y on Ω (one value per stored entry) and as coefficients on the released directions."""

    values: np.ndarray  # (nnz,)
    coefficients: np.ndarray  # (m, T − 1)

    @classmethod
    def zeros(cls, rows: PrivateRows, n_steps: int) -> LocalState:
        return cls(np.zeros(len(rows.indices)), np.zeros((rows.n_users, n_steps - 1)))


def local_update(
    rows: PrivateRows, state: LocalState, step: int, v: np.ndarray, scale: float,
    nuclear_norm: float, n_steps: int, row_clip: float,
) -> None:
    """Y_i ← Π_{L,Ω}((1 − 1/T) Y_i − (k/T) û_i v̂ᵀ), û_i = A_i v̂ / λ̂' (û = 0 when λ̂' = 0)."""
    a = state.values - rows.target
    u = _row_products(rows, a, v) / scale if scale > 0 else np.zeros(rows.n_users)
    shrink, gain = 1.0 - 1.0 / n_steps, nuclear_norm / n_steps
    values = shrink * state.values - gain * u[rows.row_of] * v[rows.indices]
    factor = clip_scale(_row_norms(rows.row_of, values, rows.n_users), row_clip)
    state.values = values * factor[rows.row_of]
    coef = state.coefficients
    coef[:, :step] *= shrink
    coef[:, step] = -gain * u
    coef[:, : step + 1] *= factor[:, None]


def _replay(rows: PrivateRows, directions: np.ndarray, scales: np.ndarray, params: dict[str, Any]) -> LocalState:
    state = LocalState.zeros(rows, params["n_steps"])
    for step in range(len(scales)):
        local_update(rows, state, step, directions[:, step], float(scales[step]),
                     params["nuclear_norm"], params["n_steps"], params["row_clip"])
    return state


# ---------------------------------------------------------------------------- model
@dataclass(frozen=True, eq=False)
class FrankWolfeModel:
    """Public DPFW output: the released directions v̂_s (columns) and scales λ̂'_s."""

    item_ids: np.ndarray
    directions: np.ndarray  # (n_items, T − 1)
    scales: np.ndarray  # (T − 1,)
    item_counts: np.ndarray  # DP counts (n_items,), floored at 1
    config: dict[str, Any]
    event: dp_event.DpEvent
    metadata: dict[str, Any]
    algorithm: str = "dpfw"

    def __post_init__(self) -> None:
        n = len(self.item_ids)
        steps = int(self.config["n_steps"]) - 1
        if self.directions.shape != (n, steps) or self.scales.shape != (steps,):
            raise ValueError("directions must be n_items x (T − 1) and scales (T − 1,)")
        if not (np.all(np.isfinite(self.directions)) and np.all(np.isfinite(self.scales))):
            raise ValueError("the released sequence contains NaN or infinite values")
        if np.any(self.scales < 0):
            raise ValueError("released scales must be >= 0")
        if self.item_counts.shape != (n,):
            raise ValueError("item_counts must have one entry per item")

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    # the item-side view shared with factor models (public endpoints: embeddings, similar items)
    @property
    def item_factors(self) -> np.ndarray:
        return self.directions

    @property
    def rank(self) -> int:
        return int(self.directions.shape[1])

    @property
    def trained_mask(self) -> np.ndarray:
        return np.ones(self.n_items, dtype=bool)

    def item_index(self) -> dict[Any, int]:
        return {iid: i for i, iid in enumerate(self.item_ids.tolist())}


@dataclass(frozen=True)
class TrainingTrace:
    """Training-time private state, for tests only (never published)."""

    rows: PrivateRows
    state: LocalState


def _validate_for_training(ratings: Ratings) -> None:
    """Public checks only: an empty matrix is valid (every release is then noise only)."""
    if ratings.n_items < 2:
        raise ValueError("DPFW needs at least two items")


def _train_with_trace(
    ratings: Ratings, config: DPFWConfig, *, progress: Progress | None = None, rng: np.random.Generator | None = None,
) -> tuple[FrankWolfeModel, TrainingTrace]:
    _validate_for_training(ratings)
    method = config.method(ratings.n_items)
    rng = np.random.default_rng(config.seed) if rng is None else rng
    releaser = GaussianReleaser(rng)
    rows = prepare_rows(ratings, config, rng)
    counts = releaser.vector(
        "item_counts", np.bincount(rows.indices, minlength=ratings.n_items).astype(np.float64),
        math.sqrt(config.max_ratings_per_user), config.noise_multiplier * config.count_noise_ratio,
    )
    state = LocalState.zeros(rows, config.n_steps)
    n_releases = config.n_steps - 1
    directions = np.zeros((ratings.n_items, n_releases))
    scales = np.zeros(n_releases)
    eigen = top_eigenvector_dense if method == "dense" else top_eigenvector_oja
    params: dict[str, Any] = {"nuclear_norm": config.nuclear_norm, "n_steps": config.n_steps, "row_clip": config.row_clip}
    for step in range(n_releases):
        v, lam2, sigma = eigen(rows, state.values - rows.target, config, releaser)
        lam = math.sqrt(max(lam2, 0.0))
        inflation = _inflation(config, sigma, ratings.n_items)
        directions[:, step], scales[step] = v, lam + inflation
        logger.debug("dpfw step %d/%d (%s) released", step + 1, n_releases, method)  # no value: logs stay data-free
        local_update(rows, state, step, v, scales[step], **params)
        if progress:
            progress((step + 1) / n_releases, f"step {step + 1}/{n_releases}")
    per_step = len(_per_step_releases(config, method))
    event = releaser.event(n_releases, per_step)
    if event != dpfw_event(config, ratings.n_items):
        raise RuntimeError("the releases made differ from the reserved privacy event")
    model = FrankWolfeModel(
        item_ids=ratings.item_ids, directions=directions, scales=scales, item_counts=np.maximum(counts, 1.0),
        config=public_config(config),
        event=event, metadata=_metadata(config, method, releaser),
    )
    return model, TrainingTrace(rows=rows, state=state)


def event_parameters(config: DPFWConfig, method: str | None = None) -> dict[str, Any]:
    """What gives the run's event its meaning: relation, sensitivities, clipping, cap, steps."""
    return {
        "algorithm": "dpfw",
        "neighbouring_relation": accounting.NEIGHBOURING_RELATION,
        "sensitivity_note": "add/remove one user: every eigen release has L2 sensitivity 4*L^2 and the counts "
                            "sqrt(xi); under replacement the Gram statistic's sensitivity is 4*sqrt(2)*L^2 "
                            "(not the relation accounted)",
        "gram_sensitivity": gram_sensitivity(config.row_clip),
        "replacement_gram_sensitivity": 4.0 * math.sqrt(2.0) * config.row_clip**2,
        "row_clip": config.row_clip,
        "max_ratings_per_user": config.max_ratings_per_user,
        "nuclear_norm": config.nuclear_norm,
        "n_steps": config.n_steps,
        "n_eigen_steps": config.n_steps - 1,
        "eigen_method": method or config.eigen_method,
        "eigen_inflation": config.eigen_inflation,
        "noise_multiplier": config.noise_multiplier,
    }


def _metadata(config: DPFWConfig, method: str, releaser: GaussianReleaser) -> dict[str, Any]:
    return {
        "private": True,
        **event_parameters(config, method),
        "dp_accounting_version": accounting.DP_ACCOUNTING_VERSION,
        "releases": [{"name": n, "l2_sensitivity": s, "noise_multiplier": m} for n, s, m in releaser.releases],
    }


def train_dpfw(
    ratings: Ratings, config: DPFWConfig, *, progress: Progress | None = None, rng: np.random.Generator | None = None,
) -> FrankWolfeModel:
    """Train DPFW; the model's ``event`` accounts for every release (checked against :func:`dpfw_event`)."""
    return _train_with_trace(ratings, config, progress=progress, rng=rng)[0]


# ---------------------------------------------------------------------------- privileged fold-in
def _params(model: FrankWolfeModel) -> dict[str, Any]:
    c = model.config
    return {"nuclear_norm": float(c["nuclear_norm"]), "n_steps": int(c["n_steps"]), "row_clip": float(c["row_clip"])}


def _model_config(model: FrankWolfeModel) -> DPFWConfig:
    return DPFWConfig.from_dict(model.config)


def fold_in_users_dpfw(model: FrankWolfeModel, ratings: Ratings) -> tuple[np.ndarray, np.ndarray]:
    """(own means, coefficients m × (T − 1)) replayed from each user's own ratings (all of them).

    ``ratings`` must use the model's item space. Same maths as :func:`replay_user`, batched.
    """
    if ratings.n_items != model.n_items or not np.array_equal(ratings.item_ids, model.item_ids):
        raise ValueError("ratings must share the model's item id space")
    rows = prepare_rows(ratings, _model_config(model), None, cap=False)
    state = _replay(rows, model.directions, model.scales, _params(model))
    return rows.means, state.coefficients


def predict_dpfw(model: FrankWolfeModel, history: Ratings, test: Ratings) -> np.ndarray:
    """mean_u + Y_uj for every test entry (test CSR order), users replayed from ``history``."""
    means, coef = fold_in_users_dpfw(model, history)
    rows, cols, _ = test.coo()
    out = np.empty(test.nnz)
    step = 1 << 20
    for lo in range(0, test.nnz, step):
        r, c = rows[lo : lo + step], cols[lo : lo + step]
        out[lo : lo + step] = np.einsum("ij,ij->i", coef[r], model.directions[c])
    return np.asarray(out + means[rows])


def _user_rows(model: FrankWolfeModel, item_idx: np.ndarray, values: np.ndarray) -> PrivateRows:
    idx = np.asarray(item_idx, dtype=np.int64).reshape(-1)
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if len(idx) != len(values):
        raise ValueError("item indices and values differ in length")
    if len(idx) and (idx.min() < 0 or idx.max() >= model.n_items):
        raise ValueError("item index out of range")
    if len(np.unique(idx)) != len(idx):
        raise ValueError("duplicate items in the user's ratings")
    if not np.all(np.isfinite(values)):
        raise ValueError("ratings contain NaN or infinite values")
    return _rows_from_arrays(np.zeros(len(idx), dtype=np.int64), idx, values, 1, model.n_items,
                             _model_config(model), None)


def replay_user(model: FrankWolfeModel, item_idx: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Scores mean_u + Y_u^(T) for all items, replaying Algorithm 1's local updates.

    Uses the public (v̂_s, λ̂'_s) and ALL of the user's ratings (no ξ-cap), centred by her own mean
    and clipped to norm L exactly as in training. Privileged: returned to this user only.
    """
    rows = _user_rows(model, item_idx, values)
    state = _replay(rows, model.directions, model.scales, _params(model))
    return np.asarray(rows.means[0] + model.directions @ state.coefficients[0])


def recommend_dpfw(
    model: FrankWolfeModel, item_idx: np.ndarray, values: np.ndarray, n: int, *,
    exclude_idx: np.ndarray | None = None, allowed_idx: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``n`` items (same semantics as :func:`app.core.mf.foldin.recommend`): rated and excluded
    items removed, candidates restricted to ``allowed_idx`` when given; best first."""
    scores = replay_user(model, item_idx, values)
    return top_n(scores, n, candidate_items(model.n_items, item_idx, exclude_idx, allowed_idx))


# ---------------------------------------------------------------------------- artifact
def _describe(model: FrankWolfeModel) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "algorithm": model.algorithm,
        "n_items": model.n_items,
        "config": model.config,
        "metadata": model.metadata,
        "event": accounting.event_to_json(model.event),
    }


def save_frank_wolfe(model: FrankWolfeModel, path: str | os.PathLike[str]) -> tuple[Path, Path, str]:
    """Write ``<path>.npz`` (allow_pickle=False arrays) and ``<path>.json``; return (npz, json, sha256)."""
    arrays = {
        "item_ids": storable_ids(model.item_ids),
        "directions": np.asarray(model.directions, dtype=np.float64),
        "scales": np.asarray(model.scales, dtype=np.float64),
        "item_counts": np.asarray(model.item_counts, dtype=np.float64),
    }
    info = write_sealed(path, arrays, _describe(model))
    return info.npz_path, info.json_path, info.sha256


def load_frank_wolfe(path: str | os.PathLike[str], *, expected_sha256: str | None = None) -> FrankWolfeModel:
    """Load and verify an artifact written by :func:`save_frank_wolfe` (ArtifactError on any mismatch)."""
    arrays, stored = read_sealed(path, expected_sha256=expected_sha256)
    if stored.get("format_version") != FORMAT_VERSION or stored.get("algorithm") != FrankWolfeModel.algorithm:
        raise ArtifactError(f"not a DPFW artifact of format {FORMAT_VERSION}")
    item_ids, directions, scales = arrays["item_ids"], arrays["directions"], arrays["scales"]
    item_counts = arrays["item_counts"]
    return FrankWolfeModel(
        item_ids=item_ids, directions=directions, scales=scales, item_counts=item_counts, config=stored["config"],
        event=accounting.event_from_json(stored["event"]), metadata=stored["metadata"],
    )
