"""DPALS: private alternating least squares (Chien et al. 2021, arXiv:2107.09802).

Pre-processing is the paper's Algorithm 3 with the corrections of docs/algorithms.md §1; training is the
practical Algorithm 1. Privacy unit: one user and all of their ratings (add/remove).

Releases, each a Gaussian mechanism charged through a ``GaussianDpEvent`` whose noise multiplier is
noise std / L2 sensitivity (k = contribution bound; B = k for sampling, B for adaptive weights):

=====================  ==================================  ==============================
release                statistic                           L2 sensitivity (one user)
=====================  ==================================  ==============================
count histogram        users per power-of-two bin of their 1: one user, one bin (if
(``bound_quantile``)   number of ratings (issue 27)        ``bound_quantile`` is set)
item counts c̃ (1st)   per-item counts of ≤ k sampled       sqrt(k): ≤ k distinct items, +1
                       ratings per user                    each
DP mean: sum           Σ (r − mid) over the same sample    k·h, h = (hi − lo)/2
DP mean: count         number of sampled ratings           k
user-level mean: sum   Σ_i mean_i(r − mid), one term a     h (``mean_mode`` "dp_user":
                       user                                independent of k)
user-level mean: count number of users                     1
item bias sums S̃       Σ clip(r − m̃ − b_u, ±Γ_b) per item  sqrt(k)·Γ_b: ≤ k distinct items,
                       over the same sample                each term |·| ≤ Γ_b
item counts (re-count) Σ_i c_ij on the bounded data        sqrt(Σ_j c_ij²) = sqrt(B)
K̃ (if λ0 > 0)         Σ_i u_i u_iᵀ (upper triangle)       ‖u uᵀ‖_F = ‖u‖² ≤ Γ_u²
{Ã_j}                  Σ_i c_ij u_i u_iᵀ, all trained j    sqrt(Σ_j c_ij²)·Γ_u² = sqrt(B)·Γ_u²
{b̃_j}                  Σ_i c_ij M_ij u_i, all trained j    sqrt(B)·Γ_u·Γ_M
=====================  ==================================  ==============================

With ``bound_quantile`` set, k (or B) is not a constant: the first release is the count histogram
(:mod:`app.core.privacy.quantiles`), and k = clamp(round(``bound_scale`` · its ``bound_quantile``-
quantile), ``bound_min``, ``contribution_bound``) enters every later sensitivity. Every noise
multiplier is calibrated before the run reads anything; only the noise *scale* (sensitivity ×
multiplier) follows the released k, which the clamp keeps in a public range.

Symmetric matrices are released as their upper triangle (diagonal included) with i.i.d. noise,
then mirrored; the upper triangle's L2 norm is at most the Frobenius norm, so the bounds hold.
Two optional steps after the releases, functions of released quantities and public constants only
(post-processing: no release, no event change; tests/unit/test_dpals_postprocessing.py):
``gram_pooling`` ψ shrinks each noisy Ã_j towards c̃_j·Ā, the pooled Gram Ā = Σ_j Ã_j / Σ_j c̃_j
scaled by the item's released re-count, in proportion to its noise (:func:`pool_item_grams`), and
``average_last`` m publishes the mean of the last m steps' released V_t (:func:`average_releases`).
The laws of :func:`apply_bound_laws` (``prior_bound_floor``, ``ridge_bound_exponent``) read the released
B and the count histogram's noisy user total, post-processing of that release.
On quality-ml1m's validation splits (δ = 1e-4, seeds 0-2) both together gained at every ε tried,
e.g. ranking ε = 5 Recall@20 .279 → .288, rating ε = 20 RMSE .905 → .900 (with more steps).

Partition-invariant (docs/algorithms.md §7): every released statistic is an exact fixed-point sum
and every random draw is keyed by the secret seed and a public index (a user's external id, an
item's catalogue position, the release's number), so the run publishes the same bits however its
data is chunked or partitioned. The functions a distributed driver maps over user partitions
(``rating_keys``, ``count_statistic``, ``mean_statistics``, ``item_bias_statistic``,
``bound_contributions``, ``item_statistics``, ``gravity_statistic``), the reducer
(``reduce_exact``) and the driver-side releases (``release_public_state``, ``release_recounts``,
``ItemSource``) are public; :mod:`app.core.mf.distributed` is the driver over them (in process or on Dask).

User embeddings are solves over each user's own ratings (privileged, never released): exact, or a
few conjugate-gradient iterations warm-started from her own previous solution (``user_cg_steps``),
a function of her ratings and the released V's only; the item step only sees them clipped to
‖u_i‖ <= Γ_u, which is all its sensitivities rely on. V's random initialisation is data-free.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Protocol, Self

import numpy as np
from dp_accounting import dp_event

from app.core.arrays import HeldBytes
from app.core.data.partitioned import PartitionedRatings, gather
from app.core.data.ratings import Ratings
from app.core.mf.als import (
    Bucket,
    QuantisedFactors,
    SolvePlan,
    bucket_quantised_gram,
    item_ridge_weights,
    make_plan,
    quantised_factors,
    solve_side,
    solve_side_cg,
)
from app.core.mf.linalg import (
    add_to_diagonal,
    exact_upper_gram_and_rhs,
    gram_quantum,
    noise_edge,
    project_psd,
    quantise_table,
    solve_noisy_systems,
)
from app.core.mf.model import PublicModel, UserRegularisation
from app.core.parallel import parallel_map
from app.core.privacy import accounting
from app.core.privacy.discrete_noise import GridGaussian
from app.core.privacy.exact_sums import exact_bincount, exact_sum, fixed_quantum, fixed_terms, floor_weights
from app.core.privacy.keyed import KeyedRandomness, NoiseKey, SamplingKeys, user_hashes
from app.core.privacy.quantiles import HISTOGRAM_SENSITIVITY, count_histogram, histogram_bins, histogram_quantile
from app.core.privacy.releaser import GaussianReleaser
from app.core.privacy.sampling import KeysOf, clip_scale, lowest_k_per_row, per_user_sample, sort_pairs

__all__ = [
    "CONTRIBUTION_MODES",
    "DPALSConfig",
    "Preprocessed",
    "PublicState",
    "BoundedData",
    "public_preprocessing",
    "release_public_state",
    "release_recounts",
    "bound_statistic",
    "release_contribution_bound",
    "apply_bound_laws",
    "RIDGE_REFERENCE_USERS",
    "user_mean_statistics",
    "ItemReleases",
    "ItemSource",
    "item_statistics",
    "gravity_statistic",
    "reduce_exact",
    "rating_keys",
    "count_sensitivity",
    "count_noise_std",
    "item_bias_prior",
    "with_bias_prior_used",
    "bound_contributions",
    "dpals_event",
    "checked_event",
    "apply_step_law",
    "public_config",
    "event_parameters",
    "calibrate",
    "EVENT_FIELDS",
    "event_scale",
    "preprocess",
    "train_dpals",
    "fit_dpals",
    "DPALSFit",
    "FitFunction",
    "PublicItemTerms",
    "public_model",
    "project_psd",
    "pooled_gram",
    "pooled_from_sum",
    "pool_item_grams",
    "average_releases",
]

CONTRIBUTION_MODES = ("uniform", "tail", "adaptive_weights")
OBJECTIVES = ("rating", "ranking")
MEAN_MODES = ("dp", "dp_user", "public")
# "dp_user": the released offset stays within ±MEAN_INTERIOR·h of the midpoint, the scale's interior
MEAN_INTERIOR = 0.8
# item_bias_prior_by_users: the user count at which the prior std is item_bias_prior_std itself
PRIOR_REFERENCE_USERS = 1000.0
Progress = Callable[[float, str], None]
# The item systems use Π_PSD(Ã_j + s I) with s = PSD_SHIFT x 2σ√r, the spectral edge of the Gram noise
# (data-independent, so post-processing): Ã_j + s I is then positive definite for most items (≈ 93 %
# in speed-train's setting) and a Cholesky test replaces their eigen-decomposition. 0 is the paper's
# Π_PSD(Ã_j). On quality-ml1m's validation splits 1.0 matched 0 within seed noise (better at eps = 1);
# 0.5 no better.
PSD_SHIFT = 1.0


@dataclass(frozen=True)
class DPALSConfig:
    """DPALS hyper-parameters. Every field is public; the config is stored with the model.

    Noise: ``noise_multiplier`` z is the multiplier of the linear terms {b̃_j}; the others are
    z times a fixed ratio so that :func:`calibrate` scales all noise together.
    Defaults for explicit ratings: the best validation RMSE of a random search on MovieLens-1M
    at epsilon = 20 (benchmarks/quality_ml1m.py); tune per data set on public data.
    """

    rating_range: tuple[float, float] = (1.0, 5.0)
    objective: str = "rating"  # "ranking": implicit positives (r >= positive_threshold), Recall@k
    positive_threshold: float | None = None  # ranking: None = lo + 0.75 (hi − lo)
    popularity_prior: float = 0.0  # ranking: γ of the item prior γ·log c̃_j / log max c̃ (DP counts)
    rank: int = 16
    n_steps: int = 3  # T
    reg_item: float = 640.0  # λ
    item_reg_exponent: float = 0.5  # μ (r_j = c̃_j^μ / mean)
    reg_user: float = 0.002
    user_reg_exponent: float = 1.0  # ν
    reg_gravity: float = 0.0  # λ0
    contribution_bound: int = 240  # k (sampling) or B (adaptive weights)
    contribution_mode: str = "adaptive_weights"
    # issue 27: k from the data: k = clamp(round(bound_scale·q̃), bound_min, contribution_bound), q̃ the DP
    # bound_quantile-quantile of the users' numbers of ratings (None: k = contribution_bound)
    bound_quantile: float | None = None
    bound_scale: float = 1.0
    bound_min: int = 1
    bound_noise_ratio: float = 4.0  # the count histogram: z·ratio
    # post-processing of the count histogram's release (defaults rule 9, :func:`apply_bound_laws`): laws in
    # the released B and the histogram's noisy user total ñ, applied once the bound is set
    prior_bound_floor: float = 0.0  # ranking: γ_B, the prior becomes popularity_prior + γ_B / B²
    ridge_bound_exponent: float = 0.0  # a: reg_user grows by max(1, ñ/1000)^(a·(√(B_ref/B) − 1)) ...
    ridge_bound_reference: float = 0.0  # ... B_ref, the B at which it stops growing ...
    ridge_bound_cap: float = 0.0  # ... up to this ceiling (any of the three 0: the ridge law is off)
    # defaults rule 14 (ranking, no declared max_users): reg_user ← min(reg_user, A·√(ñ/1000)) for A =
    # ridge_users_scale, ñ floored at three of its noise stds, before rule 9's law (0: off; needs bound_quantile)
    ridge_users_scale: float = 0.0
    # defaults rule 10 (:func:`apply_step_law`): where the released B is at most few_steps_bound (0: never),
    # the run takes few_steps steps instead of n_steps, and every release after the bound's takes the share of
    # ε the dropped steps leave (later_noise_scale): the same Gaussian composition as the reserved run
    few_steps_bound: int = 0
    few_steps: int = 1
    later_noise_scale: float = 1.0  # the multipliers of every release after the bound histogram × this
    weight_exponent: float = -0.5  # μ of the adaptive weights, <= 0
    frequent_fraction: float = 0.7  # β
    # defaults rule 10: also train every item whose released count reaches frequent_snr·rank·√B·z_gram, or
    # frequent_count_sigmas times the count release's noise std (either 0: that floor is off; :func:`count_floor`)
    frequent_snr: float = 0.0
    frequent_count_sigmas: float = 0.0
    # defaults rule 11: an item the model in force trained (a public input, ``kept_items``) stays trained
    # while its released count reaches keep_trained_sigmas times the count release's noise std (0: off;
    # :func:`kept_floor`), so an item whose count hovers at the floor is not dropped and retaken run by run
    keep_trained_sigmas: float = 0.0
    # defaults rule 12: an item trained by those floors alone (:func:`secondary_items`) enters the users' adaptive
    # weights and their solves scaled by its Gram's signal-to-noise ratio (:func:`secondary_shares`; False: as the rest)
    secondary_by_snr: bool = False
    clip_user: float = 1.0  # Γ_u
    clip_rating: float = 2.0  # Γ_M, applied after centring
    mean_mode: str = "dp"
    public_mean: float | None = None  # used when mean_mode == "public" (None: range midpoint)
    noise_multiplier: float = 10.0  # z of {b̃_j}
    gram_noise_ratio: float = 1.0  # {Ã_j}: z·ratio
    gravity_noise_ratio: float = 2.0  # K̃: z·ratio
    count_noise_ratio: float = 2.0  # both count releases: z·ratio
    mean_noise_ratio: float = 2.0  # DP mean (sum and count): z·ratio
    user_centering: bool = True  # centre each user by her own shrunken mean (privileged)
    user_bias_shrinkage: float = 10.0
    item_bias: bool = True  # release DP item biases b̃_j; factors then fit the residuals
    clip_bias: float = 1.0  # Γ_b: per-rating residual clip of the item-bias sums (rating units)
    bias_noise_ratio: float = 2.0  # item-bias sums: z·ratio
    item_bias_shrinkage: float = 10.0  # s_b: pseudo-count pulling b̃_j towards 0 (data noise)
    item_bias_prior_std: float = 0.5  # τ_b: prior std of an item bias (noise-aware shrinkage)
    # defaults rule 13: τ_b·(Ñ/1000)^{1/4}, capped at Γ_b, with Ñ the user-level mean's released user count
    # (:func:`item_bias_prior`; False: τ_b as given)
    item_bias_prior_by_users: bool = False
    noise_filter: float = 0.0  # φ: Wiener filter of the noisy item systems (0: off), see _wiener
    gram_pooling: float = 0.0  # ψ: shrink each Ã_j towards the pooled c̃_j·Ā (0: off), see pool_item_grams
    average_last: int = 1  # m: publish the mean of the last m steps' released V (1: the last one)
    self_calibration: bool = False  # fold-in: each user's ridge by leave-out on her ratings (foldin.py)
    # training's user solves: CG iterations per user and step, warm-started (as implicit's ALS, which
    # does 3); 0: exact. quality-ml1m (10 seeds, paired): 3 lost 0.003 Recall@20 at eps = 10, 6 nothing
    user_cg_steps: int = 6
    init_scale: float = 1.0
    defaults_rule: int | None = None  # set when the ε-aware rule (app.core.mf.defaults) chose the values
    seed: int = 0

    def __post_init__(self) -> None:
        lo, hi = self.rating_range
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"rating_range must be finite with lo < hi, got {self.rating_range}")
        for name in ("rank", "n_steps", "contribution_bound", "bound_min", "few_steps"):  # k: in every sensitivity
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.few_steps_bound, int) or isinstance(self.few_steps_bound, bool) or self.few_steps_bound < 0:
            raise ValueError(f"few_steps_bound must be an integer >= 0, got {self.few_steps_bound!r}")
        if not isinstance(self.average_last, int) or isinstance(self.average_last, bool) or not (
            1 <= self.average_last <= self.n_steps
        ):
            raise ValueError(f"average_last must be an integer in [1, n_steps], got {self.average_last!r}")
        if self.few_steps > self.n_steps:
            raise ValueError(f"few_steps must be at most n_steps, got {self.few_steps!r}")
        steps = self.user_cg_steps
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise ValueError(f"user_cg_steps must be an integer >= 0, got {steps!r}")
        if self.contribution_mode not in CONTRIBUTION_MODES:
            raise ValueError(f"contribution_mode must be one of {CONTRIBUTION_MODES}")
        if self.mean_mode not in MEAN_MODES:
            raise ValueError(f"mean_mode must be one of {MEAN_MODES}")
        self._check_bound_law()
        if not 0 < self.frequent_fraction <= 1:
            raise ValueError("frequent_fraction must lie in (0, 1]")
        if self.weight_exponent > 0:
            raise ValueError("weight_exponent must be <= 0")
        positive = ("clip_user", "clip_rating", "noise_multiplier", "gram_noise_ratio",
                    "gravity_noise_ratio", "count_noise_ratio", "mean_noise_ratio", "clip_bias",
                    "bias_noise_ratio", "item_bias_prior_std", "bound_noise_ratio", "later_noise_scale")
        for name in positive:
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be finite and > 0, got {value}")
        for name in ("reg_item", "reg_user", "reg_gravity", "init_scale", "user_bias_shrinkage",
                     "item_bias_shrinkage", "noise_filter", "gram_pooling", "prior_bound_floor", "frequent_snr",
                     "frequent_count_sigmas", "keep_trained_sigmas",
                     "ridge_bound_exponent", "ridge_bound_reference", "ridge_bound_cap", "ridge_users_scale"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if self.reg_item == 0:
            raise ValueError("reg_item must be > 0 (the noisy item systems need a ridge)")
        for name in ("self_calibration", "secondary_by_snr", "item_bias_prior_by_users"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean")
        if self.item_bias and self.item_bias_prior_by_users and self.mean_mode != "dp_user":
            raise ValueError("item_bias_prior_by_users reads the user count that mean_mode 'dp_user' releases")
        if self.public_mean is not None and not math.isfinite(self.public_mean):
            raise ValueError("public_mean must be finite")
        self._check_objective()

    def _check_bound_law(self) -> None:
        if self.bound_quantile is None:
            if self.ridge_users_scale:
                raise ValueError("ridge_users_scale reads the user total of the count histogram: it needs bound_quantile")
            return
        if not (isinstance(self.bound_quantile, (int, float)) and 0 < self.bound_quantile < 1):
            raise ValueError(f"bound_quantile must lie in (0, 1) or be null, got {self.bound_quantile!r}")
        if not (math.isfinite(self.bound_scale) and self.bound_scale > 0):
            raise ValueError(f"bound_scale must be finite and > 0, got {self.bound_scale}")
        if self.bound_min > self.contribution_bound:
            raise ValueError("bound_min must be at most contribution_bound (the largest k the data may set)")

    def _check_objective(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}")
        if not (math.isfinite(self.popularity_prior) and self.popularity_prior >= 0):
            raise ValueError("popularity_prior must be finite and >= 0")
        if self.objective == "rating":
            if self.popularity_prior or self.prior_bound_floor:
                raise ValueError("popularity_prior and prior_bound_floor apply to the ranking objective only")
            return
        lo, hi = self.rating_range
        if self.positive_threshold is not None and not lo <= self.positive_threshold <= hi:
            raise ValueError("positive_threshold must lie inside rating_range")
        if self.mean_mode != "public" or self.item_bias or self.user_centering:
            raise ValueError("the ranking objective trains on positives only: it needs mean_mode 'public', "
                             "item_bias false and user_centering false")

    @property
    def threshold(self) -> float:
        """Ratings at or above it are the positives of the ranking objective."""
        lo, hi = self.rating_range
        return lo + 0.75 * (hi - lo) if self.positive_threshold is None else float(self.positive_threshold)

    # -------------------------------------------------------------- derived quantities
    @property
    def midpoint(self) -> float:
        return 0.5 * (self.rating_range[0] + self.rating_range[1])

    @property
    def half_range(self) -> float:
        return 0.5 * (self.rating_range[1] - self.rating_range[0])

    def noise_multipliers(self) -> dict[str, float]:
        z = self.noise_multiplier * self.later_noise_scale  # every release after the bound histogram's
        return {
            "counts": z * self.count_noise_ratio,
            "mean": z * self.mean_noise_ratio,
            "bound": self.noise_multiplier * self.bound_noise_ratio,
            "bias": z * self.bias_noise_ratio,
            "gravity": z * self.gravity_noise_ratio,
            "gram": z * self.gram_noise_ratio,
            "linear": z,
        }

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["rating_range"] = list(self.rating_range)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown {cls.__name__.removesuffix('Config')} parameters: {sorted(unknown)}")
        data = dict(data)
        if "rating_range" in data:
            data["rating_range"] = tuple(float(x) for x in data["rating_range"])
        return cls(**data)


# ---------------------------------------------------------------------------- accounting
def dpals_event(config: DPALSConfig) -> dp_event.DpEvent:
    """The run's full event, known before any data is touched (used to reserve budget)."""
    z = config.noise_multipliers()
    pre: list[dp_event.DpEvent] = [] if config.bound_quantile is None else [accounting.gaussian(z["bound"])]
    pre.append(accounting.gaussian(z["counts"]))
    if config.mean_mode in ("dp", "dp_user"):
        pre += [accounting.gaussian(z["mean"]), accounting.gaussian(z["mean"])]
    if config.item_bias:
        pre.append(accounting.gaussian(z["bias"]))
    pre.append(accounting.gaussian(z["counts"]))
    step: list[dp_event.DpEvent] = []
    if config.reg_gravity > 0:
        step.append(accounting.gaussian(z["gravity"]))
    step += [accounting.gaussian(z["gram"]), accounting.gaussian(z["linear"])]
    return accounting.compose(pre + [dp_event.SelfComposedDpEvent(accounting.compose(step), config.n_steps)])


#: every config field :func:`dpals_event` reads: the calibration's only input besides (ε, δ)
EVENT_FIELDS = ("noise_multiplier", "count_noise_ratio", "mean_mode", "mean_noise_ratio", "item_bias",
                "bias_noise_ratio", "reg_gravity", "gravity_noise_ratio", "gram_noise_ratio", "n_steps",
                "bound_quantile", "bound_noise_ratio", "later_noise_scale")


def calibrate(target_epsilon: float, delta: float, config: DPALSConfig) -> DPALSConfig:
    """``config`` with all noise scaled by one factor so the run is (target ε, δ)-DP (RDP).

    The factor depends on ``config`` only through :data:`EVENT_FIELDS`, so it is computed once per
    (ε, δ, event shape) (:func:`event_scale`): every scheduled retrain and projection of a data set
    calibrates the same shape again, whatever its other hyper-parameters."""
    accounting.validate_privacy_target(target_epsilon, delta)
    shape = replace(DPALSConfig(), **{name: getattr(config, name) for name in EVENT_FIELDS})
    return replace(config, noise_multiplier=config.noise_multiplier * event_scale(target_epsilon, delta, shape))


@functools.lru_cache(maxsize=256)
def event_scale(target_epsilon: float, delta: float, shape: DPALSConfig) -> float:
    """The factor on ``shape``'s noise that makes its event (target ε, δ)-DP (a root search over
    RDP curves; memoised, a pure function of its hashable, frozen arguments)."""
    base = shape.noise_multiplier
    return accounting.calibrate_scale(
        lambda s: dpals_event(replace(shape, noise_multiplier=base * s)), target_epsilon, delta,
        lower=1e-4 / base, upper=1e6 / base,
    )


# ---------------------------------------------------------------------------- pre-processing
@dataclass(frozen=True)
class Preprocessed:
    """Output of Algorithm 3. Public: mean, counts, frequent, recounts. Private: the plans."""

    global_mean: float
    item_counts: np.ndarray  # first DP count release, floored at 1 (all items)
    frequent: np.ndarray  # indices of trained items (into the full item list)
    recounts: np.ndarray  # second DP count release on the bounded data (frequent items)
    item_biases: np.ndarray  # DP item biases b̃_j (all items; zeros when item_bias is off)
    user_plan: SolvePlan  # all of each user's frequent ratings (users x frequent items)
    item_plan: SolvePlan  # bounded, weighted ratings (frequent items x users)
    item_bias_prior: float | None = None  # the prior std τ_b the biases were shrunk with (None: no biases)


def count_statistic(cols: np.ndarray, weights: np.ndarray | None, n_items: int, budget: float = 1.0) -> np.ndarray:
    """Per-item (weighted) counts: the statistic of both count releases; exact sums in any order
    (weights from :func:`adaptive_weights` with the same ``budget``: multiples of its quantum)."""
    if weights is None:
        return exact_bincount(cols, None, n_items)
    bound = math.sqrt(budget)
    return exact_bincount(cols, weights / fixed_quantum(bound), n_items, bound)


def mean_statistics(values: np.ndarray, midpoint: float, half_range: float) -> tuple[float, float]:
    """(Σ (r − mid), count) over the sampled ratings: the statistics of the DP mean, each term on
    the fixed-point grid of its bound h (``app.core.privacy.exact_sums``): exact in any order."""
    return exact_sum(fixed_terms(values - midpoint, half_range), half_range), float(len(values))


def user_mean_statistics(ratings: Ratings, midpoint: float, half_range: float) -> tuple[float, float]:
    """(Σ_i mean_i(r − mid), number of users with a rating): the user-level mean's statistics (issue 27).

    Each user adds one term, her own mean offset, which lies in [−h, h] because her ratings lie in
    the public range, and 1 to the count: L2 sensitivities h and 1, whatever her number of ratings
    (tests/unit/test_bound_from_data.py checks both numerically). Terms on the fixed-point grid of
    h: exact in any order or partition of the users."""
    n = ratings.user_counts()
    rated = n > 0
    rows = np.repeat(np.arange(ratings.n_users), n)
    sums = np.bincount(rows, weights=ratings.csr.data - midpoint, minlength=ratings.n_users)
    means = np.clip(sums[rated] / n[rated], -half_range, half_range)
    return exact_sum(fixed_terms(means, half_range), half_range), float(np.count_nonzero(rated))


def bound_statistic(per_user_counts: np.ndarray, config: DPALSConfig) -> np.ndarray:
    """The count histogram of :mod:`app.core.privacy.quantiles` over bins that resolve every count
    the bound law can tell apart (up to contribution_bound / bound_scale): integer, exact to sum."""
    largest = max(1.0, config.contribution_bound / config.bound_scale)
    return count_histogram(per_user_counts, histogram_bins(largest))


def release_contribution_bound(statistic: np.ndarray, config: DPALSConfig, releaser: GaussianReleaser) -> DPALSConfig:
    """``config`` with k set from the data (issue 27), or k unchanged when ``bound_quantile`` is None;
    either way with :func:`apply_bound_laws` applied.

    Releases the count histogram (L2 sensitivity 1) and sets k = clamp(round(bound_scale·q̃),
    bound_min, contribution_bound) from its q-quantile q̃ (post-processing); where the noisy
    histogram holds no users the declared largest k stands. Every later release's sensitivity
    reads this k; their multipliers were calibrated before the run began."""
    if config.bound_quantile is None:
        return apply_bound_laws(config, 0.0)
    multiplier = config.noise_multipliers()["bound"]
    noisy = releaser.vector("bound_histogram", statistic, HISTOGRAM_SENSITIVITY, multiplier)
    quantile = histogram_quantile(noisy, float(config.bound_quantile))
    if math.isfinite(quantile):
        k = min(config.contribution_bound, max(config.bound_min, round(config.bound_scale * quantile)))
        config = replace(config, contribution_bound=int(k))
    total_noise = HISTOGRAM_SENSITIVITY * multiplier * math.sqrt(len(noisy))  # the std of ñ, a sum of noisy bins
    return apply_bound_laws(config, float(np.sum(noisy)), total_noise)


RIDGE_REFERENCE_USERS = 1000.0
"""The user count at which :func:`apply_bound_laws`' ridge law starts to act (the defaults' reference)."""


def apply_bound_laws(config: DPALSConfig, users: float, users_noise: float = 0.0) -> DPALSConfig:
    """``config`` with the laws in the released bound B (``config.contribution_bound``) applied and
    consumed (their knobs zeroed: the run's published config holds the values it used); ``config``
    itself where it has none. Post-processing: B and ``users`` (the released histogram's noisy total
    ñ, 0 without a release; ``users_noise`` its noise std) are released, the knobs public, so no
    release is added.

    * ``ridge_users_scale`` A (rule 14): reg_user ← min(λ_u, A·√(max(ñ, 3σ_ñ)/1000)), the defaults' rule-7
      ridge with the released user total in place of a declared bound (applied first).

    * ``prior_bound_floor`` γ_B: the ranking prior becomes γ + γ_B / B². Each user's own term in her
      scores is fitted to her positives (about B of them); the fewer they are, the more the prior must carry.
    * ``ridge_bound_exponent`` a, ``ridge_bound_reference`` B_ref and ``ridge_bound_cap`` λ_max:
      reg_user ← max(λ_u, min(λ_max, λ_u · max(1, ñ/1000)^(a·(√(B_ref/B) − 1)))): with many users of
      few positives each, the item vectors are well determined while each user's few positives are
      not, so her ridge falls less with ε (never lowered, never raised past λ_max; none at B ≥ B_ref
      or ñ ≤ 1000).
    * ``few_steps_bound`` B_T and ``few_steps`` T': at B ≤ B_T the run takes T' < T steps
      (:func:`apply_step_law`, which says why the reserved event still holds).
    """
    return apply_step_law(_apply_prior_and_ridge_laws(_apply_users_ridge_law(config, users, users_noise), users))


def _apply_users_ridge_law(config: DPALSConfig, users: float, users_noise: float) -> DPALSConfig:
    """Rule 14: λ_u ← min(λ_u, A·√(max(ñ, 3σ_ñ)/1000)), consumed. The floor keeps a noise-dominated
    total from lowering the ridge: at small ε σ_ñ is large, and the ridge stays where it was."""
    if not config.ridge_users_scale:
        return config
    floored = max(users, 3.0 * users_noise)
    ridge = config.ridge_users_scale * math.sqrt(max(floored, 0.0) / RIDGE_REFERENCE_USERS)
    return replace(config, reg_user=min(config.reg_user, ridge), ridge_users_scale=0.0)


def _apply_prior_and_ridge_laws(config: DPALSConfig, users: float) -> DPALSConfig:
    ridge_law = bool(config.ridge_bound_exponent and config.ridge_bound_reference and config.ridge_bound_cap)
    if not (config.prior_bound_floor or ridge_law):
        return config
    bound = config.contribution_bound
    reg_user = config.reg_user
    if ridge_law and config.ridge_bound_cap > reg_user > 0:
        power = config.ridge_bound_exponent * (math.sqrt(config.ridge_bound_reference / bound) - 1.0)
        # in logarithms: a large exponent or ñ reaches the cap instead of overflowing a float
        log_growth = power * math.log(max(1.0, users / RIDGE_REFERENCE_USERS))
        headroom = math.log(config.ridge_bound_cap / reg_user)
        reg_user = config.ridge_bound_cap if log_growth >= headroom else max(reg_user, reg_user * math.exp(log_growth))
    return replace(config, popularity_prior=config.popularity_prior + config.prior_bound_floor / bound**2,
                   reg_user=reg_user, prior_bound_floor=0.0, ridge_bound_exponent=0.0, ridge_bound_reference=0.0,
                   ridge_bound_cap=0.0)


def apply_step_law(config: DPALSConfig) -> DPALSConfig:
    """``config`` with the step law of defaults rule 10 applied and consumed (``few_steps_bound`` 0).

    Where the released B is at most ``few_steps_bound`` and ``few_steps`` T' is below ``n_steps``
    T, the run takes T' steps (averaging at most its T' released V's), and the multiplier of every
    release after the bound histogram (counts, mean, biases, recounts, steps) is scaled by one
    factor s, chosen so that they compose to the reserved run's remainder: with P the Gaussian
    precision Σ 1/z² of those releases, P(T' steps)/s² = P(T steps). Few positives a user carry
    little signal per step; the dropped steps' share of ε goes to the releases that remain.

    Why the reserved event still holds. Every release is charged as a Gaussian mechanism (the exact
    discrete Gaussian drawn is bounded by it; bounds compose), and a composition of Gaussian
    mechanisms is one Gaussian mechanism of μ² = Σ 1/z² (μ-GDP, Dong, Roth & Su, arXiv
    1905.02383, Cor. 3.3; in RDP ε(α) = α·Σ 1/(2z²), Mironov, arXiv 1702.07476, Prop. 7), so both
    branches are the same mechanism after B, and the same privacy loss distribution and RDP curve as
    the reserved event (the ledger's). T' is chosen from B, an earlier release of the same run:
    adaptive composition (Dong, Roth & Su, Thm 3.2; Mironov, Prop. 1), valid because for every value
    B can take, what follows is a mechanism of the same μ, fixed before the run. :func:`checked_event`
    verifies, for every run, that the releases made compose to the reserved mechanism."""
    if not config.few_steps_bound:
        return config
    if config.contribution_bound > config.few_steps_bound or config.few_steps >= config.n_steps:
        return replace(config, few_steps_bound=0)
    steps = config.few_steps
    fewer = replace(config, n_steps=steps, average_last=min(config.average_last, steps), few_steps_bound=0,
                    later_noise_scale=1.0)
    scale = math.sqrt(_precision_after_bound(fewer) / _precision_after_bound(config))
    return replace(fewer, later_noise_scale=scale)


def _precision_after_bound(config: DPALSConfig) -> float:
    """Σ 1/z² of the run's releases after the bound histogram (:func:`accounting.gaussian_precision`)."""
    precision = accounting.gaussian_precision(dpals_event(replace(config, bound_quantile=None)))
    if precision is None:  # every DPALS release is Gaussian: a bug (the run fails closed, charged)
        raise RuntimeError("a DPALS release that is not Gaussian")
    return precision


def adaptive_weights(rows: np.ndarray, item_counts: np.ndarray, budget: float, exponent: float,
                     shares: np.ndarray | None = None) -> np.ndarray:
    """ĉ_ij: c_ij = sqrt(B · s_j c̃_j^{2μ} / Σ_{l∈I_i} s_l c̃_l^{2μ}) (Σ_j c_ij² = B for every user) rounded
    down to the fixed-point grid of sqrt(B) (``exact_sums.floor_weights``: Σ_j ĉ_ij² <= B). ``shares``:
    s_j > 0 per entry (None: all 1; rule 12's :func:`secondary_shares`). A function of user i's own items
    and public values (the released counts, the trained set) only."""
    powered = np.maximum(item_counts, 1.0) ** (2.0 * exponent)
    if shares is not None:
        powered *= shares
    per_user = np.bincount(rows, weights=powered)
    bound = math.sqrt(budget)
    weights = np.sqrt(budget * powered / per_user[rows])
    floor_weights(weights, bound, out=weights)  # in place: no second nnz-sized array
    weights *= fixed_quantum(bound)
    return np.asarray(weights)


@dataclass(frozen=True)
class PublicState(HeldBytes):
    """Public outputs of pre-processing that everything later conditions on."""

    global_mean: float
    item_counts: np.ndarray  # first DP count release, floored at 1 (all items)
    frequent: np.ndarray  # indices of the trained items
    item_biases: np.ndarray  # DP item biases b̃_j (all items; zeros when item_bias is off)
    item_bias_prior: float | None = None  # the prior std τ_b the biases were shrunk with (:func:`item_bias_prior`)


@dataclass(frozen=True)
class ItemEntries(HeldBytes):
    """Bounded, weighted ratings by trained item (compressed by column): item j's entries are
    ``indptr[j]:indptr[j + 1]`` of ``users`` (ascending), ``values`` and ``weights`` (None: all 1).
    What an item plan is built from; a cluster moves them by item block (:meth:`select`)."""

    indptr: np.ndarray
    users: np.ndarray
    values: np.ndarray
    weights: np.ndarray | None

    @property
    def n_items(self) -> int:
        return len(self.indptr) - 1

    def plan(self, n_users: int) -> SolvePlan:
        """The item plan (trained items × ``n_users`` users) of these entries."""
        return make_plan(self.indptr, self.users, self.values, n_users, self.weights)

    def rows(self, lo: int, hi: int) -> ItemEntries:
        """Items lo..hi-1 alone, as items 0..hi-lo-1 (views of these entries)."""
        first, last = int(self.indptr[lo]), int(self.indptr[hi])
        return ItemEntries(indptr=self.indptr[lo : hi + 1] - first, users=self.users[first:last],
                           values=self.values[first:last],
                           weights=None if self.weights is None else self.weights[first:last])

    def select(self, ranges: Sequence[tuple[int, int]], user_offset: int = 0) -> ItemEntries:
        """The entries of the items in ``ranges`` (each lo..hi-1) alone, the other items empty, the
        user indices shifted by ``user_offset`` (a partition's first user in the whole's order)."""
        counts = np.zeros(self.n_items, dtype=np.int64)
        spans = [slice(int(self.indptr[lo]), int(self.indptr[hi])) for lo, hi in ranges]
        for lo, hi in ranges:
            counts[lo:hi] = np.diff(self.indptr[lo : hi + 1])

        def taken(values: np.ndarray) -> np.ndarray:
            return np.concatenate([values[span] for span in spans]) if spans else values[:0].copy()

        users = taken(self.users)
        users += np.int32(user_offset)
        return ItemEntries(indptr=np.concatenate([[0], np.cumsum(counts)]), users=users, values=taken(self.values),
                           weights=None if self.weights is None else taken(self.weights))


def merge_item_entries(parts: Sequence[ItemEntries]) -> ItemEntries:
    """The entries of user partitions over the same items as one whole: item j's entries are the
    parts' in order, so users stay ascending where each part's user indices follow the previous
    part's (:meth:`ItemEntries.select`'s offsets)."""
    counts = np.sum([np.diff(part.indptr) for part in parts], axis=0)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    total = int(indptr[-1])
    users = np.empty(total, dtype=np.int32)
    values = np.empty(total, dtype=parts[0].values.dtype)
    weighted = parts[0].weights is not None
    weights = np.empty(total) if weighted else None
    start = indptr[:-1].copy()  # where the next part's entries of each item go
    for part in parts:
        part_counts = np.diff(part.indptr)
        owner = np.repeat(np.arange(part.n_items), part_counts)
        target = start[owner] + (np.arange(len(part.users)) - part.indptr[owner])
        del owner
        users[target], values[target] = part.users, part.values
        if weights is not None and part.weights is not None:
            weights[target] = part.weights
        start += part_counts
    return ItemEntries(indptr=indptr, users=users, values=values, weights=weights)


@dataclass(frozen=True)
class BoundedData(HeldBytes):
    """Private, contribution-bounded training data (never released as such)."""

    user_plan: SolvePlan  # all of each user's frequent ratings (users x frequent items)
    item_plan: SolvePlan  # bounded, weighted ratings (frequent items x users)
    recount_statistic: np.ndarray  # Σ_i c_ij per frequent item, before noise
    # with ``by_item="entries"`` (a cluster's partitions, which move them to the items' owners) the item
    # plan is left empty and its entries are kept instead
    item_entries: ItemEntries | None = None


def count_sensitivity(k: int) -> float:
    """L2 sensitivity of the item counts: one user adds 1 to at most k distinct items."""
    return math.sqrt(k)


def count_noise_std(config: DPALSConfig) -> float:
    """The std of the first count release's noise: sensitivity √k times its multiplier."""
    return count_sensitivity(config.contribution_bound) * config.noise_multipliers()["counts"]


def rating_keys(ratings: Ratings, keyed: KeyedRandomness | SamplingKeys, stage: int, rows: np.ndarray | None = None,
                cols: np.ndarray | None = None, positions: np.ndarray | None = None) -> KeysOf:
    """keys(start, stop): the uniform sampling keys of entries [start, stop) (user positions
    ``rows`` and item columns ``cols``, mapped to catalogue positions by ``positions`` if given;
    default: the ratings in CSR order), each a keyed hash of the user's external id and the item
    (``app.core.privacy.keyed``): partition-free. O(stop − start) memory per call."""
    hashes = user_hashes(ratings.user_ids)
    indptr = ratings.csr.indptr
    columns = ratings.csr.indices if cols is None else cols

    def keys(start: int, stop: int) -> np.ndarray:
        users = _csr_rows(indptr, start, stop) if rows is None else rows[start:stop]
        items = columns[start:stop] if positions is None else positions[columns[start:stop]]
        return keyed.rating_uniforms(stage, hashes[users], items)

    return keys


def _csr_rows(indptr: np.ndarray, start: int, stop: int) -> np.ndarray:
    """The row of each CSR entry in [start, stop)."""
    first = int(np.searchsorted(indptr, start, side="right")) - 1
    last = int(np.searchsorted(indptr, stop, side="left"))
    spans = np.minimum(indptr[first + 1 : last + 1], stop) - np.maximum(indptr[first:last], start)
    return np.repeat(np.arange(first, last), spans)


def public_preprocessing(
    ratings: Ratings, config: DPALSConfig, releaser: GaussianReleaser, keyed: KeyedRandomness,
    kept: np.ndarray | None = None,
) -> PublicState:
    """Algorithm 3 steps 1-3: DP counts and DP mean on ≤ k sampled ratings per user, frequent set
    (``kept``: :func:`release_public_state`)."""
    sample = per_user_sample(ratings, config.contribution_bound, rating_keys(ratings, keyed, 0))
    cols, vals = ratings.csr.indices, ratings.csr.data  # CSR order, as the sample's mask (no copies)
    if config.mean_mode == "dp_user":
        mean_terms = user_mean_statistics(ratings, config.midpoint, config.half_range)
    else:
        mean_terms = mean_statistics(vals[sample], config.midpoint, config.half_range)
    sampled = (count_statistic(cols[sample], None, ratings.n_items), *mean_terms)
    return release_public_state(sampled, lambda mean: item_bias_statistic(ratings, sample, mean, config), config,
                                releaser, kept)


def release_public_state(
    sampled: tuple[np.ndarray, float, float], bias_statistic: Callable[[float], np.ndarray], config: DPALSConfig,
    releaser: GaussianReleaser, kept: np.ndarray | None = None,
) -> PublicState:
    """Algorithm 3 steps 1-3 from exact statistics (of the whole data, or reduced over partitions):
    ``sampled`` = (item counts, mean sum, mean count) of the ≤ k sample; ``bias_statistic(m̃)`` the
    item-bias sums once the DP mean m̃ is released. Releases the counts, the mean and the bias sums,
    in that order, and picks the frequent set (post-processing; ``kept``: the model in force's
    trained items as a catalogue mask, :func:`kept_mask`)."""
    counts_statistic, total, count = sampled
    counts = releaser.vector("item_counts", counts_statistic, count_sensitivity(config.contribution_bound),
                             config.noise_multipliers()["counts"])
    counts = np.maximum(counts, 1.0)
    mean, users = _global_mean(total, count, config, releaser)
    prior = item_bias_prior(config, users) if config.item_bias else None
    biases = _item_biases(bias_statistic, len(counts), mean, counts, config, releaser, prior)
    frequent = frequent_items(counts, config.frequent_fraction, count_floor(config), kept, kept_floor(config))
    return PublicState(global_mean=mean, item_counts=counts, frequent=frequent, item_biases=biases,
                       item_bias_prior=prior)


def release_recounts(recount_statistic: np.ndarray, config: DPALSConfig, releaser: GaussianReleaser) -> np.ndarray:
    """The second count release (the bounded data's weighted re-counts), floored at 1."""
    recounts = releaser.vector("item_recounts", recount_statistic, math.sqrt(config.contribution_bound),
                               config.noise_multipliers()["counts"])
    return np.maximum(recounts, 1.0)


def frequent_items(counts: np.ndarray, fraction: float, floor: float = math.inf, kept: np.ndarray | None = None,
                   kept_at: float = math.inf) -> np.ndarray:
    """The trained ("frequent") items: the ⌈fraction·n⌉ largest released counts, every item whose
    released count reaches ``floor`` (ties to the lower index), and every item of ``kept`` (a mask:
    the model in force's trained items) whose released count reaches ``kept_at``, in index order.
    Post-processing of the released counts and an earlier published model."""
    n_frequent = max(1, math.ceil(fraction * len(counts)), int(np.count_nonzero(counts >= floor)))
    chosen = np.zeros(len(counts), dtype=bool)
    chosen[np.argsort(-counts, kind="stable")[:n_frequent]] = True
    if kept is not None:
        chosen |= kept & (counts >= kept_at)
    return np.flatnonzero(chosen)


def kept_floor(config: DPALSConfig) -> float:
    """The released count from which an item the model in force trained stays trained (rule 11):
    keep_trained_sigmas·σ_count (:func:`count_noise_std`), inf when off. Public: the config and the
    released B."""
    return config.keep_trained_sigmas * count_noise_std(config) if config.keep_trained_sigmas else math.inf


def kept_mask(item_ids: np.ndarray, kept_items: np.ndarray | None) -> np.ndarray | None:
    """The catalogue positions of ``kept_items`` (item ids, public: the model in force's trained
    items) as a mask over ``item_ids``; ids no longer in the catalogue are ignored."""
    if kept_items is None:
        return None
    return np.isin(np.asarray(item_ids), np.asarray(kept_items))


def count_floor(config: DPALSConfig) -> float:
    """The released count from which an item is trained whatever ``frequent_fraction`` says (rule 10),
    the lower of two floors (inf when both are off):

    * :func:`snr_floor`: from there the item's vector is determined by its data, not its noise;
    * frequent_count_sigmas·σ_count: a count that clears its own release's noise (σ_count =
      :func:`count_noise_std`) is a real item with real raters, which a small ε's fraction may leave out.

    Public: the config, the released B and its multipliers."""
    floor = math.inf
    if config.frequent_count_sigmas:
        floor = config.frequent_count_sigmas * count_noise_std(config)
    return min(floor, snr_floor(config))


def snr_floor(config: DPALSConfig) -> float:
    """frequent_snr × :func:`gram_snr_count` (inf when off): from this released count on an item's
    Gram has a signal-to-noise ratio of at least ``frequent_snr``, its vector determined by its data."""
    return config.frequent_snr * gram_snr_count(config) if config.frequent_snr else math.inf


def gram_snr_count(config: DPALSConfig) -> float:
    """rank·√B·z_gram: the released count at which an item's Gram signal-to-noise ratio is 1. The
    Gram Σ c_ij u_i u_iᵀ carries about c_j·Γ_u²/rank on each diagonal entry against noise of std
    √B·Γ_u²·z_gram. Public: the config and the released B."""
    return config.rank * math.sqrt(config.contribution_bound) * config.noise_multipliers()["gram"]


def secondary_items(counts: np.ndarray, frequent: np.ndarray, config: DPALSConfig) -> np.ndarray | None:
    """Defaults rule 12: the mask over the trained items ``frequent`` of those trained by a floor alone
    (:func:`count_floor`'s σ floor or rule 11's :func:`kept_floor`): outside the ⌈fraction·n⌉ largest
    released counts ``counts`` (the order of :func:`frequent_items`) and below :func:`snr_floor`.
    None when ``secondary_by_snr`` is off or no item is secondary. Post-processing of the counts."""
    if not config.secondary_by_snr:
        return None
    secondary = ~core_items(counts, config)[frequent]
    return secondary if secondary.any() else None


def core_items(counts: np.ndarray, config: DPALSConfig) -> np.ndarray:
    """The catalogue mask of the items trained without rule 10's σ floor and rule 11's kept floor:
    the ⌈fraction·n⌉ largest released counts ``counts`` (the order of :func:`frequent_items`) and
    every count at or above :func:`snr_floor`. Post-processing of the counts."""
    core = np.zeros(len(counts), dtype=bool)
    core[np.argsort(-counts, kind="stable")[: max(1, math.ceil(config.frequent_fraction * len(counts)))]] = True
    core |= counts >= snr_floor(config)
    return core


def secondary_shares(counts: np.ndarray, frequent: np.ndarray, config: DPALSConfig) -> np.ndarray | None:
    """Rule 12: per trained item, s_j = min(1, c̃_j / :func:`gram_snr_count`) for the
    :func:`secondary_items` and 1 for the rest (None when none is secondary). A secondary item's
    Gram is mostly noise: trained as the rest it takes the largest shares of the users' weights
    (c̃^{2μ}, μ < 0) and its noisy factor enters every one of its raters' solves. With s_j it takes
    s_j of its weight share (:func:`adaptive_weights`) and enters the user solves as s_j·v_j.
    Public: the released counts and the config."""
    secondary = secondary_items(counts, frequent, config)
    if secondary is None:
        return None
    return np.where(secondary, np.minimum(1.0, counts[frequent] / gram_snr_count(config)), 1.0)


def popularity_prior(counts: np.ndarray, config: DPALSConfig) -> np.ndarray:
    """Ranking objective's item prior γ·log c̃_j / log max c̃ from the released DP counts (free).

    Published as the ranking model's item biases: scores are prior + u·v_j (the user's fold-in
    fits her positives, not the prior). Where the noisy factors carry no signal (small ε) the
    filtered v_j shrink to 0 and the ranking falls back to DP popularity instead of below it.
    """
    if config.objective != "ranking" or config.popularity_prior == 0:
        return np.zeros(len(counts))
    logs = np.log(np.maximum(counts, 1.0))
    return np.asarray(config.popularity_prior * logs / max(float(logs.max()), 1e-12))


def positives(ratings: Ratings, threshold: float) -> Ratings:
    """The ranking objective's data: ratings >= ``threshold`` as implicit positives of value 1."""
    rows, cols, vals = ratings.coo()
    keep = vals >= threshold
    return Ratings.from_indices(rows[keep], cols[keep], np.ones(int(keep.sum())),
                                user_ids=ratings.user_ids, item_ids=ratings.item_ids)


def item_bias_statistic(ratings: Ratings, sample: np.ndarray, mean: float, config: DPALSConfig) -> np.ndarray:
    """S_j = Σ_i clip(r_ij − m̃ − b_i, ±Γ_b) over the sampled ratings (≤ k per user, distinct items).

    b_i is user i's own shrunken offset (a function of her ratings only), so removing her changes
    at most k coordinates by at most Γ_b each: L2 sensitivity sqrt(k)·Γ_b.
    """
    rows = np.repeat(np.arange(ratings.n_users, dtype=np.int32), ratings.user_counts())  # CSR order, 4 bytes each
    residual = ratings.csr.data - mean
    offsets = user_regularisation(config).user_bias(
        np.bincount(rows, weights=residual, minlength=ratings.n_users), ratings.user_counts()
    )
    residual -= offsets[rows]
    np.clip(residual, -config.clip_bias, config.clip_bias, out=residual)
    terms = fixed_terms(residual, config.clip_bias, out=residual)  # in place, as the clip
    cols = ratings.csr.indices  # CSR order, as ``sample``
    return exact_bincount(cols[sample], terms[sample], ratings.n_items, config.clip_bias)


def shrink_item_biases(noisy_sums: np.ndarray, counts: np.ndarray, noise_std: float, config: DPALSConfig,
                       prior_std: float | None = None) -> np.ndarray:
    """b̃_j = S̃_j / (c̃_j + s_b + σ_S² / (c̃_j τ_b²)): the posterior mean of a N(0, τ_b²) bias.

    With S̃_j = c_j β_j + (data noise, variance ∝ c_j) + N(0, σ_S²), the released count c̃_j
    standing in for c_j, the noise term's share of the denominator grows as c̃_j shrinks, so a
    rarely rated item's bias is pulled to the baseline in proportion to its noise. τ_b is
    ``prior_std`` (default: the config's, :func:`item_bias_prior` gives the run's). Post-processing
    of the released S̃ and c̃ only.
    """
    tau = config.item_bias_prior_std if prior_std is None else prior_std
    counts = np.maximum(counts, 1.0)
    noise_pseudo_count = noise_std**2 / (counts * tau**2)
    return noisy_sums / (counts + config.item_bias_shrinkage + noise_pseudo_count)


def item_bias_prior(config: DPALSConfig, users: float | None) -> float:
    """The run's bias prior std τ_b (defaults rule 13): with ``item_bias_prior_by_users``,
    min(Γ_b, τ·(Ñ/1000)^{1/4}) for the released user count Ñ (``users``, floored at three of its
    noise stds as the mean's ratio is); else the config's τ. The more users, the more raters an
    item's bias sum has against the same noise, and the weaker the prior it needs. Post-processing
    of a released count and public settings."""
    if not config.item_bias_prior_by_users:
        return config.item_bias_prior_std
    if users is None:
        raise ValueError("item_bias_prior_by_users needs the user count that mean_mode 'dp_user' releases")
    floored = max(users, 3.0 * config.noise_multipliers()["mean"])
    return float(min(config.clip_bias, config.item_bias_prior_std * (floored / PRIOR_REFERENCE_USERS) ** 0.25))


def _item_biases(
    statistic: Callable[[float], np.ndarray], n_items: int, mean: float, counts: np.ndarray, config: DPALSConfig,
    releaser: GaussianReleaser, prior_std: float | None,
) -> np.ndarray:
    """The DP item-bias release (zeros, and no release, when ``item_bias`` is off or ``prior_std`` is None),
    shrunk with prior std ``prior_std``."""
    if not config.item_bias or prior_std is None:
        return np.zeros(n_items)
    sensitivity = math.sqrt(config.contribution_bound) * config.clip_bias
    multiplier = config.noise_multipliers()["bias"]
    noisy = releaser.vector("item_bias_sums", statistic(mean), sensitivity, multiplier)
    return shrink_item_biases(noisy, counts, sensitivity * multiplier, config, prior_std)


def with_bias_prior_used(config: DPALSConfig, prior_std: float | None) -> DPALSConfig:
    """``config`` as the run is published: with ``item_bias_prior_by_users`` consumed into the prior std
    τ_b it gave (as :func:`apply_bound_laws` consumes its knobs), so the published config holds the
    prior the biases were shrunk with; ``config`` itself without that law or without biases."""
    if prior_std is None or not config.item_bias_prior_by_users:
        return config
    return replace(config, item_bias_prior_std=prior_std, item_bias_prior_by_users=False)


def bound_contributions(ratings: Ratings, config: DPALSConfig, public: PublicState,
                        keyed: KeyedRandomness | SamplingKeys, by_item: str = "plan") -> BoundedData:
    """Algorithm 3 step 4: centre and clip on frequent items, then bound each user's contribution.
    ``by_item``: "plan" lays the bounded ratings out as the item plan; "entries" keeps them as
    :class:`ItemEntries` (the item plan left empty) for a cluster to move by item block."""
    if by_item not in ("plan", "entries"):
        raise ValueError("by_item is 'plan' or 'entries'")
    f_rows, f_cols, on_frequent = _frequent_entries(ratings, public)
    n_frequent = len(public.frequent)
    keys = rating_keys(ratings, keyed, 1, f_rows, f_cols, public.frequent)
    kept, weights = _bound_contributions(f_rows, f_cols, public.item_counts[public.frequent], config, keys,
                                         secondary_shares(public.item_counts, public.frequent, config))
    del keys
    f_vals = _frequent_values(ratings, config, public, on_frequent, f_rows)
    del on_frequent
    kept_weights = None if weights is None else weights[kept]
    del weights
    kept_cols = f_cols[kept]
    recount_statistic = count_statistic(kept_cols, kept_weights, n_frequent, config.contribution_bound)
    # the item plan first (its sort's temporaries), then the user plan: the two never peak together
    entries = _item_entries(f_rows[kept], kept_cols, f_vals[kept], kept_weights, n_frequent)
    del kept, kept_cols, kept_weights
    item_plan = entries.plan(ratings.n_users) if by_item == "plan" else _EMPTY_PLAN
    if by_item == "plan":
        del entries  # before the user plan: the two layouts' temporaries never peak together
    if config.user_cg_steps:  # the CG user solves read the targets in float32 only (same solutions, half the bytes)
        f_vals = f_vals.astype(np.float32)
    return BoundedData(
        user_plan=_plan(f_rows, f_cols, f_vals, None, ratings.n_users, n_frequent, value_dtype=f_vals.dtype.type),
        item_plan=item_plan,
        recount_statistic=recount_statistic,
        item_entries=None if by_item == "plan" else entries,
    )


_EMPTY_PLAN = SolvePlan(n_rows=0, n_cols=0, counts=np.zeros(0, dtype=np.int64), buckets=())


def _frequent_entries(ratings: Ratings, public: PublicState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(user, frequent-item position) of every rating on a frequent item, in CSR order (int32),
    and the mask of those ratings among all of them."""
    position = np.full(ratings.n_items, -1, dtype=np.int32)
    position[public.frequent] = np.arange(len(public.frequent))
    f_cols = position[ratings.csr.indices]
    on_frequent = f_cols >= 0
    rows = np.repeat(np.arange(ratings.n_users, dtype=np.int32), ratings.user_counts())
    return rows[on_frequent], f_cols[on_frequent], on_frequent


def _frequent_values(
    ratings: Ratings, config: DPALSConfig, public: PublicState, on_frequent: np.ndarray, f_rows: np.ndarray
) -> np.ndarray:
    """The centred, clipped values of the ratings on frequent items (CSR order). Computed after
    the contribution bound and with the full-size temporaries freed on return: peak memory."""
    residual = ratings.csr.data - public.global_mean
    residual -= public.item_biases[ratings.csr.indices]
    rows = np.repeat(np.arange(ratings.n_users, dtype=np.int32), ratings.user_counts())
    bias = user_regularisation(config).user_bias(
        np.bincount(rows, weights=residual, minlength=ratings.n_users), ratings.user_counts()
    )
    del rows
    f_vals = residual[on_frequent]
    del residual
    f_vals -= bias[f_rows]
    np.clip(f_vals, -config.clip_rating, config.clip_rating, out=f_vals)
    return np.asarray(f_vals)


def preprocess(ratings: Ratings, config: DPALSConfig, releaser: GaussianReleaser, keyed: KeyedRandomness,
               kept: np.ndarray | None = None) -> Preprocessed:
    """Algorithm 3 (corrected): DP counts, DP mean, frequent items, contribution bound, re-count."""
    public = public_preprocessing(ratings, config, releaser, keyed, kept)
    bounded = bound_contributions(ratings, config, public, keyed)
    return Preprocessed(
        global_mean=public.global_mean,
        item_counts=public.item_counts,
        frequent=public.frequent,
        recounts=release_recounts(bounded.recount_statistic, config, releaser),
        item_biases=public.item_biases,
        user_plan=bounded.user_plan,
        item_plan=bounded.item_plan,
        item_bias_prior=public.item_bias_prior,
    )


def _global_mean(total: float, count: float, config: DPALSConfig, releaser: GaussianReleaser) -> tuple[float, float | None]:
    """(the released global mean, the released user count Ñ where the mean mode releases one, else None)."""
    if config.mean_mode == "public":
        return (config.midpoint if config.public_mean is None else float(config.public_mean)), None
    if config.mean_mode == "dp_user":
        return _user_level_mean(total, count, config, releaser)
    k, h = config.contribution_bound, config.half_range
    z = config.noise_multipliers()["mean"]
    noisy_total = float(releaser.vector("mean_sum", np.array(total), k * h, z))
    noisy_count = float(releaser.vector("mean_count", np.array(count), float(k), z))
    lo, hi = config.rating_range
    return float(np.clip(config.midpoint + noisy_total / max(noisy_count, 1.0), lo, hi)), None


def _user_level_mean(total: float, count: float, config: DPALSConfig, releaser: GaussianReleaser) -> tuple[float, float]:
    """(mid + clip(S̃ / max(Ñ, 3σ_N), ±MEAN_INTERIOR·h), Ñ): the mean of the users' own mean ratings
    (sensitivities h and 1, so its noise does not grow with k), and the released user count. The
    count's floor at three of its noise stds keeps a near-zero or negative noisy count from blowing
    the ratio up, and the clip keeps the released mean inside the scale's interior whatever the noise."""
    h = config.half_range
    z = config.noise_multipliers()["mean"]
    noisy_total = float(releaser.vector("user_mean_sum", np.array(total), h, z))
    noisy_count = float(releaser.vector("user_count", np.array(count), 1.0, z))
    offset = noisy_total / max(noisy_count, 3.0 * z)
    return config.midpoint + float(np.clip(offset, -MEAN_INTERIOR * h, MEAN_INTERIOR * h)), noisy_count


def _bound_contributions(
    rows: np.ndarray, cols: np.ndarray, counts: np.ndarray, config: DPALSConfig, uniforms: KeysOf,
    shares: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(mask of kept ratings, weights or None): per-user bound k, or weights with Σ c² <= B.
    ``uniforms(start, stop)``: the keyed sampling keys of entries [start, stop) (O(chunk) memory);
    ``shares``: the weights' s_j per trained item (:func:`adaptive_weights`; None: all 1)."""
    k = config.contribution_bound
    if config.contribution_mode == "uniform":
        return lowest_k_per_row(rows, uniforms, k), None
    if config.contribution_mode == "tail":
        # the k least frequent items of each user (ties broken at random)
        top = 1.0 + counts.max()

        def keys(start: int, stop: int) -> np.ndarray:
            return np.asarray(counts[cols[start:stop]] + 0.5 * uniforms(start, stop) / top)

        return lowest_k_per_row(rows, keys, k), None
    weights = adaptive_weights(rows, counts[cols], float(k), config.weight_exponent,
                               None if shares is None else shares[cols])
    return np.ones(len(rows), dtype=bool), weights


def _plan(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, weights: np.ndarray | None, n_users: int,
          n_items: int, value_dtype: type = np.float64) -> SolvePlan:
    """The user plan: the entries laid out by user (CSR)."""
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n_users))])
    if _sorted_pairs(rows, cols):  # entries in CSR order already are: no sort, no copies
        return make_plan(indptr, cols, vals, n_items, weights, value_dtype)
    order = sort_pairs(rows, cols)
    w = None if weights is None else weights[order]
    cols, vals = cols[order], vals[order]
    del order  # before the buckets are filled: peak memory
    return make_plan(indptr, cols, vals, n_items, w, value_dtype)


def _item_entries(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, weights: np.ndarray | None,
                  n_items: int) -> ItemEntries:
    """The entries by item (CSC), users ascending within an item."""
    indptr = np.concatenate([[0], np.cumsum(np.bincount(cols, minlength=n_items))])
    order = sort_pairs(cols, rows)
    return ItemEntries(indptr=indptr, users=rows[order], values=vals[order],
                       weights=None if weights is None else weights[order])


def _sorted_pairs(major: np.ndarray, minor: np.ndarray) -> bool:
    """Whether the (major, minor) pairs are in strictly increasing order."""
    if len(major) < 2:
        return True
    step = np.diff(major)
    return bool(np.all((step > 0) | ((step == 0) & (minor[1:] > minor[:-1]))))


# ---------------------------------------------------------------------------- training
@dataclass(frozen=True)
class PublicItemTerms:
    """Exact terms from public data added to the trained items' systems (DP-CMF, app.core.mf.dpcmf):

        v_j = (Π_PSD(Ã_j) + λ0 K̃ + grams_j + shared + λ r_j I)⁻¹ (b̃_j + rhs_j).

    Computed from public data and already released quantities only (post-processing), so they
    change no release and no event. ``grams`` and ``shared`` must be PSD (sums of outer products).
    """

    grams: np.ndarray  # (n_frequent, r, r)
    rhs: np.ndarray  # (n_frequent, r)
    shared: np.ndarray | None = None  # (r, r), added to every trained item


PublicTermsHook = Callable[[PublicState, np.ndarray], "PublicItemTerms | None"]


_ReleasedChunk = tuple[np.ndarray, np.ndarray, np.ndarray]  # (trained-item positions, Ã_j, b̃_j)


@dataclass(frozen=True)
class ItemReleases:
    """One item step's releases {Ã_j}, {b̃_j} and solves, for any block of trained items: the public
    inputs (the trained items' catalogue positions and re-counts, their ridges, the released gravity
    term λ0·Π_PSD(K̃), the filter's κ, the data-free PSD shift, the pooling strength ψ) and both
    releases' grids and noise keys. Item j's noise comes from its own stream, keyed by the release
    and its catalogue position, so any block on any worker draws the same numbers (docs/algorithms.md
    §7). The keys are secret (their repr says so): a cluster's workers hold them only over its TLS,
    beside the private statistics they noise. The releases themselves are recorded by the driver's
    releaser (:func:`_item_releases`)."""

    frequent: np.ndarray
    recounts: np.ndarray
    ridge: np.ndarray
    gravity: np.ndarray | None
    kappa: float
    shift: float
    pooling: float
    grid_gram: GridGaussian
    gram_noise: NoiseKey
    grid_linear: GridGaussian
    linear_noise: NoiseKey

    def release(self, items: np.ndarray, gram: np.ndarray, b: np.ndarray) -> _ReleasedChunk:
        """(items, Ã_j, b̃_j) of the trained items ``items`` from their exact statistics: ``gram``
        (upper triangles read) is noised in place; the lower ones are mirrored where pooling or the
        filter reads them."""
        positions = self.frequent[items]  # catalogue positions: the noise's public index
        mirror = self.pooling > 0 or self.kappa > 0
        gram = self.grid_gram.release_symmetric(self.gram_noise.at(positions), gram, out=gram, mirror=mirror)
        return items, gram, self.grid_linear.release(self.linear_noise.at(positions), b)

    def grid_sum(self, released: _ReleasedChunk) -> np.ndarray:
        """Σ_j Ã_j over the block in units of the release's grid (int64): the released Grams are
        multiples of the grid, so the blocks' sums add up exactly in any blocking (§7)."""
        return np.asarray(np.rint(released[1] / self.grid_gram.grid).astype(np.int64).sum(axis=0))

    def pool(self, grid_sum: np.ndarray) -> tuple[np.ndarray, float]:
        """(Ā, c*) of :func:`pooled_gram` from every block's :meth:`grid_sum`, summed."""
        return pooled_from_sum(np.asarray(grid_sum).astype(np.float64) * self.grid_gram.grid, self.recounts,
                               self.grid_gram.std)

    def solve(self, released: _ReleasedChunk, public: PublicItemTerms | None = None,
              pool: tuple[np.ndarray, float] | None = None) -> np.ndarray:
        """The block's item factors (:func:`_solve_projected`); with ``pool`` = (Ā, c*) its Grams
        are first shrunk towards the pooled one (:func:`pool_item_grams`) and the PSD shift with
        them. ``public``: the block's rows of the public terms."""
        items, gram, b = released
        shifts: float | np.ndarray = self.shift
        if pool is not None:
            gram, weights = pool_item_grams(gram, self.recounts[items], *pool, self.pooling)
            shifts = self.shift * weights[:, None]  # the noise left in Â_j is w_j times Ã_j's
        return _solve_projected(gram, b, self.ridge[items], self.gravity, public, self.kappa, shifts)


@dataclass(frozen=True)
class ItemSource:
    """Where one item step's exact statistics come from: units of work owning disjoint trained
    items (``chunks``), each one's (trained-item positions, Σ c x xᵀ upper triangles, Σ c M x) by
    ``statistics``, and K = Σ u uᵀ by ``gravity`` (called only when λ0 > 0). In process
    (:func:`local_item_source`): the item plan's buckets over the local U. A distributed driver:
    any blocks of items, each statistic reduced over the user partitions (:func:`item_statistics`,
    :func:`gravity_statistic`, :func:`reduce_exact`): the same numbers, so the same releases.

    ``solve``, where given, releases and solves every block itself (a cluster: each block's noise
    drawn and its systems solved on the worker that holds its complete statistics, only V
    travelling back) and returns the trained items' factors; ``chunks`` and ``statistics`` are then
    unused."""

    chunks: list[Any]
    statistics: Callable[[Any], tuple[np.ndarray, np.ndarray, np.ndarray]]
    gravity: Callable[[], np.ndarray]
    solve: Callable[[ItemReleases, PublicItemTerms | None], np.ndarray] | None = None


def local_item_source(plan: SolvePlan, padded: np.ndarray, config: DPALSConfig) -> ItemSource:
    """The in-process :class:`ItemSource`: ``padded`` holds the clipped user factors and a trailing
    zero row (clipped by :func:`_clip_rows_in_place`); the plan's buckets, then the items without
    data in blocks."""
    factors = quantised_factors(padded, config.clip_user, weighted=any(b.sqrt_weights is not None for b in plan.buckets))
    return ItemSource(
        chunks=list(_item_chunks(plan)),
        statistics=lambda chunk: _chunk_statistics(chunk, factors, config.rank, plan.counts, config.clip_rating),
        gravity=lambda: gravity_statistic(factors),
    )


def _item_step(
    frequent: np.ndarray,
    recounts: np.ndarray,
    source: ItemSource,
    config: DPALSConfig,
    releaser: GaussianReleaser,
    public: PublicItemTerms | None = None,
) -> np.ndarray:
    """One private item step: noisy K̃, {Ã_j}, {b̃_j}; PSD projection; ridge solves.

    ``frequent``: the trained items' catalogue positions; ``recounts`` their released re-counts;
    ``source``: the exact statistics (:class:`ItemSource`).

    ``public`` adds exact public terms after the projection (their sum stays PSD); the noise and
    its draw order do not depend on it.
    """
    step = _item_releases(frequent, recounts, source, config, releaser)
    if source.solve is not None:
        return source.solve(step, public)
    return _solve_items(source, step, public, releaser, config.rank)


def _item_releases(frequent: np.ndarray, recounts: np.ndarray, source: ItemSource, config: DPALSConfig,
                   releaser: GaussianReleaser) -> ItemReleases:
    """The step's gravity release K̃ (where λ0 > 0), then the records of {Ã_j} and {b̃_j}: one
    release each over all trained items, its noise drawn block by block wherever each block's
    statistics are complete (items with no selected rating included), from streams keyed by the
    release and the item's catalogue position (the same draws in any blocking: docs/algorithms.md §7)."""
    rank, z = config.rank, config.noise_multipliers()
    gamma_u, gamma_m, sqrt_b = config.clip_user, config.clip_rating, math.sqrt(config.contribution_bound)
    n_items = len(frequent)
    gravity = None
    if config.reg_gravity > 0:
        k_noisy = releaser.symmetric("gravity_gram", source.gravity(), gamma_u**2, z["gravity"])
        eigval, eigvec = project_psd(k_noisy)
        gravity = config.reg_gravity * (eigvec * eigval) @ eigvec.T
    # items whose statistics one user can change (rounding bound): k when sampling, all otherwise
    bound = n_items if config.contribution_mode == "adaptive_weights" else min(config.contribution_bound, n_items)
    grid_gram = releaser.record_grid("item_grams", sqrt_b * gamma_u**2, z["gram"], bound * rank * (rank + 1) // 2)
    gram_noise = releaser.noise_key()
    grid_linear = releaser.record_grid("item_linear", sqrt_b * gamma_u * gamma_m, z["linear"], bound * rank)
    linear_noise = releaser.noise_key()
    return ItemReleases(
        frequent=frequent, recounts=recounts, ridge=config.reg_item * item_ridge_weights(recounts, config.item_reg_exponent),
        gravity=gravity, kappa=config.noise_filter * grid_linear.std**2 / gamma_m**2,
        shift=PSD_SHIFT * noise_edge(grid_gram.std, rank),  # data-independent
        pooling=config.gram_pooling, grid_gram=grid_gram, gram_noise=gram_noise, grid_linear=grid_linear,
        linear_noise=linear_noise)


def _solve_items(source: ItemSource, step: ItemReleases, public: PublicItemTerms | None,
                 releaser: GaussianReleaser, rank: int) -> np.ndarray:
    """The step in this process: each chunk's statistics formed, released and solved on the solver
    threads (chunks own disjoint items), memory O(chunk · r²); with pooling every Ã_j first, since
    Ā needs them all (O(n_frequent · r²))."""
    item_factors = np.empty((len(step.frequent), rank))

    def release_chunk(chunk: Any) -> _ReleasedChunk:
        items, gram, b = step.release(*source.statistics(chunk))
        releaser.observe("item_grams", items, gram)  # a no-op outside the test-only audit tap
        releaser.observe("item_linear", items, b)
        return items, gram, b

    def solve(released: _ReleasedChunk, pool: tuple[np.ndarray, float] | None = None) -> None:
        item_factors[released[0]] = step.solve(released, _rows_of(public, released[0]), pool)

    if step.pooling == 0:
        parallel_map(lambda chunk: solve(release_chunk(chunk)), source.chunks)
        return item_factors
    released_chunks = parallel_map(release_chunk, source.chunks)
    pool = step.pool(np.sum([step.grid_sum(released) for released in released_chunks], axis=0))
    parallel_map(lambda released: solve(released, pool), released_chunks)
    return item_factors




def pooled_gram(grams: list[np.ndarray], recounts: np.ndarray, noise_std: float,
                grid: float | None = None) -> tuple[np.ndarray, float]:
    """(Ā, c*): the pooled Gram per unit of contribution weight, Ā = Σ_j Ã_j / Σ_j c̃_j over all
    trained items, and c* = σ_A / (tr Ā / r), the weight at which an item's Gram signal per entry
    (≈ c_j · tr Ā / r) equals the release's noise std σ_A.

    Ã_j and the recounts c̃_j (the same weights c_ij, ``item_recounts``) are released; σ_A is public:
    post-processing. The sum's noise is √n_frequent · σ_A per entry against Σ_j c_j of signal, so Ā
    is far less noisy than any single Ã_j. c* = 0 (no pooling) if tr Ā is not positive.
    """
    if grid is None:
        total = np.sum([gram.sum(axis=0) for gram in grams], axis=0)
    else:  # released grams are multiples of the grid: summed as integers, the same in any chunking (§7)
        counts = np.sum([np.rint(gram / grid).astype(np.int64).sum(axis=0) for gram in grams], axis=0)
        total = counts.astype(np.float64) * grid
    return pooled_from_sum(total, recounts, noise_std)


def pooled_from_sum(total: np.ndarray, recounts: np.ndarray, noise_std: float) -> tuple[np.ndarray, float]:
    """:func:`pooled_gram` from Σ_j Ã_j, already summed (over a cluster's blocks, say)."""
    mean_gram = total / max(float(recounts.sum()), 1.0)
    per_entry = float(np.trace(mean_gram)) / mean_gram.shape[0]
    return mean_gram, (noise_std / per_entry if per_entry > 0 else 0.0)


def pool_item_grams(
    grams: np.ndarray, recounts: np.ndarray, mean_gram: np.ndarray, scale: float, strength: float
) -> tuple[np.ndarray, np.ndarray]:
    """(Â_j, w_j): Â_j = w_j Ã_j + (1 − w_j) c̃_j Ā with w_j = c̃_j / (c̃_j + ψ c*), ψ = ``strength``.

    Empirical-Bayes shrinkage of each noisy Gram towards the pooled one scaled by the item's own
    weight (the users who rate item j taken as a sample of all users, Ā from :func:`pooled_gram`):
    an item whose Gram signal is below the noise (c̃_j ≪ c*) takes the pooled Gram, a heavily rated
    one keeps its own. Post-processing of released Ã_j, c̃_j and Ā. ``grams`` is not modified.
    """
    weights = recounts / (recounts + strength * scale) if scale > 0 else np.ones(len(recounts))
    pooled = grams * weights[:, None, None] + ((1.0 - weights) * recounts)[:, None, None] * mean_gram
    return pooled, weights


def _clip_rows_in_place(x: np.ndarray, bound: float) -> None:
    """x ← clip(x, bound) row by row (``clip_rows``, value for value), block by block: each row's
    norm is the same either way, and no temporary of x's size is made."""
    for start in range(0, x.shape[0], _NORM_BLOCK_ROWS):
        block = x[start : start + _NORM_BLOCK_ROWS]
        block *= clip_scale(np.linalg.norm(block, axis=1), bound)[:, None]


_NORM_BLOCK_ROWS = 8192


def _item_chunks(plan: SolvePlan) -> Iterator[Bucket | np.ndarray]:
    """The plan's buckets, then the items without any selected rating in blocks of 1024."""
    yield from plan.buckets
    empty = np.flatnonzero(plan.counts == 0)
    for start in range(0, len(empty), 1024):
        yield empty[start : start + 1024]


def _chunk_statistics(chunk: Bucket | np.ndarray, factors: QuantisedFactors, rank: int,
                      counts: np.ndarray, target_clip: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(items, Σ c_ij x xᵀ, Σ c_ij M_ij x) of one chunk (zeros for items without data), x = √c_ij·u_i
    quantised within its clip (:func:`app.core.mf.als.bucket_quantised_gram`: exact sums, each
    user's term within the bound the sensitivities assume, targets within Γ_M = ``target_clip``);
    the Grams' upper triangles only (their release reads nothing else). ``counts``: the plan's per
    item."""
    if isinstance(chunk, Bucket):
        return (chunk.rows, *bucket_quantised_gram(chunk, factors, counts[chunk.rows], target_clip))
    return chunk, np.zeros((len(chunk), rank, rank)), np.zeros((len(chunk), rank))


def item_statistics(plan: SolvePlan, padded: np.ndarray | None, config: DPALSConfig, items: tuple[int, int] | None = None,
                    factors: QuantisedFactors | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The item step's exact statistics of a plan's ratings: (Σ_i c_ij x xᵀ as r × r matrices whose
    upper triangles alone are set, the rest zero; Σ_i c_ij M_ij x) for every trained item of ``plan``
    (a bounded item plan, :func:`bound_contributions`: the whole data's, a partition of the users',
    or an item owner's block with every user's ratings of it), ``padded`` its users' clipped factors
    and a zero row; with ``items`` = (lo, hi), for the trained items lo..hi-1 alone (row k is item
    lo + k); ``factors``: :func:`plan_factors` of ``padded``, when already made (``padded`` may then
    be None). Each bucket's sums are written in place: no arrays of its own.

    Partitions' results added in any order (:func:`reduce_exact`) are, bit for bit, the statistics
    of the whole data, which the in-process item step forms chunk by chunk; noise is then drawn per
    item (§7). Each item's sums are its own, so a block of items gives the same bits as the whole,
    and so does a plan holding only some items' ratings, for those items (a cluster's item owner)."""
    rank = config.rank
    lo, hi = (0, plan.n_rows) if items is None else items
    grams, rhs = np.zeros((hi - lo, rank, rank)), np.zeros((hi - lo, rank))
    if factors is None:
        if padded is None:
            raise ValueError("item_statistics needs the users' factors (padded) or their quantised form")
        factors = plan_factors(plan, padded, config)
    for bucket in plan.buckets:
        if items is not None:
            first, last = np.searchsorted(bucket.rows, (lo, hi))  # a bucket's rows ascend (make_plan)
            if first == last:
                continue
            bucket = _sub_bucket(bucket, slice(int(first), int(last)))
        bucket_quantised_gram(bucket, factors, plan.counts[bucket.rows], config.clip_rating,
                              out=(grams, rhs, bucket.rows - lo))
    return grams, rhs


def plan_factors(plan: SolvePlan, padded: np.ndarray, config: DPALSConfig) -> QuantisedFactors:
    """The users' clipped factors as :func:`item_statistics` reads them (quantised once for an
    unweighted plan)."""
    return quantised_factors(padded, config.clip_user, weighted=any(b.sqrt_weights is not None for b in plan.buckets))


def _sub_bucket(bucket: Bucket, inside: np.ndarray | slice) -> Bucket:
    """The bucket's rows ``inside`` (a mask, or a slice: views, no copies)."""
    weights = None if bucket.sqrt_weights is None else bucket.sqrt_weights[inside]
    return Bucket(rows=bucket.rows[inside], cols=bucket.cols[inside], values=bucket.values[inside],
                  sqrt_weights=weights)


def reduce_exact(parts: Iterable[Any]) -> Any:
    """Σ of the partitions' exact statistics (arrays, floats or tuples of them, elementwise): each
    is an integer multiple of a public power of two within the fixed-point capacity, so every
    partial sum is exact and the result does not depend on the partitions or their order."""
    parts = list(parts)
    if isinstance(parts[0], tuple):
        return tuple(reduce_exact(column) for column in zip(*parts, strict=True))
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def gravity_statistic(factors: QuantisedFactors) -> np.ndarray:
    """K = Σ_i x_i x_iᵀ over the quantised clipped user factors (symmetric; the release reads the
    upper triangle): each x_i within Γ_u (``quantise_table``), the sum exact in any order
    (``exact_upper_gram_and_rhs``: one group of all users), so ‖x xᵀ‖_F <= Γ_u² holds for the
    terms summed. ``factors.table`` carries U and a trailing zero row."""
    if factors.integers is not None:
        integers = factors.integers
    elif factors.table is not None:
        integers = quantise_table(factors.table, factors.clip)
    else:
        raise ValueError("the factors hold neither a table nor its integers")
    rows = integers[None, :-1]
    n_users = rows.shape[1]
    gram, _ = exact_upper_gram_and_rhs(rows, np.zeros((1, n_users), dtype=np.int64), np.array([n_users]),
                                       gram_quantum(factors.clip), 1.0)
    upper = np.triu(gram[0])
    return np.asarray(upper + np.triu(upper, 1).T)


def _rows_of(public: PublicItemTerms | None, items: np.ndarray) -> PublicItemTerms | None:
    if public is None:
        return None
    return PublicItemTerms(public.grams[items], public.rhs[items], public.shared)


def _solve_projected(
    grams: np.ndarray,
    rhs: np.ndarray,
    ridge: np.ndarray,
    gravity: np.ndarray | None,
    public: PublicItemTerms | None = None,
    kappa: float = 0.0,
    shift: float | np.ndarray = 0.0,
) -> np.ndarray:
    """v_j = (Π_PSD(Ã_j + s I) + λ0 K̃ [+ public grams] + λ r_j I)⁻¹ (b̃_j [+ public rhs]) for a batch.

    s = ``shift`` (a scalar, or one per item shaped (n, 1)) is data-independent or a function of
    released quantities; the projection runs only where Ã_j + s I has no Cholesky factor
    (post-processing: see :func:`app.core.mf.linalg.solve_noisy_systems`). With the noise
    filter on (κ > 0) the filter needs every Π_PSD(Ã_j)'s eigenbasis: :func:`_solve_filtered`,
    unshifted, as before."""
    if kappa > 0:
        return _solve_filtered(grams, rhs, ridge, gravity, public, kappa)
    extra = gravity
    if public is not None:
        extra = public.grams if extra is None else public.grams + extra
        if public.shared is not None:
            extra = extra + public.shared
        rhs = rhs + public.rhs
    return solve_noisy_systems(grams, rhs, ridge, extra, shift)[0]


def _solve_filtered(
    grams: np.ndarray,
    rhs: np.ndarray,
    ridge: np.ndarray,
    gravity: np.ndarray | None,
    public: PublicItemTerms | None,
    kappa: float,
) -> np.ndarray:
    """v_j = (Π_PSD(Ã_j) + λ0 K̃ [+ public grams] + λ r_j I)⁻¹ (b̃_j [+ public rhs]) for a batch,
    the private terms first passed through the noise filter :func:`wiener_filter` (κ > 0)."""
    eigval, eigvec = project_psd(grams)
    eigval, rhs = wiener_filter(eigval, eigvec, rhs, kappa)
    if gravity is None and public is None:
        proj = np.einsum("nji,nj->ni", eigvec, rhs)
        return np.asarray(np.einsum("nij,nj->ni", eigvec, proj / (eigval + ridge[:, None])))
    system = np.matmul(eigvec * eigval[:, None, :], np.swapaxes(eigvec, 1, 2))
    if gravity is not None:
        system += gravity
    if public is not None:
        system += public.grams
        rhs = rhs + public.rhs
        if public.shared is not None:
            system += public.shared
    add_to_diagonal(system, ridge[:, None])
    return np.linalg.solve(system, rhs[:, :, None])[:, :, 0]


def wiener_filter(
    eigval: np.ndarray, eigvec: np.ndarray, rhs: np.ndarray, kappa: float
) -> tuple[np.ndarray, np.ndarray]:
    """Noise-aware attenuation of the projected private system (a, Q) and right-hand side b̃.

    Model b̃ = A v + e + n with data noise e ~ N(0, σ_r² A) and release noise n ~ N(0, σ_b² I).
    In A's eigenbasis the observation along q_k carries precision a_k² / (σ_r² a_k + σ_b²), so the
    posterior of v combines (after scaling by σ_r²) the private system Q diag(a_k w_k) Qᵀ and the
    right-hand side Q diag(w_k) Qᵀ b̃, with w_k = a_k / (a_k + κ), κ = σ_b² / σ_r². Directions whose
    Gram mass is below κ are noise-dominated and fade out instead of growing to b̃ / λ: a rarely
    rated item's vector goes to the baseline (0) in proportion to its noise. Post-processing of the
    released Ã_j and b̃_j with public constants, so free.
    """
    weights = np.divide(eigval, eigval + kappa, out=np.zeros_like(eigval), where=eigval > 0)
    projected = np.einsum("nji,nj->ni", eigvec, rhs) * weights
    return eigval * weights, np.einsum("nij,nj->ni", eigvec, projected)


def _user_step(
    prep: Preprocessed,
    item_factors: np.ndarray,
    config: DPALSConfig,
    user_reg: UserRegularisation,
    start: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """User solves from all of each user's frequent ratings (privileged, never released), into
    ``out`` when given (a zeroed float64 (n_users, rank) array).

    Exact ridge solves, or ``user_cg_steps`` conjugate-gradient iterations per user from ``start``
    (her previous step's solution; zeros at the first step): O(nnz·r) per iteration instead of
    O(nnz·r² + n·r³) (Takács et al. 2011; ``implicit``'s ALS does the same). Either way u_i depends
    on user i's ratings and the released V's only. Rule 12's secondary items enter as s_j·v_j
    (:func:`secondary_shares`).
    """
    shares = secondary_shares(prep.item_counts, prep.frequent, config)
    if shares is not None:
        item_factors = item_factors * shares[:, None]
    ridge = user_reg.ridge(prep.user_plan.counts)
    shared = config.reg_gravity * item_factors.T @ item_factors if config.reg_gravity else None
    if config.user_cg_steps == 0:
        return solve_side(prep.user_plan, item_factors, ridge, shared, out=out)
    if start is None:
        start = np.zeros((prep.user_plan.n_rows, config.rank), dtype=np.float32)
    return solve_side_cg(prep.user_plan, item_factors, ridge, start, config.user_cg_steps, shared, out=out)


def event_parameters(config: DPALSConfig) -> dict[str, Any]:
    """What gives the run's event its meaning: relation, contribution bound, clipping norms, range."""
    return {
        "algorithm": "dpals",
        "neighbouring_relation": accounting.NEIGHBOURING_RELATION,
        "contribution_bound": config.contribution_bound,
        "contribution_mode": config.contribution_mode,
        "bound_law": None if config.bound_quantile is None else {
            "quantile": config.bound_quantile, "scale": config.bound_scale, "min": config.bound_min},
        "clip_user": config.clip_user,
        "clip_rating": config.clip_rating,
        "rating_range": list(config.rating_range),
        "n_steps": config.n_steps,
        "mean_mode": config.mean_mode,
        "noise_multipliers": config.noise_multipliers(),
    }


def public_config(config: DPALSConfig) -> dict[str, Any]:
    """The config as published: everything but the seed (which would let anyone regenerate the noise)."""
    data = config.to_dict()
    del data["seed"]
    return data


def user_regularisation(config: DPALSConfig) -> UserRegularisation:
    """The privileged user solve of this config (training and fold-in use the same one)."""
    return UserRegularisation(
        config.reg_user, config.user_reg_exponent, config.reg_gravity,
        config.user_bias_shrinkage if config.user_centering else None,
    )


def _validate_for_training(ratings: Ratings, config: DPALSConfig) -> None:
    """An empty matrix is valid (a noise-only model); ratings outside the declared range cannot
    be stored (ingestion checks the data set's fixed range), so this refusal guards callers only."""
    lo, hi = config.rating_range
    data = ratings.csr.data
    if data.size and (data.min() < lo or data.max() > hi):
        raise ValueError(f"ratings fall outside the declared public range [{lo}, {hi}]")


@dataclass(frozen=True)
class DPALSFit:
    """The state a DPALS run ends in: public pre-processing, trained factors and the record."""

    prep: Preprocessed
    item_factors: np.ndarray  # (n_frequent, r), rows follow ``prep.frequent``
    user_reg: UserRegularisation
    event: dp_event.DpEvent
    releaser: GaussianReleaser
    config: DPALSConfig | None = None  # the run's config: k as released when it came from the data


class FitFunction(Protocol):
    """What runs a DPALS fit: :func:`fit_dpals`, or a distributed driver with the same contract."""

    def __call__(self, ratings: Ratings | PartitionedRatings, config: DPALSConfig, *, progress: Progress | None = None,
                 public_terms: PublicTermsHook | None = None, kept_items: np.ndarray | None = None) -> DPALSFit: ...


def fit_dpals(
    ratings: Ratings | PartitionedRatings,
    config: DPALSConfig,
    *,
    progress: Progress | None = None,
    public_terms: PublicTermsHook | None = None,
    kept_items: np.ndarray | None = None,
) -> DPALSFit:
    """Run DPALS; check the releases made against the reserved event. ``kept_items``: the item ids
    the model in force trained (public), kept trained above :func:`kept_floor`.

    ``public_terms(released, V_frequent)``, called before every item step, may return exact public
    terms for that step (DP-CMF). It is handed only released quantities (the DP mean, the DP
    counts, the frequent set and the released V), never the private plans; the noise draws,
    their order and the event are the same with or without it. A :class:`PartitionedRatings` is
    read here, every partition (:func:`app.core.data.partitioned.gather`).
    """
    if isinstance(ratings, PartitionedRatings):
        ratings = gather(ratings)
    _validate_for_training(ratings, config)
    if config.objective == "ranking":
        ratings = positives(ratings, config.threshold)
    keyed = KeyedRandomness(config.seed)  # every draw keyed by the seed and a public index (§7)
    releaser = GaussianReleaser(None, keyed)
    reserved = config
    config = release_contribution_bound(bound_statistic(ratings.user_counts(), config), config, releaser)
    prep = preprocess(ratings, config, releaser, keyed, kept_mask(ratings.item_ids, kept_items))
    user_reg = user_regularisation(config)
    item_factors = keyed.init_generator().normal(0.0, config.init_scale, size=(len(prep.frequent), config.rank))
    released = PublicState(
        global_mean=prep.global_mean, item_counts=prep.item_counts, frequent=prep.frequent, item_biases=prep.item_biases
    )
    user_start = None  # the previous step's unclipped solutions: the CG warm start
    last_releases: deque[np.ndarray] = deque(maxlen=config.average_last)  # the released V's to average
    for step in range(config.n_steps):
        # U and a trailing zero row (the padding target of the item plan's buckets) in one buffer:
        # no second copy of U for the clip or the gather
        padded = np.zeros((prep.user_plan.n_rows + 1, config.rank))
        solved = _user_step(prep, item_factors, config, user_reg, user_start, out=padded[:-1])
        if not (config.user_cg_steps and step + 1 < config.n_steps):
            user_start = None
        elif user_start is None:
            user_start = solved.astype(np.float32)
        else:  # the solve has read the last warm start: overwritten in place, no second float32 U
            user_start[...] = solved
        _clip_rows_in_place(solved, config.clip_user)
        del solved
        public = None if public_terms is None else public_terms(released, item_factors)
        item_factors = _item_step(prep.frequent, prep.recounts, local_item_source(prep.item_plan, padded, config),
                                  config, releaser, public)
        last_releases.append(item_factors)
        del padded
        if progress:
            progress((step + 1) / config.n_steps, f"step {step + 1}/{config.n_steps}")
    item_factors = average_releases(list(last_releases))
    event = checked_event(releaser, reserved, config)
    return DPALSFit(prep=prep, item_factors=item_factors, user_reg=user_reg, event=event, releaser=releaser,
                    config=with_bias_prior_used(config, prep.item_bias_prior))


def checked_event(releaser: GaussianReleaser, reserved: DPALSConfig, executed: DPALSConfig) -> dp_event.DpEvent:
    """The reserved event (of ``reserved``, the config the run was charged for), once the releases
    made are checked: they must be exactly ``executed``'s event (the config after the released B's
    laws), and that must be the same Gaussian composition as the reserved one (the step law,
    :func:`apply_step_law`). Either check failing is a bug: the run fails closed, charged."""
    made = releaser.event(executed.n_steps, 3 if executed.reg_gravity > 0 else 2)
    event = dpals_event(reserved)
    if made != dpals_event(executed) or not (made == event or accounting.same_gaussian_composition(made, event)):
        raise RuntimeError("the releases made differ from the reserved privacy event")
    return event


def average_releases(item_factors: list[np.ndarray]) -> np.ndarray:
    """The published V: the mean of the last ``average_last`` steps' released V_t (Polyak-style
    averaging: each step's release noise is independent, so m steps' mean carries ≈ 1/√m of it
    once the signal has settled). Each V_t is a released output of a charged step (the event
    composes all T of them), so any function of them is post-processing: no release, no cost.
    One V is returned as is."""
    if len(item_factors) == 1:
        return item_factors[0]
    return np.asarray(np.mean(item_factors, axis=0))


def train_dpals(
    ratings: Ratings | PartitionedRatings,
    config: DPALSConfig,
    *,
    progress: Progress | None = None,
    fit: FitFunction = fit_dpals,
    kept_items: np.ndarray | None = None,
) -> PublicModel:
    """Train DPALS and return the public model whose ``event`` accounts for every release.

    Every random draw is keyed by ``config.seed`` and a public index (docs/algorithms.md §7).
    ``fit`` runs it: in process, or on a cluster (:func:`app.core.mf.distributed.distributed_fit`).
    ``kept_items``: the model in force's trained item ids (:func:`fit_dpals`).
    """
    return public_model(ratings, config, fit(ratings, config, progress=progress, kept_items=kept_items))


def public_model(ratings: Ratings | PartitionedRatings, config: DPALSConfig, fit: DPALSFit) -> PublicModel:
    """The published model of a run: V on the frequent items (zero elsewhere), DP mean and counts.
    ``config`` is the requested one; the run's own (``fit.config``: k as released) is published."""
    config = fit.config or config
    prep, item_factors, user_reg, event, releaser = fit.prep, fit.item_factors, fit.user_reg, fit.event, fit.releaser
    full = np.zeros((ratings.n_items, config.rank))
    full[prep.frequent] = item_factors
    trained = np.zeros(ratings.n_items, dtype=bool)
    trained[prep.frequent] = True
    return PublicModel(
        algorithm="dpals",
        item_ids=ratings.item_ids,
        item_factors=full,
        trained_mask=trained,
        item_counts=prep.item_counts,
        global_mean=prep.global_mean,
        item_biases=prep.item_biases + popularity_prior(prep.item_counts, config),
        user_reg=user_reg,
        config=public_config(config),
        event=event,
        metadata={
            "private": True,
            **event_parameters(config),
            "dp_accounting_version": accounting.DP_ACCOUNTING_VERSION,
            "releases": [
                {"name": n, "l2_sensitivity": s, "noise_multiplier": m} for n, s, m in releaser.releases
            ],
        },
    )
