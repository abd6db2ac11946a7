"""One-bit DP matrix completion: the four mechanisms (Li et al., arXiv:2110.00719, Algorithms 1-4), the
public model and the privileged fit.

The private estimate M̂ (d1 × d2) is never published. The public output is its post-processing:
item embeddings V·sqrt(S) from the rank-r truncated SVD of clip(M̂, ±α), and per item the mean
predicted like-probability over users, mean_i h((U S Vᵀ)_ij) (the popular fallback score).
A user's vector is fitted from the published embeddings and her own votes only (:func:`fit_user`)
and returned to her alone (joint DP: Chien et al., arXiv:2107.09802, Def. 3; docs/algorithms.md §0).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from dp_accounting import dp_event

from app.core.data.ratings import Ratings
from app.core.mf.artifact import ArtifactError, read_sealed, storable_ids, write_sealed
from app.core.mf.foldin import candidate_items, top_n
from app.core.onebit import links, privacy, solver
from app.core.onebit.privacy import (
    MAX_ENTRIES,
    OneBitConfig,
    event_parameters,
    flip_probability,
    grap_noise_parameter,
    objp_noise,
    onebit_event,
    outp_sensitivity,
    public_config,
    randomize_votes,
)
from app.core.privacy import accounting
from app.core.privacy.discrete_noise import grid_gaussian
from app.core.privacy.laplace import (
    discrete_laplace_noise,
    dithered_laplace_noise,
    snap_to_grid,
)
from app.core.privacy.releaser import tap_grid_release, tap_release
from app.core.privacy.sampling import per_user_sample

__all__ = [
    "GaussianRelease",
    "OneBitModel",
    "Votes",
    "fit_nonprivate",
    "fit_user",
    "grap_estimate",
    "inp_estimate",
    "load_onebit",
    "objp_estimate",
    "objp_minimiser",
    "objp_release",
    "outp_minimiser",
    "prepare_votes",
    "recommend_onebit",
    "save_onebit",
    "train_onebit",
    "train_with_estimate",
    "user_scores",
]

FORMAT_VERSION = 2  # 2 names the like-probabilities item_like_probability (1: item_counts)
Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class Votes:
    """Observed votes Ω (private): rows, columns, ±1 values, and the public matrix shape.

    ``user_row`` (private, evaluation only): the matrix row of each input user when the votes were
    padded to ``user_rows`` rows; None when row i is input user i.
    """

    rows: np.ndarray
    cols: np.ndarray
    values: np.ndarray
    shape: tuple[int, int]
    user_row: np.ndarray | None = None

    def sparse_gradient(self, entry_grad: np.ndarray) -> np.ndarray:
        """A dense d1×d2 matrix with ``entry_grad`` on Ω and 0 elsewhere."""
        out = np.zeros(self.shape)
        out[self.rows, self.cols] = entry_grad
        return out


def _check_size(n_rows: int, n_items: int) -> None:
    """Refuse matrices over MAX_ENTRIES or with fewer than two items (public limits; see
    privacy.check_public_shape, which the service applies before any vote is read). Messages
    name the limit only, never a size (the row count is the number of voters when ``user_rows``
    is None)."""
    if n_rows * n_items > MAX_ENTRIES:
        raise ValueError(f"one-bit completion works on dense matrices; the limit is {MAX_ENTRIES:,} entries "
                         "(users x items)")
    if n_items < 2:
        raise ValueError("one-bit completion needs at least two items")


def _pad_rows(rows: np.ndarray, n_users: int, user_rows: int,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Place the voters in uniformly random distinct rows of a ``user_rows``-row matrix.

    With n <= N = ``user_rows`` voters every voter gets a row; with n > N, N voters chosen
    uniformly at random (independently of their votes) keep theirs and the others are dropped,
    never refused. The placement is independent of the votes, so removing a user equals
    emptying her row with the others' rows coupled (privacy module docstring); when voters are
    dropped, couple the two subsets: the neighbour's subset is the same, or the same with her
    in the row of one dropped-for-her voter, a replace-one-user's-votes step whose k-vote
    sensitivities are the ones charged. Both outputs are mixtures of pairs that are equal or
    such neighbours, so joint (quasi-)convexity of the divergences keeps the guarantee.
    Returns (the kept votes' new rows, -1 for dropped; each input user's row, -1 if dropped).
    """
    order = rng.permutation(n_users)  # a uniformly random ranking; the first N keep a row
    user_row = np.full(n_users, -1, dtype=np.int64)
    kept = order[: min(n_users, user_rows)]
    user_row[kept] = rng.permutation(user_rows)[: len(kept)]
    return user_row[rows], user_row


def prepare_votes(votes: Ratings, k: int | None, rng: np.random.Generator, user_rows: int | None = None) -> Votes:
    """Validate ±1 votes and the size limit; keep k uniformly random votes per user (None: all).

    ``user_rows`` set: pad to exactly that many rows (:func:`_pad_rows`; excess voters dropped at
    random). None: d1 = max(the number of voters, 2) (public under that relation). No votes at
    all is a valid input either way: the mechanisms then release noise only.
    """
    rows, cols, values = votes.coo()
    if not np.all((values == 1.0) | (values == -1.0)):
        raise ValueError("votes must be +1 or -1")
    if k is not None:
        keep = per_user_sample(votes, k, rng)
        rows, cols, values = rows[keep], cols[keep], values[keep]
    if user_rows is None:
        n_rows = max(votes.n_users, 2)
        _check_size(n_rows, votes.n_items)
        return Votes(rows=rows, cols=cols, values=values.astype(np.float64), shape=(n_rows, votes.n_items))
    _check_size(user_rows, votes.n_items)
    rows, user_row = _pad_rows(rows, votes.n_users, user_rows, rng)
    kept = rows >= 0
    return Votes(rows=rows[kept], cols=cols[kept], values=values[kept].astype(np.float64),
                 shape=(user_rows, votes.n_items), user_row=user_row)


# ---------------------------------------------------------------------------- mechanisms
def _solve(data: Votes, config: OneBitConfig, entry_gradient: Callable[[np.ndarray], np.ndarray],
           noise: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    def gradient(x: np.ndarray) -> np.ndarray:
        g = data.sparse_gradient(entry_gradient(x[data.rows, data.cols]))
        return g if noise is None else noise(g)

    return solver.projected_gradient(
        gradient, data.shape, tau=config.radius(*data.shape), alpha=config.alpha, n_steps=config.n_steps,
        step_size=config.step(), rank_hint=config.rank)


def fit_nonprivate(data: Votes, config: OneBitConfig, flip: float = 0.0) -> np.ndarray:
    """The non-private solver (the paper's "Clear" baseline, and InP's post-processing)."""
    return _solve(data, config, lambda x: links.dloss(x, data.values, config.link, flip))


def inp_estimate(data: Votes, config: OneBitConfig, rng: np.random.Generator) -> np.ndarray:
    """InP (Li et al. Alg. 1): randomise each vote once (unless done at ingestion), debiased fit.

    Binary RR flipping w.p. p = 1/(1+e^ε0) is ε0-DP for the vote's value: the output ratio is
    (1−p)/p = e^ε0 (Thm 1 with p1 = p2). Every later step reads only the randomised bits
    (post-processing). The solver maximises the likelihood of the bits under
    c(x) = h(x)(1−2p) + p (eq. (4)).
    """
    if not config.pre_randomised:
        randomised = randomize_votes(data.values, config.epsilon, rng).astype(np.float64)
        randomised = tap_release("vote_flips", randomised, data.values, data.cols)  # a no-op outside the audit tap
        data = Votes(data.rows, data.cols, randomised, data.shape)
    return fit_nonprivate(data, config, config.flip())


def grap_estimate(data: Votes, config: OneBitConfig, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """GraP (Li et al. Alg. 3, corrected): K fixed steps on a clamped, grid-snapped, DLap-noised gradient.

    Statistic per step: G = P_Ω(clamp(∂ℓ/∂X, ±C)) on ALL d1×d2 entries (noise on unobserved
    entries too, or the noise pattern would reveal Ω), snapped to the grid g = C/``grid_steps`` so
    each entry is an integer in [−C/g, C/g]. Replacing one vote changes at most two entries by at
    most C/g each, or one entry by 2C/g: entry L1 sensitivity 2C/g grid steps (2C in value units);
    one user's ≤ k votes: 2kC/g. Iterates depend on the data only through earlier releases, and
    the step size is fixed (no line search or Barzilai-Borwein step computed from private
    gradients). Each step adds DLap(a), a = ε/(K·2C/g): entry ε/K per step, scale g/a = 2CK/ε.
    Returns (estimate, number of releases).
    """
    grid = config.clamp / config.grid_steps
    a = grap_noise_parameter(config)
    count = [0]

    def noisy(g: np.ndarray) -> np.ndarray:
        snapped = snap_to_grid(np.clip(g, -config.clamp, config.clamp), grid)
        count[0] += 1
        noisy: np.ndarray = (snapped + discrete_laplace_noise(rng, a, g.shape)).astype(np.float64)
        return grid * tap_release("grap_gradient", noisy, snapped.astype(np.float64))  # a no-op outside the audit tap

    estimate = _solve(data, config, lambda x: links.dloss(x, data.values, config.link), noisy)
    return estimate, count[0]


def objp_minimiser(data: Votes, config: OneBitConfig, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """ObjP's perturbed objective, minimised to a proven ρ (private; :func:`objp_estimate` releases it).

    X* = argmin_{‖X‖_* <= τ} Σ_Ω f_α(y_ij X_ij) + (λ/2)‖X‖_F² + ⟨B, X⟩, B i.i.d. on ALL entries
    (Kifer, Smith, Thakurta 2012, Thm 1; Chaudhuri et al. 2011 §3.2). Conditions: f_α (the
    link's loss, continued linearly below −α) is convex with |f_α'| <= ζ = |f'(−α)| and
    0 <= f_α'' <= λ_h; each vote's Hessian is rank one (a single entry); the domain is closed and
    convex; the regulariser is λ-strongly convex. Then X ↦ B(X) is injective and the density of
    X* is p_B(B(X))·|det ∇B(X)|. Replacing one vote changes B(X) by a vector with at most two
    non-zero entries of size <= ζ (L1 <= 2ζ) and the Jacobian determinant by a factor in
    [1/(1+λ_h/λ), 1+λ_h/λ] (almost everywhere: f_α is only C¹ at −α, see links.huber_loss).
    With B_ij = g(K + U) (dithered DLap, laplace.dithered_laplace_noise) the density ratio is
    <= exp((2ζ + 2g)/s) = exp(2(ζ+g)/s). Entry ε = 2(ζ+g)/s + log(1 + λ_h/λ),
    split in halves by privacy.objp_noise; user level: group privacy over k votes (pure kε).
    Returns (X_T, T) with ‖X_T − X*‖_F <= ρ for every data set (solver.minimise_strongly_convex).
    """
    scale, grid, ridge = objp_noise(config)
    noise = dithered_laplace_noise(rng, scale, grid, data.shape)
    noise = tap_release("objp_objective_noise", noise, np.zeros(data.shape))  # a no-op outside the audit tap

    def gradient(x: np.ndarray) -> np.ndarray:
        entry = links.huber_dloss(x[data.rows, data.cols], data.values, config.link, config.alpha)
        return np.asarray(data.sparse_gradient(entry) + ridge * x + noise)

    return solver.minimise_strongly_convex(
        gradient, data.shape, tau=config.radius(*data.shape), smooth=links.curvature_bound(config.link) + ridge,
        strong=ridge, tolerance=config.solver_tolerance, rank_hint=config.rank)


@dataclass(frozen=True)
class GaussianRelease:
    """What one Gaussian output release did: L2 sensitivity it assumed, multiplier, std drawn with."""

    sensitivity: float
    multiplier: float
    std: float


def objp_release(minimiser: np.ndarray, config: OneBitConfig,
                 rng: np.random.Generator) -> tuple[np.ndarray, GaussianRelease]:
    """X_T + Z on every entry, Z exact discrete Gaussian on a grid charged as N(0, σ²), σ = z_out·2ρ
    (approximate minima perturbation; ``app.core.privacy.discrete_noise``: no floating-point leak)."""
    sensitivity = privacy.objp_output_sensitivity(config)
    multiplier = config.objp_output_noise_multiplier
    grid = grid_gaussian(sensitivity, multiplier, minimiser.size)  # every entry may move
    released = tap_grid_release("objp_output", grid, rng, minimiser)  # grid.release outside the test-only audit tap
    return released, GaussianRelease(sensitivity, multiplier, grid.std)


def objp_estimate(data: Votes, config: OneBitConfig,
                  rng: np.random.Generator) -> tuple[np.ndarray, int, GaussianRelease]:
    """ObjP, sound for an approximate minimiser: release X_T + Z (approximate minima perturbation,
    Iyengar et al. 2019).

    Floating point gives only X_T with ‖X_T − X*‖_F <= ρ, and X_T itself is not covered by the
    objective-perturbation proof. View the run as the adaptive composition of
    M1: X* (pure ε per vote, kε per user, :func:`objp_minimiser`), and
    M2: given X* = x, release X_T + Z. For ANY data sets D, D' and any noises B, B' with
    X*(D, B) = X*(D', B') = x, ‖X_T(D, B) − x‖_F <= ρ and ‖X_T(D', B') − x‖_F <= ρ, so M2's outputs
    on D and D' are mixtures of N(μ, σ²I) with all means within 2ρ of each other; by joint
    convexity of hockey-stick divergences (and quasi-convexity of Rényi divergences) M2 is
    dominated by the Gaussian mechanism with L2 sensitivity Δ = 2ρ: GaussianDpEvent(z_out) with
    σ = z_out·Δ. The bound uses no property of the neighbouring relation, so at the user level
    (D, D' differing in one user's k votes, coupled so that the exact minimisers coincide) the
    Gaussian part is unchanged while M1 becomes pure kε. The release is a post-processing of
    (X*, X_T + Z); the event is ComposedDpEvent([pure kε pair, GaussianDpEvent(z_out)]).
    Returns (X_T + Z, solver steps T, the Gaussian release made).
    """
    minimiser, n_steps = objp_minimiser(data, config, rng)
    released, release = objp_release(minimiser, config, rng)
    return released, n_steps, release


def outp_minimiser(data: Votes, config: OneBitConfig) -> tuple[np.ndarray, int]:
    """The ridge-regularised minimiser OutP perturbs (no noise; private).

    F_D(X) = Σ_Ω f_α(y X) + (λ/2)‖X‖² over the nuclear ball is λ-strongly convex. For neighbours
    D, D' with F_D' = F_D + g, optimality of X = X*_D, X' = X*_D' gives
    λ‖X − X'‖² <= ⟨∇g(X), X − X'⟩ <= ‖∇g(X)‖_F ‖X − X'‖ (Chaudhuri et al. 2011, Lemma 7, which holds
    over a convex domain through the first-order conditions). Replacing one user's ≤ k votes
    (distinct entries) gives ‖∇g‖_F <= 2·sqrt(k)·ζ, hence ‖X − X'‖_F <= 2·sqrt(k)·ζ/λ; the solver's
    ρ adds 2ρ (privacy.outp_sensitivity).
    """
    def gradient(x: np.ndarray) -> np.ndarray:
        entry = links.huber_dloss(x[data.rows, data.cols], data.values, config.link, config.alpha)
        return data.sparse_gradient(entry) + config.ridge * x

    return solver.minimise_strongly_convex(
        gradient, data.shape, tau=config.radius(*data.shape),
        smooth=links.curvature_bound(config.link) + config.ridge, strong=config.ridge,
        tolerance=config.solver_tolerance, rank_hint=config.rank)


def outp_release(minimiser: np.ndarray, config: OneBitConfig, rng: np.random.Generator) -> np.ndarray:
    """Exact discrete Gaussian noise on a grid on every entry (``app.core.privacy.discrete_noise``), charged
    as the Gaussian of multiplier z for the user-level L2 sensitivity."""
    grid = grid_gaussian(outp_sensitivity(config), config.noise_multiplier, minimiser.size)
    return tap_grid_release("outp_matrix", grid, rng, minimiser)  # grid.release outside the test-only audit tap


def _private_estimate(
    data: Votes, config: OneBitConfig, rng: np.random.Generator
) -> tuple[np.ndarray, dp_event.DpEvent, dict[str, Any]]:
    """(M̂, the event of what was released, facts for the metadata)."""
    if config.mechanism == "inp":
        return inp_estimate(data, config, rng), onebit_event(config), {"n_steps": config.n_steps}
    if config.mechanism == "grap":
        estimate, n = grap_estimate(data, config, rng)
        step = accounting.discrete_laplace(grap_noise_parameter(config), config.votes_per_user * 2 * config.grid_steps)
        return estimate, dp_event.SelfComposedDpEvent(step, n), {"n_releases": n}
    if config.mechanism == "objp":
        estimate, n, release = objp_estimate(data, config, rng)
        if release.sensitivity != privacy.objp_output_sensitivity(config):
            raise RuntimeError("objp's output noise was not scaled to its proven sensitivity 2*rho")
        event = privacy.objp_event(config.votes_per_user * config.epsilon, release.multiplier)
        return estimate, event, {"solver_steps": n, "output_noise_std_drawn": release.std}
    minimiser, n = outp_minimiser(data, config)
    return outp_release(minimiser, config, rng), onebit_event(config), {"solver_steps": n}


# ---------------------------------------------------------------------------- model
@dataclass(frozen=True, eq=False)
class OneBitModel:
    """Public one-bit output: item embeddings and mean like-probabilities (both post-processing)."""

    item_ids: np.ndarray
    item_factors: np.ndarray  # (n_items, rank) = V·sqrt(S)
    item_like_probability: np.ndarray  # mean predicted P(thumbs up) per item (no counts are released)
    config: dict[str, Any]
    event: dp_event.DpEvent
    metadata: dict[str, Any]
    algorithm: str = "onebit"
    global_mean: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.item_ids)
        if self.item_factors.ndim != 2 or self.item_factors.shape[0] != n or self.item_like_probability.shape != (n,):
            raise ValueError("item_factors and item_like_probability must have one row per item")
        if not (np.all(np.isfinite(self.item_factors)) and np.all(np.isfinite(self.item_like_probability))):
            raise ValueError("the published arrays contain NaN or infinite values")

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    @property
    def rank(self) -> int:
        return int(self.item_factors.shape[1])

    @property
    def trained_mask(self) -> np.ndarray:
        return np.ones(self.n_items, dtype=bool)

    def item_index(self) -> dict[Any, int]:
        return {iid: i for i, iid in enumerate(self.item_ids.tolist())}

    def stored_flip(self) -> float:
        """Flip probability of the votes the service stores (randomised at ingestion), else 0."""
        eps0 = self.config.get("local_epsilon")
        return flip_probability(eps0) if self.config.get("pre_randomised") and eps0 is not None else 0.0


def publish(estimate: np.ndarray, config: OneBitConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item factors V·sqrt(S), mean like-probability per item, the rank-r reconstruction)."""
    clipped = np.clip(estimate, -config.alpha, config.alpha)
    u, s, vt = solver.truncated_svd(clipped, config.rank)
    root = np.sqrt(s)
    factors = np.zeros((estimate.shape[1], config.rank))
    factors[:, : len(s)] = vt.T * root
    reconstruction = (u * s) @ vt
    return factors, links.prob_up(reconstruction, config.link).mean(axis=0), reconstruction


def train_with_estimate(votes: Ratings, config: OneBitConfig, *, progress: Progress | None = None,
                        rng: np.random.Generator | None = None) -> tuple[OneBitModel, np.ndarray]:
    """:func:`train_onebit` plus the rank-r reconstruction (private; for evaluation only), one
    row per input user. Progress messages carry no number derived from the votes."""
    rng = np.random.default_rng(config.seed) if rng is None else rng
    data = prepare_votes(votes, config.votes_per_user, rng, config.user_rows)
    if progress:  # stage text from the public config only: no count derived from the votes
        progress(0.05, f"one-bit {config.mechanism}: votes capped per user")
    estimate, event, facts = _private_estimate(data, config, rng)
    if event != onebit_event(config):
        raise RuntimeError("the releases made differ from the reserved privacy event")
    factors, like, reconstruction = publish(estimate, config)
    metadata = {"private": True, **event_parameters(config), **facts,
                "dp_accounting_version": accounting.DP_ACCOUNTING_VERSION,
                "item_like_probability": "mean predicted like-probability over users (post-processing)"}
    model = OneBitModel(item_ids=votes.item_ids, item_factors=factors, item_like_probability=like,
                        config=public_config(config), event=event, metadata=metadata)
    if progress:
        progress(1.0, "done")
    if data.user_row is not None:  # back to input-user order (evaluation only; dropped voters: zeros)
        kept = data.user_row >= 0
        ordered = np.zeros((len(data.user_row), reconstruction.shape[1]))
        ordered[kept] = reconstruction[data.user_row[kept]]
        reconstruction = ordered
    elif reconstruction.shape[0] != votes.n_users:  # padded to two rows
        reconstruction = reconstruction[: votes.n_users]
    return model, reconstruction


def train_onebit(votes: Ratings, config: OneBitConfig, *, progress: Progress | None = None,
                 rng: np.random.Generator | None = None) -> OneBitModel:
    """Train one mechanism on ±1 votes; the model's event is the user-level event (checked).

    With ``config.user_rows`` set the votes are padded to that many rows (add/remove-one-user
    relation); with more voters, ``user_rows`` of them chosen uniformly at random are kept.
    No run fails for a data-dependent reason: no votes at all give a noise-only model.
    """
    return train_with_estimate(votes, config, progress=progress, rng=rng)[0]


# ---------------------------------------------------------------------------- privileged fit
def _user_votes(model: OneBitModel, item_idx: np.ndarray, votes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    idx = np.asarray(item_idx, dtype=np.int64).reshape(-1)
    y = np.asarray(votes, dtype=np.float64).reshape(-1)
    if len(idx) != len(y):
        raise ValueError("item indices and votes differ in length")
    if len(idx) and (idx.min() < 0 or idx.max() >= model.n_items):
        raise ValueError("item index out of range")
    if len(np.unique(idx)) != len(idx):
        raise ValueError("duplicate items in the user's votes")
    if not np.all((y == 1.0) | (y == -1.0)):
        raise ValueError("votes must be +1 or -1")
    return idx, y


def fit_user(model: OneBitModel, item_idx: np.ndarray, votes: np.ndarray, reg: float | None = None) -> np.ndarray:
    """The user's vector: argmin_u Σ_j ℓ(v_j·u; y_j) + (reg/2)‖u‖² (regularised logistic/probit regression).

    Uses only the published item embeddings and this user's own votes (privileged: returned to her
    only). Votes randomised at ingestion are fitted with the debiased link c. Solved by
    majorise-minimise steps with the curvature bound λ_h (ℓ'' <= λ_h for every flip
    probability), which decrease the objective monotonically.
    """
    idx, y = _user_votes(model, item_idx, votes)
    reg = float(model.config.get("user_reg", 1.0) if reg is None else reg)
    if not (math.isfinite(reg) and reg > 0):
        raise ValueError("reg must be finite and > 0")
    link, flip = model.config["link"], model.stored_flip()
    v = model.item_factors[idx]
    majoriser = links.curvature_bound(link) * (v.T @ v) + reg * np.eye(model.rank)
    u = np.zeros(model.rank)
    for _ in range(100):
        grad = v.T @ links.dloss(v @ u, y, link, flip) + reg * u
        step = np.linalg.solve(majoriser, grad)
        u = u - step
        if float(np.linalg.norm(step)) <= 1e-10 * (1.0 + float(np.linalg.norm(u))):
            break
    return u


def user_scores(model: OneBitModel, item_idx: np.ndarray, votes: np.ndarray) -> np.ndarray:
    """P(thumbs up) for every item, from :func:`fit_user` (0.5 everywhere without votes)."""
    u = fit_user(model, item_idx, votes)
    return links.prob_up(model.item_factors @ u, model.config["link"])


def recommend_onebit(model: OneBitModel, item_idx: np.ndarray, values: np.ndarray, n: int, *,
                     exclude_idx: np.ndarray | None = None, allowed_idx: np.ndarray | None = None,
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Top-``n`` items by P(thumbs up), same semantics as :func:`app.core.mf.foldin.recommend`."""
    scores = user_scores(model, item_idx, values)
    return top_n(scores, n, candidate_items(model.n_items, item_idx, exclude_idx, allowed_idx))


# ---------------------------------------------------------------------------- artifact
def save_onebit(model: OneBitModel, path: str | os.PathLike[str]) -> tuple[Path, str]:
    """Write the sealed ``<path>.npz`` + ``<path>.json``; return (npz path, sha256)."""
    arrays = {"item_ids": storable_ids(model.item_ids),
              "item_factors": np.asarray(model.item_factors, dtype=np.float64),
              "item_like_probability": np.asarray(model.item_like_probability, dtype=np.float64)}
    description = {"format_version": FORMAT_VERSION, "algorithm": model.algorithm, "n_items": model.n_items,
                   "rank": model.rank, "config": model.config, "metadata": model.metadata,
                   "event": accounting.event_to_json(model.event)}
    info = write_sealed(path, arrays, description)
    return info.npz_path, info.sha256


def load_onebit(path: str | os.PathLike[str], expected_sha256: str | None = None) -> OneBitModel:
    """Load and verify an artifact of :func:`save_onebit` (ArtifactError on any mismatch)."""
    arrays, stored = read_sealed(path, expected_sha256=expected_sha256)
    version = stored.get("format_version")
    like = _LIKE_ARRAY.get(version) if isinstance(version, int) else None
    if like is None or stored.get("algorithm") != OneBitModel.algorithm:
        raise ArtifactError(f"not a one-bit artifact of format {sorted(_LIKE_ARRAY)}")
    if set(arrays) != {"item_ids", "item_factors", like}:
        raise ArtifactError("unexpected arrays in a one-bit artifact")
    return OneBitModel(item_ids=arrays["item_ids"], item_factors=arrays["item_factors"],
                       item_like_probability=arrays[like], config=stored["config"],
                       event=accounting.event_from_json(stored["event"]), metadata=stored["metadata"])


_LIKE_ARRAY = {1: "item_counts", FORMAT_VERSION: "item_like_probability"}  # array name by format version
