"""One contract every registered algorithm keeps (app.core.algorithms.Algorithm).

Parametrised over the registry: a new algorithm must add its small training case below, and then
gets the artifact round trip, the event reserved before data equal to the event of the trained
model, calibration to the target ε, released outputs equal to what the artifact holds, scores
that are finite and of a declared kind, and the declarations services read instead of names.
Algorithm-specific checks stay in each algorithm's own test file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest

from app.core.algorithms import (
    ALGORITHMS,
    SCORE_KINDS,
    Algorithm,
    DataKind,
    DatasetFacts,
    PopularityKind,
    PublicInput,
    default_algorithm,
    get_algorithm,
    resolve_hyperparameters,
)
from app.core.data.ratings import Ratings
from app.core.mf.artifact import ArtifactError, read_sealed
from app.core.mf.dpcmf import PublicData, metadata_source
from app.core.privacy import accounting
from app.errors import CatalogueTooSmall
from app.services.training.requests import check_public_shape

N_USERS, N_ITEMS, RANGE = 40, 16, (1.0, 5.0)
DELTA = 1e-6


def _ratings() -> Ratings:
    rng = np.random.default_rng(0)
    users, items = np.nonzero(rng.random((N_USERS, N_ITEMS)) < 0.5)
    values = rng.integers(1, 6, size=len(users)).astype(float)
    return Ratings.from_arrays(users, items, values, user_ids=np.arange(N_USERS), item_ids=np.arange(N_ITEMS))


def _votes() -> Ratings:
    ratings = _ratings()
    rows, cols, vals = ratings.coo()
    return Ratings.from_indices(rows, cols, np.where(vals >= 3, 1.0, -1.0), user_ids=ratings.user_ids,
                                item_ids=ratings.item_ids)


def _genres() -> PublicData:
    return PublicData((metadata_source([[f"g{j % 3}"] for j in range(N_ITEMS)]),))


@dataclass(frozen=True)
class Case:
    """Public hyper-parameters and training inputs of one small run."""

    params: dict[str, Any]
    data: Ratings
    inputs: dict[str, Any] = field(default_factory=dict)


CASES: dict[str, Case] = {
    "dpals": Case({"rank": 3, "n_steps": 2, "contribution_bound": 6}, _ratings()),
    "dpcmf": Case({"rank": 3, "n_steps": 2, "contribution_bound": 6, "alpha_metadata": 2.0}, _ratings(),
                  {"public": _genres()}),
    "dpfw": Case({"n_steps": 4, "nuclear_norm": 50.0, "eigen_method": "dense"}, _ratings()),
    "onebit": Case({"mechanism": "outp", "rank": 2, "votes_per_user": 8, "n_steps": 5}, _votes()),
}
EPSILON = {"dpals": 4.0, "dpcmf": 4.0, "dpfw": 4.0, "onebit": 4.0}


@dataclass(frozen=True)
class Trained:
    algo: Algorithm[Any, Any]
    config: Any
    model: Any
    path: Path
    sha: str
    case: Case


@pytest.fixture(scope="module", params=sorted(ALGORITHMS))
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    algo, case = get_algorithm(request.param), CASES[request.param]
    config = algo.config_from_params(dict(case.params), RANGE)
    config = algo.calibrate(EPSILON[algo.name], DELTA, config, case.data.n_items)
    model = algo.train(case.data, config, progress=None, **case.inputs)
    path, sha = algo.save(model, tmp_path_factory.mktemp(algo.name) / "model")
    return Trained(algo, config, model, path, sha, case)


def test_every_registered_algorithm_has_a_case() -> None:
    assert set(CASES) == set(ALGORITHMS)
    for name, algo in ALGORITHMS.items():
        assert algo.name == name and isinstance(algo, Algorithm)


def test_the_event_reserved_before_data_is_the_trained_models_event(trained: Trained) -> None:
    reserved = trained.algo.event(trained.config, trained.case.data.n_items)
    assert trained.model.event == reserved
    assert accounting.event_to_json(trained.model.event) == accounting.event_to_json(reserved)


def test_calibrate_reaches_the_target_epsilon(trained: Trained) -> None:
    target = EPSILON[trained.algo.name]
    achieved = accounting.epsilon_rdp(trained.algo.event(trained.config, trained.case.data.n_items), DELTA)
    assert 0.99 * target <= achieved <= target * (1 + 1e-9)


def _same(a: Any, b: Any) -> bool:
    return bool(np.array_equal(a, b)) if isinstance(a, (np.ndarray, float)) else bool(a == b)


def test_save_load_round_trip(trained: Trained) -> None:
    algo, model = trained.algo, trained.model
    loaded = algo.load(trained.path, trained.sha)
    assert loaded.algorithm == model.algorithm == algo.name
    assert loaded.event == model.event and loaded.config == model.config and loaded.metadata == model.metadata
    assert "seed" not in loaded.config
    assert loaded.item_ids.tolist() == model.item_ids.tolist()
    assert np.array_equal(loaded.item_factors, model.item_factors)
    assert np.array_equal(loaded.trained_mask, model.trained_mask)
    for name in algo.released_outputs:  # each released output is the model attribute of that name
        assert _same(getattr(loaded, name), getattr(model, name)), name
    assert np.array_equal(algo.popularity(loaded), algo.popularity(model))
    assert algo.config_from_dict({**loaded.config, "seed": 0}) == algo.config_from_dict({**model.config, "seed": 0})
    items, values = trained.case.data.user_row(3)
    assert np.allclose(algo.score(model, items, values), algo.score(loaded, items, values))
    with pytest.raises(ArtifactError):
        algo.load(trained.path, "0" * 64)


def test_a_tampered_artifact_is_refused(trained: Trained, tmp_path: Path) -> None:
    base = trained.path.with_suffix("")
    for suffix in (".npz", ".json"):
        (tmp_path / f"m{suffix}").write_bytes(base.with_suffix(suffix).read_bytes())
    description = json.loads((tmp_path / "m.json").read_text())
    description["metadata"] = {**description["metadata"], "private": False}
    (tmp_path / "m.json").write_text(json.dumps(description))
    with pytest.raises(ArtifactError):
        trained.algo.load(tmp_path / "m.npz", None)


def test_released_outputs_are_what_the_artifact_holds(trained: Trained) -> None:
    arrays, description = read_sealed(trained.path, expected_sha256=trained.sha)
    released = set(trained.algo.released_outputs)
    assert len(released) == len(trained.algo.released_outputs)
    assert set(arrays) - {"item_ids"} == released - set(description)  # item ids: the public catalogue
    assert released <= set(arrays) | set(description)
    assert all(a.dtype != object for a in arrays.values())


def test_scores_are_finite_and_of_a_declared_kind(trained: Trained) -> None:
    algo, model = trained.algo, trained.model
    assert algo.score_kind(model) in algo.score_kinds and set(algo.score_kinds) <= set(SCORE_KINDS)
    for user in (0, 3):
        items, values = trained.case.data.user_row(user)
        scores = algo.score(model, items, values)
        assert scores.shape == (model.n_items,) and np.all(np.isfinite(scores))
    no_data = algo.score(model, np.zeros(0, dtype=np.int64), np.zeros(0))
    assert no_data.shape == (model.n_items,) and np.all(np.isfinite(no_data))


def test_popularity_is_declared_and_one_value_per_item(trained: Trained) -> None:
    algo, model = trained.algo, trained.model
    assert algo.popularity_kind in get_args(PopularityKind)
    popularity = algo.popularity(model)
    assert popularity.shape == (model.n_items,) and np.all(np.isfinite(popularity))
    if algo.popularity_kind == "mean_p_thumbs_up":
        assert np.all((popularity > 0) & (popularity < 1))
    else:
        assert np.all(popularity >= 1)  # DP counts, floored at 1


def test_the_baseline_is_one_finite_score_per_item_or_none(trained: Trained) -> None:
    algo, model = trained.algo, trained.model
    baseline = algo.baseline_scores(model)
    assert baseline is None or (baseline.shape == (model.n_items,) and np.all(np.isfinite(baseline)))
    assert (baseline is not None) == algo.scores_by_fold_in


def test_each_algorithm_declares_what_the_services_need(trained: Trained) -> None:
    algo, case = trained.algo, trained.case
    assert algo.data in get_args(DataKind) and set(algo.public_inputs) <= set(get_args(PublicInput))
    assert bool(algo.public_inputs) == (algo.data == "ratings+public") == ("public" in case.inputs)
    assert algo.min_items >= 1 and case.data.n_items >= algo.min_items
    algo.check_public_shape(trained.config, case.data.n_items)
    assert not set(algo.service_set_keys) & set(algo.public_config(trained.config)) - {"pre_randomised", "local_epsilon"}


def test_every_declared_data_kind_has_one_default_algorithm() -> None:
    kinds = {a.default_for_kind for a in ALGORITHMS.values()} - {None}
    assert kinds == {"ratings", "votes"}
    for kind in kinds:
        assert default_algorithm(kind).default_for_kind == kind
    with pytest.raises(ValueError):
        default_algorithm("pictures")


FACTS = DatasetFacts(name="d", kind="votes", rating_range=RANGE, n_items=N_ITEMS, max_users=30,
                     vote_local_epsilon=None, votes_per_user_cap=8)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_too_small_catalogue_is_refused_before_data(name: str) -> None:
    algo = get_algorithm(name)
    config = algo.config_from_params(dict(CASES[name].params), RANGE)
    with pytest.raises(CatalogueTooSmall, match=f"at least {algo.min_items} item"):
        check_public_shape(algo, config, algo.min_items - 1)
    check_public_shape(algo, config, max(algo.min_items, 2))


def test_what_the_data_set_decides_for_votes() -> None:
    onebit = get_algorithm("onebit")
    raw = onebit.data_params({}, FACTS)
    assert raw == {"user_rows": 30, "votes_per_user": 8} and not onebit.costs_nothing(raw, FACTS)
    with pytest.raises(ValueError, match="stores raw votes"):
        onebit.data_params({"pre_randomised": True}, FACTS)
    randomising = DatasetFacts(**{**FACTS.__dict__, "vote_local_epsilon": 2.0})
    forced = onebit.data_params({}, randomising)
    assert forced["pre_randomised"] is True and forced["local_epsilon"] == 2.0
    assert onebit.costs_nothing({}, randomising) and not onebit.costs_nothing({"mechanism": "outp"}, randomising)
    assert "pre_randomised" not in onebit.data_params({"mechanism": "outp"}, randomising)
    with pytest.raises(ValueError, match="cannot be chosen"):
        onebit.data_params({"local_epsilon": 2.0}, randomising)
    assert onebit.pre_randomised_epsilon({"pre_randomised": True, "local_epsilon": 2.0}) == 2.0
    assert onebit.pre_randomised_epsilon({"mechanism": "outp"}) is None


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_only_algorithms_with_defaults_take_an_objective(name: str) -> None:
    algo = get_algorithm(name)
    assert algo.data_params({"rank": 2}, FACTS)["rank"] == 2 or algo.data == "votes"
    kwargs: dict[str, Any] = dict(epsilon=1.0, delta=DELTA, rating_range=RANGE, n_items=N_ITEMS, max_users=30)
    if algo.takes_objective:
        params, used = resolve_hyperparameters(name, {}, objective="ranking", **kwargs)
        assert used and params
    else:
        with pytest.raises(ValueError, match="no objective choice"):
            resolve_hyperparameters(name, {}, objective="ranking", **kwargs)
        assert resolve_hyperparameters(name, {}, objective=None, **kwargs) == ({}, False)


def test_a_run_keeps_the_trained_items_of_a_model_in_force_of_its_family_and_objective() -> None:
    """Rule 11's public input: the model in force's trained item ids, only where the config keeps
    them and that model is a DPALS-family model of the run's objective; loaded only when needed."""
    from dataclasses import replace

    from app.core.algorithms import get_algorithm
    from app.core.mf.dpals import DPALSConfig, train_dpals
    from tests.unit.test_dpals_partitions import _ratings

    ratings = _ratings(3, n_users=120)
    ranking = DPALSConfig(objective="ranking", rank=2, n_steps=1, frequent_fraction=0.3, mean_mode="public",
                          item_bias=False, user_centering=False)
    model = train_dpals(ratings, ranking)
    algo = get_algorithm("dpals")
    loads: list[int] = []

    def in_force(found=model):
        loads.append(1)
        return found

    assert algo.inputs_from_model_in_force(ranking, in_force) == {} and not loads  # knob off: nothing loaded
    keeping = replace(ranking, keep_trained_sigmas=2.0)
    kept = algo.inputs_from_model_in_force(keeping, in_force)["kept_items"]
    assert kept.tolist() == ratings.item_ids[model.trained_mask].tolist() and 0 < len(kept) < ratings.n_items
    assert algo.inputs_from_model_in_force(keeping, lambda: None) == {}  # no model in force
    rating_run = replace(keeping, objective="rating", mean_mode="dp", item_bias=True, user_centering=True)
    assert algo.inputs_from_model_in_force(rating_run, in_force) == {}  # another objective's model
    assert get_algorithm("dpcmf").inputs_from_model_in_force(
        get_algorithm("dpcmf").config_from_dict({**keeping.to_dict()}), in_force)["kept_items"].tolist() == kept.tolist()
    assert get_algorithm("dpfw").inputs_from_model_in_force(get_algorithm("dpfw").config_from_dict({}), in_force) == {}
