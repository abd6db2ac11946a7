"""One-bit DP matrix completion: configuration, privacy events and calibration (Li, Wei, Huang,
Mao & Wang, arXiv:2110.00719; docs/algorithms.md §4).

Units and relations
-------------------
*Entry level* (the paper's ε): one vote. For GraP, ObjP and OutP the entry relation is "replace
one vote by another" (its position and value may change; adding or removing a vote is covered
too). *User level* (charged to the ledger): all of one user's votes, at most k = ``votes_per_user``
of them after a data-independent cap (k uniformly random votes per user, seeded). The item
columns are public (the catalogue); which items a user voted on is not. The number of user rows d1
sizes the matrix, the default τ = α·sqrt(d1·d2) and hence ObjP/OutP's published solver step count:

* ``user_rows`` None: d1 = the number of voters, which is therefore PUBLIC; the user-level
  relation is "replace one user's votes" (her row stays, its ≤ k votes change arbitrarily).
* ``user_rows`` = N (public): the voters are placed in uniformly random distinct rows of an
  N-row matrix, the rest left empty, and τ uses N. Removing a user is then replacing her ≤ k
  votes by none in a row chosen independently of the data (couple the other users' rows and
  caps; the output law is a mixture of k-vote neighbours, and hockey-stick and Rényi
  divergences are jointly (quasi-)convex), so the same k-vote sensitivities give the guarantee
  under add/remove-one-user. With more than N voters, N of them chosen uniformly at random
  (independently of the votes) keep a row and the others are dropped (train._pad_rows argues
  the guarantee); no run is refused for a data-dependent reason, and no votes at all give a
  noise-only model.
For InP the protected relation is weaker: local randomized response hides vote *values* only
(replace-a-vote-value); which items a user voted on, and that she voted, are not hidden.

Per-mechanism guarantee (derivations next to the code that implements them, train.py):

=========  ===========================================  =============================================
mechanism  entry level                                   user level (the event charged)
=========  ===========================================  =============================================
inp        RR: ε0-LDP per vote value (p = 1/(1+e^ε0))    k-fold composition of binary RR(ε0)
grap       K steps, each DLap on the clamped, grid-      DLap with L1 sensitivity k·2C/g per step, K
           snapped gradient of ALL d1×d2 entries:        steps (Laplace scale 2kCK/ε in value units)
           entry L1 sensitivity 2C, scale 2CK/ε
objp       pure ε (KST 2012 Thm 1 with Laplace-type      Composed[pure kε pair (group privacy,
           noise, ridge and Huberised loss) for the      accounting.pure_dp), Gaussian(z_out)]: the
           exact minimiser X*; the release X_T + Z,      Gaussian's sensitivity stays 2ρ (X_T and X'_T
           ‖X_T − X*‖_F <= ρ, Z ~ N(0, (2ρ z_out)²)      lie within ρ of the same coupled X*)
           adds Gaussian(z_out) with L2 sensitivity 2ρ
           (approximate minima perturbation)
outp       Gaussian, L2 sensitivity 2ζ/λ + 2ρ            Gaussian, L2 sensitivity 2·sqrt(k)·ζ/λ + 2ρ
=========  ===========================================  =============================================

``epsilon`` is the entry-level ε of inp, grap and objp (for objp: of its pure part);
``noise_multiplier`` (noise std / user-level L2 sensitivity) is outp's knob. ObjP's output noise
multiplier ``objp_output_noise_multiplier`` (z_out, default 100: about 0.04 of ε at δ = 1e-6, and
noise of std 2ρ·z_out = 2e-4 per entry at ρ = 1e-6) is fixed, and only ``epsilon`` is calibrated
for the composed event. :func:`calibrate` sets the relevant knob so that the user-level
event meets a target (ε, δ) by the RDP accountant (app.core.privacy.accounting, which also accounts the
pure-DP events). With ``pre_randomised`` the votes were randomised once at ingestion with
``local_epsilon`` (that local guarantee is charged once, by the service, with
:func:`local_randomisation_event`); training then adds nothing and its event is NoOpDpEvent.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np
from dp_accounting import dp_event

from app.core.onebit.links import LINKS, curvature_bound, gradient_bound
from app.core.privacy import accounting
from app.core.privacy.accounting import Relation

__all__ = [
    "MAX_ENTRIES",
    "MECHANISMS",
    "OneBitConfig",
    "calibrate",
    "event_parameters",
    "flip_probability",
    "grap_laplace_scale",
    "grap_noise_parameter",
    "check_public_shape",
    "local_randomisation_event",
    "solver_tolerance_floor",
    "objp_event",
    "objp_noise",
    "objp_output_sensitivity",
    "objp_output_std",
    "onebit_event",
    "outp_sensitivity",
    "public_config",
    "randomize_votes",
]

MECHANISMS = ("inp", "grap", "objp", "outp")
MAX_ENTRIES = 4_000_000  # d1·d2 limit: dense d1×d2 float64 iterates (~32 MB each)


def flip_probability(epsilon0: float) -> float:
    """p = 1/(1+e^ε0): binary RR with this flip probability is ε0-DP (Li et al. Thm 1, p1 = p2)."""
    if not isinstance(epsilon0, (int, float)) or not math.isfinite(epsilon0) or epsilon0 <= 0:
        raise ValueError(f"the local epsilon must be a finite number > 0, got {epsilon0!r}")
    tail = math.exp(-float(epsilon0))
    return tail / (1.0 + tail)


def randomize_votes(votes: np.ndarray, epsilon0: float, rng: np.random.Generator) -> np.ndarray:
    """Flip each ±1 vote independently w.p. :func:`flip_probability` (int8 in and out)."""
    votes = np.asarray(votes)
    if votes.size and not np.all((votes == 1) | (votes == -1)):
        raise ValueError("votes must be +1 or -1")
    flips = rng.random(votes.shape) < flip_probability(epsilon0)
    return np.where(flips, -votes, votes).astype(np.int8)


def local_randomisation_event(epsilon0: float, votes_per_user: int) -> dp_event.DpEvent:
    """User-level local guarantee: k = ``votes_per_user`` independent binary RR(ε0) draws.

    Protects vote values only (replace-a-vote-value); the ingestion path must cap each user at k
    randomised votes for this event to hold.
    """
    flip_probability(epsilon0)
    _check_positive_int("votes_per_user", votes_per_user)
    return dp_event.SelfComposedDpEvent(accounting.randomized_response(float(epsilon0)), int(votes_per_user))


# ---------------------------------------------------------------------------- solver tolerance floor
FP_STEP_ERROR = 1e-12  # γ: relative floating-point error of one computed solver step (see below)


def solver_tolerance_floor(config: OneBitConfig) -> float:
    """The smallest solver tolerance ρ for which the charged Gaussian holds in floating point.

    ObjP's output Gaussian (sensitivity 2ρ) and OutP's 2ρ term assume ‖X_T − X*‖_F <= ρ for the
    *computed* X_T. solver.minimise_strongly_convex runs T = ⌈log(ρ/(2τ))/log q⌉ steps, so in
    exact arithmetic q^T·τ <= ρ/2 (q = (L−μ)/(L+μ)); this floor keeps rounding within the other
    ρ/2. A computed step differs from the exact one by at most γ·‖Y_t‖_F, Y_t = X_t − η∇F(X_t):
    LAPACK's SVD is backward stable with error <= p(d)·u·‖Y‖ (u = 1.1e-16, p(d) <= d <= 2000 =
    sqrt(MAX_ENTRIES)), i.e. <= 2.2e-13, and γ = 1e-12 leaves a 4.5x margin (the reconstruction
    and gradient add O(u)). Errors contract like the iterates, so the rounding total is at most
    γ·Y/(1 − q) with 1/(1 − q) = (L+μ)/(2μ) and Y >= max_t ‖Y_t‖_F, bounded from the config:
    ‖X_t‖_F <= τ; η‖∇ data‖_F <= η·ζ·sqrt(d1·d2) (one entry of size <= ζ per vote); η·λ‖X_t‖_F <=
    η·λ·τ; ObjP's noise B (i.i.d., scale s, E B² = 2s²) has ‖B‖_F <= 1.5·sqrt(2)·s·sqrt(d1·d2)
    except with probability exponentially small in d1·d2. sqrt(d1·d2) <= sqrt(MAX_ENTRIES) and
    τ <= ``tau`` or α·sqrt(MAX_ENTRIES) make the floor independent of the data:
    ρ_min = 2γ·Y·(L+μ)/(2μ). Default ρ = 1e-6 is above it (about 1e-7 for objp, 4e-8 for outp).
    """
    root_entries = math.sqrt(MAX_ENTRIES)
    tau_max = float(config.tau) if config.tau is not None else config.alpha * root_entries
    zeta = gradient_bound(config.link, config.alpha)
    ridge, noise_scale = config.ridge, 0.0
    if config.mechanism == "objp":
        noise_scale, _, ridge = objp_noise(config)
    smooth, strong = curvature_bound(config.link) + ridge, ridge
    eta = 2.0 / (smooth + strong)
    y_max = (tau_max + eta * zeta * root_entries + eta * ridge * tau_max
             + eta * 1.5 * math.sqrt(2.0) * noise_scale * root_entries)
    return 2.0 * FP_STEP_ERROR * y_max * (smooth + strong) / (2.0 * strong)


def check_public_shape(config: OneBitConfig, n_items: int) -> None:
    """Refuse, from public facts only (before any vote is read), a run whose padded matrix
    (``user_rows`` x the catalogue) exceeds MAX_ENTRIES or whose catalogue has fewer than two items."""
    if n_items < 2:
        raise ValueError("one-bit completion needs at least two items in the catalogue")
    if config.user_rows is not None and config.user_rows * n_items > MAX_ENTRIES:
        raise ValueError(f"user_rows x items exceeds the dense limit of {MAX_ENTRIES:,} entries: lower user_rows "
                         "(or the data set's max_users)")


def _check_positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _check_positive(name: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class OneBitConfig:
    """Hyper-parameters; every field but ``seed`` is published with the model.

    ``tau`` None: α·sqrt(d1·d2) (the paper's τ = α·sqrt(d1·d2·r) with r = 1), from the public
    matrix size (d1 = ``user_rows`` when set). ``step_size`` None: 1/λ_h (1/4-smooth logistic,
    1-smooth probit per entry). ``user_rows``: the public row count the votes are padded to (add/
    remove-one-user privacy; module docstring); None: d1 = the number of voters, made public.
    """

    mechanism: str = "inp"
    link: str = "logistic"
    rank: int = 8  # published embedding rank (truncated SVD of the private estimate)
    tau: float | None = None
    alpha: float = 1.0
    votes_per_user: int = 100  # k
    n_steps: int = 50  # K: fixed projected-gradient steps (inp, grap)
    step_size: float | None = None
    clamp: float = 0.5  # C (grap)
    grid_steps: int = 100  # C/g for grap; ζ/g for objp's dithered noise
    ridge: float = 0.1  # λ of objp/outp (objp raises it to λ_h/(e^{ε/2} − 1) when needed)
    solver_tolerance: float = 1e-6  # ρ: proven ‖X_T − X*‖_F for objp/outp
    epsilon: float = 1.0  # entry-level ε per vote (inp: ε0, grap, objp)
    noise_multiplier: float = 1.0  # outp: Gaussian std / user-level L2 sensitivity
    objp_output_noise_multiplier: float = 100.0  # z_out: objp's output noise std / 2ρ (not calibrated)
    pre_randomised: bool = False
    local_epsilon: float | None = None
    user_reg: float = 1.0  # ridge of the privileged per-user fit
    user_rows: int | None = None  # public d1 (padding); None: d1 = number of voters (public)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        if self.link not in LINKS:
            raise ValueError(f"link must be one of {LINKS}, got {self.link!r}")
        for name in ("rank", "votes_per_user", "n_steps", "grid_steps"):
            _check_positive_int(name, getattr(self, name))
        for name in ("alpha", "clamp", "ridge", "solver_tolerance", "epsilon", "noise_multiplier",
                     "objp_output_noise_multiplier", "user_reg"):
            _check_positive(name, getattr(self, name))
        for name in ("tau", "step_size"):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        if self.user_rows is not None:
            _check_positive_int("user_rows", self.user_rows)
            if self.user_rows < 2:
                raise ValueError(f"user_rows must be at least 2, got {self.user_rows!r}")
        if self.pre_randomised != (self.local_epsilon is not None):
            raise ValueError("pre_randomised votes need their local_epsilon (and only they have one)")
        if self.pre_randomised and self.mechanism != "inp":
            raise ValueError("pre-randomised votes are trained with mechanism 'inp' (post-processing)")
        if self.local_epsilon is not None:
            flip_probability(self.local_epsilon)
        for name in ("pre_randomised",):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean")
        if self.mechanism in ("objp", "outp"):
            floor = solver_tolerance_floor(self)
            if self.solver_tolerance < floor:
                raise ValueError(f"solver_tolerance must be >= {floor:.3g} for these settings: below it floating-point "
                                 "error can exceed the tolerance the output noise is calibrated to")

    def radius(self, n_users: int, n_items: int) -> float:
        """τ, from the config or the public matrix size (``user_rows`` rows when set, else ``n_users``)."""
        if self.tau is not None:
            return float(self.tau)
        rows = self.user_rows if self.user_rows is not None else n_users
        return self.alpha * math.sqrt(rows * n_items)

    def step(self) -> float:
        return float(self.step_size) if self.step_size is not None else 1.0 / curvature_bound(self.link)

    def flip(self) -> float:
        """The flip probability the solver debiases for (0 for grap/objp/outp)."""
        if self.mechanism != "inp":
            return 0.0
        return flip_probability(self.inp_epsilon)

    @property
    def inp_epsilon(self) -> float:
        """ε0 of InP's randomised response: the ingestion's local ε (pre-randomised votes) or this run's ε."""
        return self.local_epsilon if self.local_epsilon is not None and self.pre_randomised else self.epsilon

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OneBitConfig:
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown one-bit parameters: {sorted(unknown)}")
        return cls(**data)


def public_config(config: OneBitConfig) -> dict[str, Any]:
    """The config as published: everything but the seed."""
    data = config.to_dict()
    del data["seed"]
    return data


# ---------------------------------------------------------------------------- GraP
def grap_noise_parameter(config: OneBitConfig) -> float:
    """a of DLap(a) in grid units: per step ε/K over an entry L1 sensitivity of 2·(C/g) grid steps."""
    return config.epsilon / (config.n_steps * 2 * config.grid_steps)


def grap_laplace_scale(config: OneBitConfig) -> float:
    """The noise scale in value units, g/a = 2CK/ε (entry level; the user level multiplies by k)."""
    return (config.clamp / config.grid_steps) / grap_noise_parameter(config)


# ---------------------------------------------------------------------------- ObjP
def objp_noise(config: OneBitConfig) -> tuple[float, float, float]:
    """(noise scale s, dither grid g, ridge λ) giving entry-level ε = 2(ζ+g)/s + log(1 + λ_h/λ) <= ε.

    Half of ε goes to the noise term (s = 4(ζ+g)/ε), half to the Jacobian term
    (λ >= λ_h/(e^{ε/2} − 1)); see train.objp_estimate for the derivation.
    """
    zeta = gradient_bound(config.link, config.alpha)
    grid = zeta / config.grid_steps
    scale = 4.0 * (zeta + grid) / config.epsilon
    ridge = max(config.ridge, curvature_bound(config.link) / math.expm1(config.epsilon / 2.0))
    return scale, grid, ridge


def objp_entry_epsilon(config: OneBitConfig) -> float:
    """The entry-level ε actually achieved by :func:`objp_noise` (<= config.epsilon)."""
    scale, grid, ridge = objp_noise(config)
    zeta = gradient_bound(config.link, config.alpha)
    return 2.0 * (zeta + grid) / scale + math.log1p(curvature_bound(config.link) / ridge)


def objp_output_sensitivity(config: OneBitConfig) -> float:
    """Δ = 2ρ: L2 distance of the two near-minimisers under the objective-perturbation coupling.

    For any two data sets D, D' and noises B, B' with the same exact minimiser X*, the solver's
    outputs satisfy ‖X_T − X*‖_F <= ρ and ‖X'_T − X*‖_F <= ρ, so ‖X_T − X'_T‖_F <= 2ρ. This holds
    for every pair of data sets, so it is the same at the entry and at the user level.
    """
    return 2.0 * config.solver_tolerance


def objp_output_std(config: OneBitConfig) -> float:
    """σ = z_out·Δ = z_out·2ρ: std of the Gaussian added to every entry of X_T."""
    return config.objp_output_noise_multiplier * objp_output_sensitivity(config)


def objp_event(pure_epsilon: float, output_noise_multiplier: float) -> dp_event.DpEvent:
    """ObjP's event: the pure-ε pair of the exact minimiser, then the Gaussian output noise."""
    return accounting.compose([accounting.pure_dp(pure_epsilon), accounting.gaussian(output_noise_multiplier)])


# ---------------------------------------------------------------------------- OutP
def outp_sensitivity(config: OneBitConfig, votes_per_user: int | None = None) -> float:
    """L2 sensitivity of the released minimiser: 2·sqrt(k)·ζ/λ + 2ρ (k = 1: entry level)."""
    k = config.votes_per_user if votes_per_user is None else votes_per_user
    zeta = gradient_bound(config.link, config.alpha)
    return 2.0 * math.sqrt(k) * zeta / config.ridge + 2.0 * config.solver_tolerance


# ---------------------------------------------------------------------------- events
def onebit_event(config: OneBitConfig, n_items: int | None = None) -> dp_event.DpEvent:
    """The USER-level event of one training run, from the config alone (n_items is not needed)."""
    del n_items
    k = config.votes_per_user
    if config.mechanism == "inp":
        if config.pre_randomised:
            return dp_event.NoOpDpEvent()
        return local_randomisation_event(config.epsilon, k)
    if config.mechanism == "grap":
        step = accounting.discrete_laplace(grap_noise_parameter(config), k * 2 * config.grid_steps)
        return dp_event.SelfComposedDpEvent(step, config.n_steps)
    if config.mechanism == "objp":
        return objp_event(k * config.epsilon, config.objp_output_noise_multiplier)
    return accounting.gaussian(config.noise_multiplier)


def calibrate(target_epsilon: float, delta: float, config: OneBitConfig, n_items: int | None = None) -> OneBitConfig:
    """``config`` with its privacy knob set so the user-level event is (target ε, δ)-DP (RDP accountant).

    Pre-randomised InP is unchanged: its cost was charged at ingestion. ObjP keeps its output
    noise multiplier and calibrates ``epsilon`` for the composed event (ValueError when the
    Gaussian part alone already exceeds the target).
    """
    accounting.validate_privacy_target(target_epsilon, delta)
    if config.pre_randomised:
        return config
    if config.mechanism == "objp":
        floor = accounting.epsilon_rdp(accounting.gaussian(config.objp_output_noise_multiplier), delta)
        if floor >= target_epsilon:
            raise ValueError(f"objp's output noise (multiplier {config.objp_output_noise_multiplier}) alone costs "
                             f"epsilon {floor:.4g} >= the target {target_epsilon}; raise objp_output_noise_multiplier")
    if config.mechanism == "outp":
        z = accounting.calibrate_scale(lambda s: onebit_event(replace(config, noise_multiplier=s)), target_epsilon, delta)
        return replace(config, noise_multiplier=z)
    inverse = accounting.calibrate_scale(lambda s: onebit_event(replace(config, epsilon=1.0 / s)), target_epsilon, delta)
    return replace(config, epsilon=1.0 / inverse)


def _user_relation(config: OneBitConfig) -> dict[str, str]:
    """The user-level relation of grap/objp/outp: add/remove with ``user_rows``, else replace."""
    if config.user_rows is None:
        return {"neighbouring_relation": Relation.REPLACE_ONE_USER.value,
                "relation": "replace one user's votes; the number of voters is public (set user_rows for add/remove)",
                "protects": "one user's votes (items voted on and values), up to k of them"}
    return {"neighbouring_relation": Relation.ADD_OR_REMOVE_ONE_USER.value,
            "relation": (f"add or remove one user (up to k votes); votes padded to user_rows = {config.user_rows} "
                         "public rows; with more voters, user_rows of them chosen uniformly at random are kept "
                         "(never refused)"),
            "protects": "one user's votes and whether she voted at all, up to k votes"}


def event_parameters(config: OneBitConfig) -> dict[str, Any]:
    """What gives the run's event its meaning: level, relation, k, C, ε per vote and per user."""
    k = config.votes_per_user
    common = {"algorithm": "onebit", "mechanism": config.mechanism, "link": config.link, "level": "user",
              "votes_per_user": k, "user_rows": config.user_rows, "user_rows_public": True,
              "voter_count_public": config.user_rows is None}
    if config.mechanism == "inp":
        eps0 = config.inp_epsilon
        return {**common, "neighbouring_relation": Relation.REPLACE_VOTE_VALUES.value,
                "protects": "vote values only; which items a user voted on is not hidden",
                "randomised_at": "ingestion" if config.pre_randomised else "training",
                "flip_probability": flip_probability(eps0), "epsilon_entry": eps0, "epsilon_user_pure": k * eps0,
                "charged_here": not config.pre_randomised}
    relation = _user_relation(config)
    if config.mechanism == "grap":
        return {**common, **relation, "clamp": config.clamp, "n_steps": config.n_steps,
                "grid": config.clamp / config.grid_steps, "entry_l1_sensitivity": 2 * config.clamp,
                "laplace_scale_entry": grap_laplace_scale(config),
                "laplace_scale_user": k * grap_laplace_scale(config),
                "epsilon_entry": config.epsilon, "epsilon_user_pure": k * config.epsilon}
    if config.mechanism == "objp":
        scale, grid, ridge = objp_noise(config)
        return {**common, **relation, "noise_scale": scale, "dither_grid": grid, "ridge": ridge,
                "gradient_bound": gradient_bound(config.link, config.alpha),
                "curvature_bound": curvature_bound(config.link),
                "epsilon_entry_pure_part": objp_entry_epsilon(config),
                "epsilon_user_pure_part": k * config.epsilon,
                "user_level_by": "group privacy (pure part); output noise sensitivity 2*rho at every level",
                "solver_tolerance": config.solver_tolerance,
                "output_l2_sensitivity": objp_output_sensitivity(config),
                "output_noise_multiplier": config.objp_output_noise_multiplier,
                "output_noise_std": objp_output_std(config),
                "charged_as": "ComposedDpEvent([pure k*epsilon pair, GaussianDpEvent(output_noise_multiplier)])"}
    return {**common, **relation, "ridge": config.ridge, "solver_tolerance": config.solver_tolerance,
            "l2_sensitivity_entry": outp_sensitivity(config, 1), "l2_sensitivity_user": outp_sensitivity(config),
            "noise_multiplier": config.noise_multiplier}
