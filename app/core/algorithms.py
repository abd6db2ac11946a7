"""The private training algorithms the service can run, behind one typed interface.

Everything the service knows about an algorithm lives in its :class:`Algorithm`: the smallest
catalogue it runs on, the data kind it trains on and the public inputs it also reads, what the
data set decides for its hyper-parameters and its ε-aware defaults, the public checks before any
data is read, the run's ``DpEvent`` (for the ledger reservation), training, what the run
publishes, its artifact, and how it scores items for one user from that artifact plus the user's
own ratings or votes (privileged post-processing, joint DP: Jain, Thakkar & Thakurta 2018,
arXiv:1712.09765, Definition 1). Services read these declarations and never branch on a name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

import numpy as np
from dp_accounting import dp_event

from app.core import onebit
from app.core.arrays import AnyArray, BoolArray, FloatArray, IntArray
from app.core.data.partitioned import PartitionedRatings
from app.core.data.ratings import Ratings
from app.core.mf import defaults, dpals, dpcmf, dpfw, foldin
from app.core.mf.artifact import load_model, save_model
from app.core.mf.model import PublicModel
from app.core.utility import CountRelease

__all__ = [
    "ALGORITHMS", "Algorithm", "DataKind", "DatasetFacts", "PopularityKind", "PublicInput", "PublishedModel",
    "SCORE_KINDS", "ScoreKind", "default_algorithm", "get_algorithm", "resolve_hyperparameters", "score_kind",
]

DataKind = Literal["ratings", "ratings+public", "votes"]
PublicInput = Literal["item_features", "similarities", "public_users"]
ScoreKind = Literal["predicted_rating", "ranking_score", "p_thumbs_up"]
PopularityKind = Literal["dp_count", "mean_p_thumbs_up"]
SCORE_KINDS: tuple[ScoreKind, ...] = ("predicted_rating", "ranking_score", "p_thumbs_up")
Progress = Callable[[float, str], None]


class PublishedModel(Protocol):
    """The item-side view every published model offers (serving, embeddings, similar items)."""

    @property
    def algorithm(self) -> str: ...
    @property
    def item_ids(self) -> AnyArray: ...
    @property
    def item_factors(self) -> FloatArray: ...
    @property
    def config(self) -> dict[str, Any]: ...
    @property
    def event(self) -> dp_event.DpEvent | None: ...
    @property
    def metadata(self) -> dict[str, Any]: ...
    @property
    def n_items(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def trained_mask(self) -> BoolArray: ...
    def item_index(self) -> dict[Any, int]: ...


@dataclass(frozen=True)
class DatasetFacts:
    """A data set's public facts: its administrator's declarations and its public catalogue size,
    all an algorithm may know before any private data is read."""

    name: str
    kind: str  # "ratings" or "votes"
    rating_range: tuple[float, float]
    n_items: int
    max_users: int | None = None
    vote_local_epsilon: float | None = None  # ε0 of votes randomised at ingestion (None: raw votes)
    votes_per_user_cap: int | None = None


ConfigT = TypeVar("ConfigT")
ModelT = TypeVar("ModelT", bound=PublishedModel)


class Algorithm(ABC, Generic[ConfigT, ModelT]):
    """One private training algorithm (see the module docstring).

    ``data`` names the training inputs, read by the loader of that kind ("ratings+public": ``train``
    also takes ``public=``, a :class:`app.core.mf.dpcmf.PublicData` built from ``public_inputs``).
    ``min_items`` is the smallest public catalogue it runs on. ``default_for_kind`` marks the
    algorithm scheduled retraining runs on a data set of that kind without an active model.
    ``service_set_keys`` are hyper-parameters the data set decides (never chosen by a caller, never
    passed back on retraining). ``takes_objective``: the algorithm has ε-aware defaults per
    objective (:meth:`default_hyperparameters`). ``released_outputs`` names everything the run publishes: the
    artifact's arrays (item ids, public catalogue, aside) and its released scalars.
    ``score_kinds`` lists what :meth:`score` may mean; ``popularity_kind`` what :meth:`popularity`
    (the ``/popular`` order) is. ``scores_by_fold_in``: :meth:`score` is the fold-in solve of
    :mod:`app.core.mf.foldin`, whose top-N serving may restrict to trained items.
    ``distributable``: :meth:`train` also takes ``fit=`` (a :class:`app.core.mf.dpals.FitFunction`,
    :func:`app.core.mf.distributed.distributed_fit`) and then trains on a cluster, publishing what it
    publishes in process; its ``data`` may then be a :class:`PartitionedRatings` read on the workers.
    """

    name: ClassVar[str]
    data: ClassVar[DataKind] = "ratings"
    public_inputs: ClassVar[tuple[PublicInput, ...]] = ()
    min_items: ClassVar[int] = 1
    default_for_kind: ClassVar[str | None] = None
    service_set_keys: ClassVar[tuple[str, ...]] = ()
    takes_objective: ClassVar[bool] = False
    released_outputs: ClassVar[tuple[str, ...]]
    score_kinds: ClassVar[tuple[ScoreKind, ...]] = ("predicted_rating",)
    popularity_kind: ClassVar[PopularityKind] = "dp_count"
    scores_by_fold_in: ClassVar[bool] = False
    distributable: ClassVar[bool] = False

    def data_params(self, params: dict[str, Any], facts: DatasetFacts) -> dict[str, Any]:
        """``params`` with what the data set decides for this algorithm (``ValueError`` when the
        caller chose what the data set decides). Nothing is decided by default."""
        return dict(params)

    def default_hyperparameters(self, *, objective: str | None, epsilon: float, delta: float,
                                facts: DatasetFacts) -> dict[str, Any] | None:
        """The ε-aware defaults for ``objective`` at (ε, δ) from public facts only, or None when
        the algorithm has none (its own config defaults apply)."""
        return None

    def check_public_shape(self, config: ConfigT, n_items: int) -> None:
        """Refuse (``ValueError``), from public facts only, a run too large or too small to train."""

    def costs_nothing(self, params: dict[str, Any], facts: DatasetFacts) -> bool:
        """Whether a run with ``params`` on this data set is post-processing of a guarantee the
        ledger already holds (a free run, given no ε target)."""
        return False

    def pre_randomised_epsilon(self, public_config: dict[str, Any]) -> float | None:
        """ε0 of the locally randomised data a run of ``public_config`` reads (only the bits
        randomised with exactly it), or None when it reads the data as stored."""
        return None

    def inputs_from_model_in_force(self, config: ConfigT,
                                   model_in_force: Callable[[], PublishedModel | None]) -> dict[str, Any]:
        """Keyword arguments of :meth:`train` taken from the data set's published model in force
        (``model_in_force()`` loads it; None when there is none): public, so post-processing."""
        return {}

    @abstractmethod
    def config_from_params(self, params: dict[str, Any], rating_range: tuple[float, float]) -> ConfigT:
        """The config from public hyper-parameters and the data set's public rating range."""

    @abstractmethod
    def config_from_dict(self, data: dict[str, Any]) -> ConfigT:
        """The config from its stored dictionary (``ValueError`` on unknown or invalid fields)."""

    @abstractmethod
    def public_config(self, config: ConfigT) -> dict[str, Any]:
        """The config as published (no seed)."""

    @abstractmethod
    def calibrate(self, epsilon: float, delta: float, config: ConfigT, n_items: int) -> ConfigT:
        """``config`` with its noise set so the run is (ε, δ)-DP."""

    @abstractmethod
    def event(self, config: ConfigT, n_items: int) -> dp_event.DpEvent:
        """The run's event from public facts alone, before any data is read."""

    @abstractmethod
    def event_parameters(self, config: ConfigT) -> dict[str, Any]:
        """What gives the event its meaning (relation, bounds, clipping norms)."""

    @abstractmethod
    def train(self, data: Ratings, config: ConfigT, *, progress: Progress | None = None, **inputs: Any) -> ModelT:
        """Train on the private ``data``; the model's event is checked against :meth:`event`."""

    @abstractmethod
    def save(self, model: ModelT, path: Path) -> tuple[Path, str]:
        """Write the sealed artifact; (npz path, sha256)."""

    @abstractmethod
    def load(self, path: str | Path, sha256: str | None) -> ModelT:
        """Read and verify an artifact of :meth:`save`."""

    @abstractmethod
    def score(self, model: ModelT, item_idx: IntArray, values: FloatArray) -> FloatArray:
        """Every item's score for one user from her own ratings or votes (the serving solve)."""


    def score_kind(self, model: ModelT) -> ScoreKind:
        """What :meth:`score` means: a predicted rating on the data set's scale by default."""
        return "predicted_rating"

    @abstractmethod
    def popularity(self, model: ModelT) -> FloatArray:
        """Per-item popularity released with the model, the ``/popular`` order (its meaning:
        ``popularity_kind``)."""

    def release_coordinates_bound(self, config: Mapping[str, Any], n_items: int) -> int:
        """An upper bound on the coordinates one user can change in any single release of a run with
        this public ``config`` on ``n_items`` items: the item factors or per-item vectors
        (n_items x (rank + 1)) or the k per-item r x r Grams one user touches (k r(r+1)/2)."""
        rank = int(config.get("rank") or 1)
        k = max(int(config.get(name) or 1) for name in ("contribution_bound", "votes_per_user", "max_ratings_per_user"))
        return max(max(int(n_items), 1) * (rank + 1), k * rank * (rank + 1) // 2)

    def baseline_scores(self, model: ModelT) -> FloatArray | None:
        """Every item's score for a user with no data, or None when the model has no such prior."""
        return None

    def count_release(self, model: ModelT) -> CountRelease | None:
        """The model's released item counts with their noise std and trained items, for the
        utility indicator (:mod:`app.core.utility`); None when it releases no counts."""
        return None


def _with_fixed_range(params: dict[str, Any], rating_range: tuple[float, float]) -> dict[str, Any]:
    if "rating_range" in params and [float(x) for x in params["rating_range"]] != list(rating_range):
        raise ValueError("rating_range is the data set's public range and cannot be overridden")
    return {**params, "rating_range": list(rating_range)}


_DPALS_FIELDS = frozenset(f for f in dpals.DPALSConfig.__dataclass_fields__ if f != "seed")
_DPFW_FIELDS = frozenset(f for f in dpfw.DPFWConfig.__dataclass_fields__ if f != "seed")
_FACTOR_OUTPUTS = ("item_factors", "item_biases", "item_counts", "trained_mask", "global_mean", "user_reg")


class _FactorModelAlgorithm(Algorithm[ConfigT, PublicModel]):
    """Shared by the DPALS family: a :class:`PublicModel` artifact and fold-in serving."""

    released_outputs = _FACTOR_OUTPUTS
    score_kinds = ("predicted_rating", "ranking_score")
    scores_by_fold_in = True
    takes_objective = True
    distributable = True  # DPALS and DP-CMF: train(..., fit=distributed_fit(...)) (issue 28)

    def save(self, model: PublicModel, path: Path) -> tuple[Path, str]:
        info = save_model(model, path)
        return info.npz_path, info.sha256

    def load(self, path: str | Path, sha256: str | None) -> PublicModel:
        return load_model(path, expected_sha256=sha256)

    def score(self, model: PublicModel, item_idx: IntArray, values: FloatArray) -> FloatArray:
        return foldin.user_scores(model, item_idx, values)

    def score_kind(self, model: PublicModel) -> ScoreKind:
        return "ranking_score" if foldin.is_ranking(model) else "predicted_rating"

    def popularity(self, model: PublicModel) -> FloatArray:
        return np.asarray(model.item_counts, dtype=np.float64)

    def baseline_scores(self, model: PublicModel) -> FloatArray | None:
        """m̃ + b̃_j (or the ranking prior): the fold-in of a user with no ratings."""
        return foldin.predict_ratings(model, np.zeros(model.rank))

    def inputs_from_model_in_force(self, config: ConfigT,
                                   model_in_force: Callable[[], PublishedModel | None]) -> dict[str, Any]:
        """``kept_items``: the trained items of the model in force, where the config keeps them
        (``keep_trained_sigmas``, defaults rule 11) and that model is of the DPALS family and the
        run's objective."""
        dpals_config = config.dpals if isinstance(config, dpcmf.DPCMFConfig) else config
        if not isinstance(dpals_config, dpals.DPALSConfig) or not dpals_config.keep_trained_sigmas:
            return {}
        model = model_in_force()
        if (model is None or model.algorithm not in ("dpals", "dpcmf")
                or model.config.get("objective", "rating") != dpals_config.objective):
            return {}
        return {"kept_items": np.asarray(model.item_ids)[np.asarray(model.trained_mask, dtype=bool)]}

    def count_release(self, model: PublicModel) -> CountRelease | None:
        """The first count release (sensitivity √k, Algorithm 3 step 1) over the trained items the
        frequent fraction or the SNR floor chose (:func:`dpals.core_items`). The σ and kept floors
        (defaults rules 10 and 11) train items because their counts clear the noise; counted, they
        would make the share follow the trained set rather than the noise."""
        config = dpals.DPALSConfig.from_dict({k: v for k, v in model.config.items() if k in _DPALS_FIELDS})
        considered = np.asarray(model.trained_mask, dtype=bool) & dpals.core_items(model.item_counts, config)
        return CountRelease(counts=model.item_counts, noise_std=dpals.count_noise_std(config), considered=considered)


# ---------------------------------------------------------------------------- DPALS
class DPALSAlgorithm(_FactorModelAlgorithm[dpals.DPALSConfig]):
    """Private ALS (Chien et al. 2021, arXiv:2107.09802, Algorithms 1 and 3): :mod:`app.core.mf.dpals`."""

    name = "dpals"
    default_for_kind = "ratings"

    def default_hyperparameters(self, *, objective: str | None, epsilon: float, delta: float,
                                facts: DatasetFacts) -> dict[str, Any] | None:
        return defaults.default_hyperparameters(
            objective=objective or "rating", epsilon=epsilon, delta=delta, rating_range=facts.rating_range,
            n_items=facts.n_items, max_users=facts.max_users)

    def config_from_params(self, params: dict[str, Any], rating_range: tuple[float, float]) -> dpals.DPALSConfig:
        return dpals.DPALSConfig.from_dict(_with_fixed_range(params, rating_range))

    def config_from_dict(self, data: dict[str, Any]) -> dpals.DPALSConfig:
        return dpals.DPALSConfig.from_dict(data)

    def public_config(self, config: dpals.DPALSConfig) -> dict[str, Any]:
        return dpals.public_config(config)

    def calibrate(self, epsilon: float, delta: float, config: dpals.DPALSConfig, n_items: int) -> dpals.DPALSConfig:
        return dpals.calibrate(epsilon, delta, config)

    def event(self, config: dpals.DPALSConfig, n_items: int) -> dp_event.DpEvent:
        return dpals.dpals_event(config)

    def event_parameters(self, config: dpals.DPALSConfig) -> dict[str, Any]:
        return dpals.event_parameters(config)

    def train(self, data: Ratings | PartitionedRatings, config: dpals.DPALSConfig, *, progress: Progress | None = None,
              **inputs: Any) -> PublicModel:
        return dpals.train_dpals(data, config, progress=progress, **inputs)


# ---------------------------------------------------------------------------- DP-CMF
class DPCMFAlgorithm(_FactorModelAlgorithm[dpcmf.DPCMFConfig]):
    """DPALS with public item data (Curmei et al. 2023, arXiv:2309.11516, Algorithm 1): :mod:`app.core.mf.dpcmf`."""

    name = "dpcmf"
    data = "ratings+public"
    public_inputs = ("item_features", "similarities", "public_users")

    def default_hyperparameters(self, *, objective: str | None, epsilon: float, delta: float,
                                facts: DatasetFacts) -> dict[str, Any] | None:
        return defaults.default_cmf_hyperparameters(
            objective=objective or "rating", epsilon=epsilon, delta=delta, rating_range=facts.rating_range,
            n_items=facts.n_items, max_users=facts.max_users)

    def config_from_params(self, params: dict[str, Any], rating_range: tuple[float, float]) -> dpcmf.DPCMFConfig:
        return dpcmf.DPCMFConfig.from_dict(_with_fixed_range(params, rating_range))

    def config_from_dict(self, data: dict[str, Any]) -> dpcmf.DPCMFConfig:
        return dpcmf.DPCMFConfig.from_dict(data)

    def public_config(self, config: dpcmf.DPCMFConfig) -> dict[str, Any]:
        return dpcmf.public_config(config)

    def calibrate(self, epsilon: float, delta: float, config: dpcmf.DPCMFConfig, n_items: int) -> dpcmf.DPCMFConfig:
        return dpcmf.calibrate(epsilon, delta, config)

    def event(self, config: dpcmf.DPCMFConfig, n_items: int) -> dp_event.DpEvent:
        return dpcmf.dpcmf_event(config)

    def event_parameters(self, config: dpcmf.DPCMFConfig) -> dict[str, Any]:
        return dpcmf.event_parameters(config)

    def train(self, data: Ratings | PartitionedRatings, config: dpcmf.DPCMFConfig, *, progress: Progress | None = None,
              **inputs: Any) -> PublicModel:
        return dpcmf.train_dpcmf(data, config, progress=progress, **inputs)


# ---------------------------------------------------------------------------- DPFW
class DPFWAlgorithm(Algorithm[dpfw.DPFWConfig, dpfw.FrankWolfeModel]):
    """Private Frank-Wolfe (Jain, Thakkar & Thakurta 2018, arXiv:1712.09765, Algorithm 1): :mod:`app.core.mf.dpfw`."""

    name = "dpfw"
    min_items = 2
    released_outputs = ("directions", "scales", "item_counts")

    def config_from_params(self, params: dict[str, Any], rating_range: tuple[float, float]) -> dpfw.DPFWConfig:
        if "rating_range" in params:
            raise ValueError("DPFW takes no rating_range: users centre by their own mean")
        midpoint = 0.5 * (rating_range[0] + rating_range[1])  # public offset for users without ratings
        return dpfw.DPFWConfig.from_dict({"default_mean": midpoint, **params})

    def config_from_dict(self, data: dict[str, Any]) -> dpfw.DPFWConfig:
        return dpfw.DPFWConfig.from_dict(data)

    def public_config(self, config: dpfw.DPFWConfig) -> dict[str, Any]:
        return dpfw.public_config(config)

    def calibrate(self, epsilon: float, delta: float, config: dpfw.DPFWConfig, n_items: int) -> dpfw.DPFWConfig:
        """Resolve "auto" against today's catalogue size first, so the reserved event never drifts."""
        resolved = replace(config, eigen_method=config.method(n_items))
        return dpfw.calibrate(epsilon, delta, resolved, n_items)

    def event(self, config: dpfw.DPFWConfig, n_items: int) -> dp_event.DpEvent:
        return dpfw.dpfw_event(config, n_items)

    def release_coordinates_bound(self, config: Mapping[str, Any], n_items: int) -> int:
        """Also DPFW's dense item-by-item Gram, up to ``dense_max_items`` items."""
        dense = min(max(int(n_items), 1), int(config.get("dense_max_items") or dpfw.DPFWConfig.dense_max_items))
        return max(super().release_coordinates_bound(config, n_items), dense * (dense + 1) // 2)

    def event_parameters(self, config: dpfw.DPFWConfig) -> dict[str, Any]:
        return dpfw.event_parameters(config)

    def train(self, data: Ratings, config: dpfw.DPFWConfig, *, progress: Progress | None = None,
              **inputs: Any) -> dpfw.FrankWolfeModel:
        return dpfw.train_dpfw(data, config, progress=progress, **inputs)

    def save(self, model: dpfw.FrankWolfeModel, path: Path) -> tuple[Path, str]:
        npz_path, _, sha = dpfw.save_frank_wolfe(model, path)
        return npz_path, sha

    def load(self, path: str | Path, sha256: str | None) -> dpfw.FrankWolfeModel:
        return dpfw.load_frank_wolfe(path, expected_sha256=sha256)

    def score(self, model: dpfw.FrankWolfeModel, item_idx: IntArray, values: FloatArray) -> FloatArray:
        return dpfw.replay_user(model, item_idx, values)

    def popularity(self, model: dpfw.FrankWolfeModel) -> FloatArray:
        return np.asarray(model.item_counts, dtype=np.float64)

    def count_release(self, model: dpfw.FrankWolfeModel) -> CountRelease | None:
        """The item counts (sensitivity √max_ratings_per_user); every item gets a direction."""
        config = dpfw.DPFWConfig.from_dict({k: v for k, v in model.config.items() if k in _DPFW_FIELDS})
        return CountRelease(counts=model.item_counts, noise_std=dpfw.count_noise_std(config),
                            considered=np.ones(len(model.item_counts), dtype=bool))


# ---------------------------------------------------------------------------- one-bit (votes)
class OneBitAlgorithm(Algorithm[onebit.OneBitConfig, onebit.OneBitModel]):
    """One-bit completion on ±1 votes (Li et al. 2021, arXiv:2110.00719, Algorithms 1-4): :mod:`app.core.onebit`.

    It releases no counts: its popularity is the mean predicted P(thumbs up) per item, a
    post-processing of the private estimate.
    """

    name = "onebit"
    data = "votes"
    min_items = 2
    default_for_kind = "votes"
    service_set_keys = ("pre_randomised", "local_epsilon")
    released_outputs = ("item_factors", "item_like_probability")
    score_kinds = ("p_thumbs_up",)
    popularity_kind = "mean_p_thumbs_up"

    def data_params(self, params: dict[str, Any], facts: DatasetFacts) -> dict[str, Any]:
        """What the data set decides. Randomising data set: for InP (the default mechanism)
        ``pre_randomised=True, local_epsilon=ε0`` are forced (callers cannot choose them): the run
        flips nothing and is post-processing of the local guarantee (charged 0); another mechanism
        trains on the stored bits as data and is charged its own event. Raw data set:
        ``pre_randomised`` / ``local_epsilon`` are refused (the bits were not randomised).
        ``votes_per_user`` defaults to the data set's cap and ``user_rows`` to its declared public
        bound ``max_users`` (add/remove-one-user relation; excess voters are dropped at random)."""
        out = dict(params)
        if facts.max_users is not None:
            out.setdefault("user_rows", max(2, int(facts.max_users)))
        chosen = [k for k in self.service_set_keys if k in out]
        eps0 = facts.vote_local_epsilon
        if eps0 is not None:
            if chosen:
                raise ValueError(f"{', '.join(chosen)} cannot be chosen: data set {facts.name!r} randomises votes "
                                 f"at ingestion with epsilon0 {eps0}; the service sets them")
            if out.get("mechanism", "inp") == "inp":
                out.update(pre_randomised=True, local_epsilon=float(eps0))
        elif out.get("pre_randomised") or out.get("local_epsilon") is not None:
            raise ValueError(f"data set {facts.name!r} stores raw votes: pre_randomised / local_epsilon "
                             "cannot be set (turn on randomisation at ingestion in the vote settings)")
        if facts.votes_per_user_cap is not None:
            out.setdefault("votes_per_user", int(facts.votes_per_user_cap))
        return out

    def check_public_shape(self, config: onebit.OneBitConfig, n_items: int) -> None:
        onebit.check_public_shape(config, n_items)

    def costs_nothing(self, params: dict[str, Any], facts: DatasetFacts) -> bool:
        """InP on bits randomised at ingestion: post-processing of the local guarantee."""
        return facts.vote_local_epsilon is not None and params.get("mechanism", "inp") == "inp"

    def pre_randomised_epsilon(self, public_config: dict[str, Any]) -> float | None:
        if not public_config.get("pre_randomised"):
            return None
        eps0 = public_config.get("local_epsilon")
        return None if eps0 is None else float(eps0)

    def config_from_params(self, params: dict[str, Any], rating_range: tuple[float, float]) -> onebit.OneBitConfig:
        if "rating_range" in params:
            raise ValueError("one-bit completion trains on +1/-1 votes and takes no rating_range")
        return onebit.OneBitConfig.from_dict(params)

    def config_from_dict(self, data: dict[str, Any]) -> onebit.OneBitConfig:
        return onebit.OneBitConfig.from_dict(data)

    def public_config(self, config: onebit.OneBitConfig) -> dict[str, Any]:
        return onebit.public_config(config)

    def calibrate(self, epsilon: float, delta: float, config: onebit.OneBitConfig, n_items: int) -> onebit.OneBitConfig:
        return onebit.calibrate(epsilon, delta, config, n_items)

    def event(self, config: onebit.OneBitConfig, n_items: int) -> dp_event.DpEvent:
        return onebit.onebit_event(config, n_items)

    def event_parameters(self, config: onebit.OneBitConfig) -> dict[str, Any]:
        return onebit.event_parameters(config)

    def train(self, data: Ratings, config: onebit.OneBitConfig, *, progress: Progress | None = None,
              **inputs: Any) -> onebit.OneBitModel:
        return onebit.train_onebit(data, config, progress=progress, **inputs)

    def save(self, model: onebit.OneBitModel, path: Path) -> tuple[Path, str]:
        return onebit.save_onebit(model, path)

    def load(self, path: str | Path, sha256: str | None) -> onebit.OneBitModel:
        return onebit.load_onebit(path, sha256)

    def score(self, model: onebit.OneBitModel, item_idx: IntArray, values: FloatArray) -> FloatArray:
        return onebit.user_scores(model, item_idx, values)

    def score_kind(self, model: onebit.OneBitModel) -> ScoreKind:
        return "p_thumbs_up"

    def popularity(self, model: onebit.OneBitModel) -> FloatArray:
        return np.asarray(model.item_like_probability, dtype=np.float64)


DPALS = DPALSAlgorithm()
DPFW = DPFWAlgorithm()
DPCMF = DPCMFAlgorithm()
ONEBIT = OneBitAlgorithm()
ALGORITHMS: dict[str, Algorithm[Any, Any]] = {a.name: a for a in (DPALS, DPFW, DPCMF, ONEBIT)}


def score_kind(name: str, model: PublishedModel) -> ScoreKind:
    """What ``score`` means for a model of algorithm ``name``: a predicted rating on the data
    set's scale, a ranking score (higher is better, no scale), or P(thumbs up)."""
    return get_algorithm(name).score_kind(model)


def default_algorithm(kind: str) -> Algorithm[Any, Any]:
    """The algorithm scheduled retraining runs on a data set of declared ``kind`` without an
    active model (DPALS for ratings, one-bit for votes)."""
    for algo in ALGORITHMS.values():
        if algo.default_for_kind == kind:
            return algo
    raise ValueError(f"no algorithm trains on data sets of kind {kind!r}")


def resolve_hyperparameters(
    name: str,
    params: dict[str, Any],
    *,
    objective: str | None,
    epsilon: float,
    delta: float,
    rating_range: tuple[float, float],
    n_items: int,
    max_users: int | None = None,
) -> tuple[dict[str, Any], bool]:
    """(hyper-parameters to run, whether the ε-aware defaults were used).

    With no hyper-parameters (``params`` empty) an algorithm with ε-aware defaults (DPALS:
    :func:`app.core.mf.defaults.default_hyperparameters`, DP-CMF: its CMF variant) gets them for
    the objective at (ε, δ), from public facts only; given hyper-parameters are used as they are
    (an ``objective`` argument is added).
    """
    algo = get_algorithm(name)
    params = dict(params)
    in_params = params.pop("objective", None)
    if objective is not None and in_params is not None and in_params != objective:
        raise ValueError("objective is given twice with different values")
    objective = objective or in_params
    if objective is not None and not algo.takes_objective:
        with_objectives = ", ".join(a.name for a in ALGORITHMS.values() if a.takes_objective)
        raise ValueError(f"{name} has no objective choice (objectives apply to {with_objectives})")
    if params or not algo.takes_objective:
        return ({**params, "objective": objective} if objective else dict(params)), False
    facts = DatasetFacts(name="", kind=algo.data, rating_range=rating_range, n_items=n_items, max_users=max_users)
    resolved = algo.default_hyperparameters(objective=objective, epsilon=epsilon, delta=delta, facts=facts)
    if resolved is None:
        return dict(params), False
    return resolved, True


def get_algorithm(name: str) -> Algorithm[Any, Any]:
    """The algorithm called ``name`` (``ValueError`` listing the available ones otherwise)."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; available: {sorted(ALGORITHMS)}") from None
