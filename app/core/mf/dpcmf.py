"""DP-CMF: DPALS with public item data (Curmei, Krichene, Zhang & Sundararajan 2023, arXiv:2309.11516;
docs/algorithms.md §3).

Collective factorisation of the private ratings M ≈ UVᵀ and a public matrix S ≈ WVᵀ whose rows are
"fictitious users" (feature tokens, neighbour lists, opted-in public users), with V shared:

    L = Σ_Ω c_ij (M_ij − u_i·v_j)² + λ Σ_j r_j‖v_j‖² + ... (DPALS loss, arXiv:2107.09802 Eq. 35)
        + Σ_s α_s [ Σ_{(f,j)∈Ω_s} (S_fj − w_f·v_j)² + w0_F Σ_{f∈s, all j} (w_f·v_j)² ] + λ_F‖W‖²

(arXiv:2309.11516 Eq. 1; the w0_F term is the implicit-ALS unobserved weight of Remark 3.1, Hu et al. 2008).

Steps (paper Algorithm 1; ALS updates eqs. (2)-(3)):

* user step: exactly DPALS's privileged solve (features never touch it);
* feature step, for every public row f of source s (exact, from public S and the released V):
      w_f = (Σ_{j∈Ω_f} v_j v_jᵀ + w0_F VᵀV + (λ_F/α_s) I)⁻¹ Σ_{j∈Ω_f} S_fj v_j
  (the normal equations of L in w_f, divided by α_s);
* item step for the DPALS-trained (frequent) items:
      v_j = (Π_PSD(Ã_j) + λ0 K̃ + B_j + G + λ r_j I)⁻¹ (b̃_j + d_j),
      B_j = Σ_s α_s Σ_{f∈s: (f,j)∈Ω_s} w_f w_fᵀ,  d_j = Σ_s α_s Σ_f S_fj w_f,  G = w0_F Σ_s α_s W_sᵀW_s.
  Ã_j, b̃_j, K̃ are DPALS's releases, noised exactly as there (same draws, same order); B_j and G
  are sums of outer products, hence PSD, and are added after the projection;
* item step for the other items (not in the DP frequent set: tail and cold-start items):
      v_j = (B_j + G + λ_F I)⁻¹ d_j         (only the public half of L; post-processing)
  Items with neither private training nor public data keep v_j = 0 and stay untrained.

Privacy (paper Proposition 3.1): W, B_j, d_j, G and the tail items' V are functions of public
data and of releases already charged (V, m̃, the frequent set), so by post-processing the run's
event is DPALS's event for the same config, whatever the public data and α. Public users' ratings
must be removed from the private ``Ratings`` before training (:func:`split_public_users`): then
no private statistic (counts, mean, Grams) contains them. With every α = 0 (or no public data)
the run is DPALS bit for bit.

Implicit feedback (``implicit=True``): iALS unobserved weights on both halves. The private one is
w0·UᵀU, which is DPALS's gravity term λ0·K̃ (``reg_gravity`` = w0, released with noise and PSD
projection, charged in the event); the public one is ``public_unobserved_weight`` = w0_F (exact),
applied to every source. Categorical metadata uses w0_F in both variants (Remark 3.1); public
ratings and similarity scores use it only in the implicit variant.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import scipy.sparse as sp
from dp_accounting import dp_event
from numpy.typing import ArrayLike

from app.core.data.partitioned import PartitionedRatings
from app.core.data.ratings import Ratings
from app.core.mf import dpals
from app.core.mf.als import SolvePlan, iter_grams, make_plan, solve_side
from app.core.mf.model import PublicModel

__all__ = [
    "PUBLIC_SOURCES",
    "PublicSource",
    "PublicData",
    "DPCMFConfig",
    "metadata_source",
    "similarity_source",
    "split_public_users",
    "dpcmf_event",
    "calibrate",
    "public_config",
    "event_parameters",
    "train_dpcmf",
]

PUBLIC_SOURCES = ("metadata", "similarities", "public_users")


# ---------------------------------------------------------------------------- public data
@dataclass(frozen=True)
class PublicSource:
    """One public matrix S (rows = tokens, neighbour lists or public users; columns = items).

    Columns are aligned with the ratings' ``item_ids``; stored entries are the observed S_fj.
    """

    name: str
    matrix: sp.csr_matrix
    row_labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.name not in PUBLIC_SOURCES:
            raise ValueError(f"unknown public source {self.name!r}; known: {PUBLIC_SOURCES}")
        if not sp.issparse(self.matrix) or self.matrix.ndim != 2:
            raise ValueError(f"public source {self.name!r}: matrix must be a 2-d scipy sparse matrix")
        matrix = sp.csr_matrix(self.matrix, dtype=np.float64, copy=True)
        matrix.sum_duplicates()
        matrix.sort_indices()
        if not np.all(np.isfinite(matrix.data)):
            raise ValueError(f"public source {self.name!r} contains NaN or infinite values")
        labels = tuple(str(x) for x in self.row_labels)
        if labels and len(labels) != matrix.shape[0]:
            raise ValueError(f"public source {self.name!r}: {len(labels)} row labels for {matrix.shape[0]} rows")
        object.__setattr__(self, "matrix", matrix)
        object.__setattr__(self, "row_labels", labels)

    @property
    def n_rows(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def n_items(self) -> int:
        return int(self.matrix.shape[1])


@dataclass(frozen=True)
class PublicData:
    """The public sources of one training run (names unique, one item space)."""

    sources: tuple[PublicSource, ...] = ()

    def __post_init__(self) -> None:
        sources = tuple(self.sources)
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            raise ValueError(f"public source names must be unique, got {names}")
        if any(not isinstance(s, PublicSource) for s in sources):
            raise ValueError("public sources must be PublicSource instances")
        if len({s.n_items for s in sources}) > 1:
            raise ValueError(f"public sources disagree on the number of items: {[s.n_items for s in sources]}")
        object.__setattr__(self, "sources", sources)

    def get(self, name: str) -> PublicSource | None:
        return next((s for s in self.sources if s.name == name), None)


def metadata_source(item_tokens: Sequence[Sequence[str]], *, min_items: int = 1) -> PublicSource:
    """Binary S with one row per distinct token (sorted); tokens on fewer than ``min_items`` items dropped.

    ``item_tokens[j]`` are the public tokens (genre, tag, author, ...) of item j.
    """
    if min_items < 1:
        raise ValueError("min_items must be >= 1")
    per_item = [sorted({str(t) for t in tokens}) for tokens in item_tokens]
    counts: dict[str, int] = {}
    for tokens in per_item:
        for t in tokens:
            counts[t] = counts.get(t, 0) + 1
    kept = sorted(t for t, c in counts.items() if c >= min_items)
    row = {t: f for f, t in enumerate(kept)}
    rows = [row[t] for tokens in per_item for t in tokens if t in row]
    cols = [j for j, tokens in enumerate(per_item) for t in tokens if t in row]
    matrix = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(kept), len(per_item)))
    return PublicSource("metadata", matrix, tuple(kept))


def similarity_source(item_idx: ArrayLike, neighbour_idx: ArrayLike, scores: ArrayLike, n_items: int) -> PublicSource:
    """S with one row per item j that has neighbours: S[row(j), k] = score(j, k) (top-K lists).

    The similarities must come from a public source (never from private ratings). Each row acts
    as a fictitious user who likes j's neighbours; to tie j itself to them, list (j, j) too.
    """
    item_idx = np.asarray(item_idx, dtype=np.int64).reshape(-1)
    neighbour_idx = np.asarray(neighbour_idx, dtype=np.int64).reshape(-1)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if not (len(item_idx) == len(neighbour_idx) == len(scores)):
        raise ValueError("item_idx, neighbour_idx and scores differ in length")
    if n_items < 1:
        raise ValueError("n_items must be >= 1")
    for name, idx in (("item_idx", item_idx), ("neighbour_idx", neighbour_idx)):
        if len(idx) and (idx.min() < 0 or idx.max() >= n_items):
            raise ValueError(f"{name} out of range [0, {n_items})")
    if not np.all(np.isfinite(scores)):
        raise ValueError("similarity scores contain NaN or infinite values")
    owners, row_of = np.unique(item_idx, return_inverse=True)
    keys = row_of * n_items + neighbour_idx
    if len(np.unique(keys)) != len(keys):
        raise ValueError("duplicate (item, neighbour) pairs in the similarity lists")
    matrix = sp.csr_matrix((scores, (row_of, neighbour_idx)), shape=(len(owners), n_items))
    return PublicSource("similarities", matrix, tuple(str(j) for j in owners.tolist()))


def split_public_users(ratings: Ratings, public_user_ids: Iterable[Any]) -> tuple[Ratings, PublicSource]:
    """(private ratings without the public users, their ratings as the ``public_users`` source).

    The private part keeps the item list and order (so S's columns stay aligned) and drops the
    public users from its user list: they enter no private statistic. Unknown ids raise.
    """
    wanted = np.unique(np.asarray(list(public_user_ids)))
    is_public = np.isin(ratings.user_ids, wanted)
    if int(is_public.sum()) != len(wanted):
        known = set(ratings.user_ids.tolist())
        missing = [u for u in wanted.tolist() if u not in known]
        raise ValueError(f"unknown public user id(s), e.g. {missing[:3]}")
    public_rows = np.flatnonzero(is_public)
    private_rows = np.flatnonzero(~is_public)
    private_csr = ratings.csr[private_rows]
    private = Ratings.from_indices(
        *_csr_triples(private_csr), user_ids=ratings.user_ids[private_rows], item_ids=ratings.item_ids
    )
    labels = tuple(str(u) for u in ratings.user_ids[public_rows].tolist())
    return private, PublicSource("public_users", ratings.csr[public_rows], labels)


def _csr_triples(matrix: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = np.repeat(np.arange(matrix.shape[0], dtype=np.int64), np.diff(matrix.indptr))
    return rows, matrix.indices.astype(np.int64), matrix.data


# ---------------------------------------------------------------------------- config
@dataclass(frozen=True)
class DPCMFConfig(dpals.DPALSConfig):
    """DPALS's hyper-parameters plus the public side (all public; stored with the model).

    ``alpha_*`` weigh each source against the private data (α_s; 0 switches a source off);
    ``reg_feature`` is λ_F, the ridge of the feature rows and of the items trained from public data
    only; ``public_unobserved_weight`` is w0_F, the iALS weight of S's unobserved entries, applied
    to the categorical metadata always (paper Remark 3.1) and to every source when ``implicit``.
    """

    alpha_metadata: float = 0.0
    alpha_similarities: float = 0.0
    alpha_public_users: float = 0.0
    reg_feature: float = 1.0  # λ_F
    public_unobserved_weight: float = 0.0  # w0_F
    implicit: bool = False  # binary feedback: iALS weights, private w0 = reg_gravity

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("alpha_metadata", "alpha_similarities", "alpha_public_users", "public_unobserved_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if not (math.isfinite(self.reg_feature) and self.reg_feature > 0):
            raise ValueError(f"reg_feature must be finite and > 0, got {self.reg_feature!r}")
        if not isinstance(self.implicit, bool):
            raise ValueError("implicit must be a boolean")
        if self.implicit and self.reg_gravity <= 0:
            raise ValueError("implicit feedback needs reg_gravity > 0 (the private unobserved weight w0)")

    def alpha(self, source: str) -> float:
        if source not in PUBLIC_SOURCES:
            raise ValueError(f"unknown public source {source!r}")
        return float(getattr(self, f"alpha_{source}"))

    @property
    def dpals(self) -> dpals.DPALSConfig:
        """The DPALS part of the config (what the noise, the releases and the event depend on)."""
        names = {f.name for f in fields(dpals.DPALSConfig)}
        return dpals.DPALSConfig(**{f.name: getattr(self, f.name) for f in fields(self) if f.name in names})


# ---------------------------------------------------------------------------- accounting
def dpcmf_event(config: DPCMFConfig) -> dp_event.DpEvent:
    """DPALS's event for the same config: the public side releases nothing new (post-processing)."""
    return dpals.dpals_event(config.dpals)


def calibrate(target_epsilon: float, delta: float, config: DPCMFConfig) -> DPCMFConfig:
    """``config`` with DPALS's calibrated noise (the same multiplier DPALS would get)."""
    calibrated = dpals.calibrate(target_epsilon, delta, config.dpals)
    return replace(config, noise_multiplier=calibrated.noise_multiplier)


def public_config(config: DPCMFConfig) -> dict[str, Any]:
    """The config as published: everything but the seed."""
    return dpals.public_config(config)


def event_parameters(config: DPCMFConfig) -> dict[str, Any]:
    """DPALS's event parameters (the public side adds none), labelled ``dpcmf``."""
    return {**dpals.event_parameters(config.dpals), "algorithm": "dpcmf"}


# ---------------------------------------------------------------------------- training
@dataclass(frozen=True)
class _Block:
    """One active source as used in the loss: its S (public users centred by m̃), α_s and w0 (0 or w0_F)."""

    matrix: sp.csr_matrix
    alpha: float
    unobserved_weight: float


@dataclass
class _PublicSide:
    """The exact public half of the loss: W, the item terms B_j, d_j, G and the tail items' V."""

    blocks: list[_Block]
    config: DPCMFConfig
    tail_factors: np.ndarray = field(init=False)
    feature_plans: list[SolvePlan] = field(init=False)
    item_plan: Any = field(init=False)

    def __post_init__(self) -> None:
        n_items = self.blocks[0].matrix.shape[1]
        self.feature_plans = [make_plan(b.matrix.indptr, b.matrix.indices, b.matrix.data, n_items) for b in self.blocks]
        stacked = sp.vstack([b.matrix for b in self.blocks], format="csc")
        stacked.sort_indices()
        row_alpha = np.concatenate([np.full(b.matrix.shape[0], b.alpha) for b in self.blocks])
        # items x rows, each entry weighted by its row's α: Σ_f α_f w_f w_fᵀ and Σ_f α_f S_fj w_f
        self.item_plan = make_plan(stacked.indptr, stacked.indices, stacked.data, stacked.shape[0],
                                   row_alpha[stacked.indices])
        self.tail_factors = np.zeros((n_items, self.config.rank))

    @property
    def covered(self) -> np.ndarray:
        """Items with at least one public entry."""
        return np.asarray(self.item_plan.counts > 0)

    def feature_factors(self, item_factors: np.ndarray) -> list[np.ndarray]:
        """W_s: w_f = (Σ_{Ω_f} v vᵀ + w0 VᵀV + (λ_F/α_s) I)⁻¹ Σ_{Ω_f} S_fj v_j (paper eq. (3))."""
        gram = item_factors.T @ item_factors
        out = []
        for block, plan in zip(self.blocks, self.feature_plans, strict=True):
            shared = block.unobserved_weight * gram if block.unobserved_weight > 0 else None
            ridge = np.full(plan.n_rows, self.config.reg_feature / block.alpha)
            out.append(solve_side(plan, item_factors, ridge, shared, gram_dtype=np.float64))
        return out

    def item_terms(self, feature_factors: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(B_j, d_j for all items, G = Σ_s w0_s α_s W_sᵀW_s or None): the α-weighted public statistics."""
        n_items, rank = self.covered.shape[0], self.config.rank
        grams, rhs = np.zeros((n_items, rank, rank)), np.zeros((n_items, rank))
        for rows, gram, b in iter_grams(self.item_plan, np.vstack(feature_factors)):
            grams[rows], rhs[rows] = gram, b
        shared = None
        for block, w in zip(self.blocks, feature_factors, strict=True):
            if block.unobserved_weight > 0:
                term = block.unobserved_weight * block.alpha * (w.T @ w)
                shared = term if shared is None else shared + term
        return grams, rhs, shared

    def step(self, frequent: np.ndarray, frequent_factors: np.ndarray) -> dpals.PublicItemTerms:
        """One public half-step: W from the current V, then the tail items' V and the trained items' terms."""
        full = self.tail_factors.copy()
        full[frequent] = frequent_factors
        grams, rhs, shared = self.item_terms(self.feature_factors(full))
        tail = self.covered.copy()
        tail[frequent] = False
        system = grams[tail] + self.config.reg_feature * np.eye(self.config.rank)
        if shared is not None:
            system += shared
        self.tail_factors[tail] = np.linalg.solve(system, rhs[tail][:, :, None])[:, :, 0]
        return dpals.PublicItemTerms(grams[frequent], rhs[frequent], shared)


def _active_sources(public: PublicData | None, config: DPCMFConfig, n_items: int) -> list[PublicSource]:
    if public is None:
        return []
    if not isinstance(public, PublicData):
        raise ValueError("public must be a PublicData")
    for source in public.sources:
        if source.n_items != n_items:
            raise ValueError(
                f"public source {source.name!r} has {source.n_items} item columns; the ratings have {n_items} items"
            )
    return [s for s in public.sources if config.alpha(s.name) > 0 and s.matrix.nnz > 0]


def _check_public_users_removed(ratings: Ratings | PartitionedRatings, sources: list[PublicSource]) -> None:
    """Public users' rows are a public input only: the private matrix must not hold them (a
    partitioned one: its readers' rows must be cut of them where they are read)."""
    source = next((s for s in sources if s.name == "public_users"), None)
    if source is None or not source.row_labels:
        return
    if isinstance(ratings, PartitionedRatings):
        if not set(source.row_labels) <= ratings.excluded_labels:
            raise ValueError("public users must be excluded from the partitions' private ratings")
        return
    private = {str(u) for u in ratings.user_ids.tolist()}
    if private.intersection(source.row_labels):
        raise ValueError("public users must be removed from the private ratings (use split_public_users)")


def _centred_public_users(matrix: sp.csr_matrix, config: DPCMFConfig, global_mean: float) -> sp.csr_matrix:
    """Public users' ratings centred by the released DP mean only: S_fj = r_fj − m̃ (not clipped).

    Unlike a private user's residual (r − m̃ − b_i, clipped to ±Γ_M for the sensitivity), a public
    row keeps its user's bias: w_f then carries a bias coordinate and V a matching item-bias
    direction learnt from exact public ratings, which the private users' fold-in can use (DPALS
    has no item bias). Clipping only serves the sensitivity bound, which public rows do not need.
    Chosen on the validation split of ``benchmarks/cmf.py`` (ML-1M, seed 0): at ε = 1 the public-
    users variant's RMSE went 0.934 (r − m̃ − b_f, clipped) -> 0.924 (r − m̃, clipped) -> 0.921
    (r − m̃), with gains of the same size at ε = 5 and 20 and on seeds 1, 2. Uses only public
    ratings and the released m̃: post-processing. For binary data (m̃ = 0) S keeps the raw values.
    """
    lo, hi = config.rating_range
    if matrix.nnz and (matrix.data.min() < lo or matrix.data.max() > hi):
        raise ValueError(f"public users' ratings fall outside the declared range [{lo}, {hi}]")
    out = matrix.copy()
    out.data = matrix.data - global_mean
    return out


def _blocks(sources: list[PublicSource], config: DPCMFConfig, global_mean: float) -> list[_Block]:
    """The loss's blocks; w0_F applies to categorical metadata always (Remark 3.1), to all if implicit."""
    blocks = []
    for source in sources:
        matrix = source.matrix
        if source.name == "public_users":
            matrix = _centred_public_users(matrix, config, global_mean)
        iALS = config.implicit or source.name == "metadata"
        blocks.append(_Block(matrix, config.alpha(source.name), config.public_unobserved_weight if iALS else 0.0))
    return blocks


def train_dpcmf(
    ratings: Ratings | PartitionedRatings,
    config: DPCMFConfig,
    *,
    public: PublicData | None = None,
    progress: dpals.Progress | None = None,
    fit: dpals.FitFunction = dpals.fit_dpals,
    kept_items: np.ndarray | None = None,
) -> PublicModel:
    """Train DP-CMF; the event equals :func:`dpcmf_event` (DPALS's), checked release by release.

    ``public`` columns must follow ``ratings.item_ids``. Sources with α = 0 are ignored; with no
    active source the result is DPALS's model (labelled ``dpcmf``) bit for bit. ``fit`` runs the
    private part (in process, or on a cluster: :mod:`app.core.mf.distributed`); ``kept_items``: the
    model in force's trained item ids (:func:`app.core.mf.dpals.fit_dpals`).
    """
    if not isinstance(config, DPCMFConfig):
        raise ValueError("train_dpcmf needs a DPCMFConfig")
    sources = _active_sources(public, config, ratings.n_items)
    _check_public_users_removed(ratings, sources)
    side: list[_PublicSide] = []

    def public_terms(released: dpals.PublicState, frequent_factors: np.ndarray) -> dpals.PublicItemTerms:
        if not side:  # built once the DP mean (used to centre public users) is released
            side.append(_PublicSide(_blocks(sources, config, released.global_mean), config))
        return side[0].step(released.frequent, frequent_factors)

    result = fit(ratings, config.dpals, progress=progress, public_terms=public_terms if sources else None,
                 kept_items=kept_items)
    model = dpals.public_model(ratings, config.dpals, result)
    return _with_public_side(model, config, result, side[0] if side else None, sources)


def _as_run(config: DPCMFConfig, fit: dpals.DPALSFit) -> DPCMFConfig:
    """``config`` with the run's DPALS part: the contribution bound as released when it came from the
    data, and the laws in it applied (:func:`app.core.mf.dpals.apply_bound_laws`)."""
    if fit.config is None:
        return config
    return replace(config, **{f.name: getattr(fit.config, f.name) for f in fields(dpals.DPALSConfig)})


def _with_public_side(
    model: PublicModel, config: DPCMFConfig, fit: dpals.DPALSFit, side: _PublicSide | None, sources: list[PublicSource]
) -> PublicModel:
    """Relabel DPALS's model as ``dpcmf`` and add the tail items trained from public data."""
    factors, trained = model.item_factors.copy(), model.trained_mask.copy()
    tail = np.zeros(model.n_items, dtype=bool)
    if side is not None:
        tail = side.covered & ~trained
        factors[tail] = side.tail_factors[tail]
        trained |= tail
    metadata = {
        **model.metadata,
        **event_parameters(_as_run(config, fit)),
        "public_sources": [
            {"name": s.name, "rows": s.n_rows, "entries": int(s.matrix.nnz), "alpha": config.alpha(s.name)}
            for s in sources
        ],
        "n_private_trained_items": int(len(fit.prep.frequent)),
        "cold_start_items": model.item_ids[tail].tolist(),
    }
    return replace(
        model, algorithm="dpcmf", item_factors=factors, trained_mask=trained,
        config=public_config(_as_run(config, fit)), metadata=metadata,
    )
