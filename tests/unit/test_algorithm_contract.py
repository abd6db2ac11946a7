"""One contract every registered algorithm keeps (app.core.algorithms.Algorithm).

Parametrised over the registry: a new algorithm must add its small training case below, and then
gets the artifact round trip, the event reserved before data equal to the event of the trained
model, calibration to the target ε, released outputs equal to what the artifact holds, and scores
that are finite and agree with ``recommend``. Algorithm-specific checks stay in each algorithm's
own test file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest

from app.core.algorithms import ALGORITHMS, SCORE_KINDS, Algorithm, PopularityKind, get_algorithm
from app.core.data.ratings import Ratings
from app.core.mf.artifact import ArtifactError, read_sealed
from app.core.mf.dpcmf import PublicData, metadata_source
from app.core.privacy import accounting

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
    a, b = algo.recommend(model, items, values, 5), algo.recommend(loaded, items, values, 5)
    assert np.array_equal(a[0], b[0]) and np.allclose(a[1], b[1])
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


def test_scores_are_finite_and_agree_with_recommend(trained: Trained) -> None:
    algo, model = trained.algo, trained.model
    assert algo.score_kind(model) in SCORE_KINDS
    for user in (0, 3):
        items, values = trained.case.data.user_row(user)
        scores = algo.score(model, items, values)
        assert scores.shape == (model.n_items,) and np.all(np.isfinite(scores))
        idx, top = algo.recommend(model, items, values, 5)
        assert len(idx) > 0 and not set(idx.tolist()) & set(items.tolist())
        assert np.allclose(top, scores[idx]) and np.all(np.diff(top) <= 0)
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
