"""DP-CMF: public terms are free (same event, same noise), cold start, public users kept out of
every private statistic, α = 0 is DPALS bit for bit, artifact and registry round trips."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp

from app.core.algorithms import get_algorithm
from app.core.data.ratings import Ratings
from app.core.mf import dpals
from app.core.mf.dpcmf import (
    DPCMFConfig,
    PublicData,
    PublicSource,
    _blocks,
    calibrate,
    dpcmf_event,
    event_parameters,
    metadata_source,
    similarity_source,
    split_public_users,
    train_dpcmf,
)
from app.core.mf.foldin import fold_in_users, recommend
from app.core.privacy import accounting
from app.core.privacy.releaser import AuditTap, audit_tap

N_USERS, N_ITEMS, N_GENRES = 90, 40, 4


def _genres() -> list[list[str]]:
    return [[f"g{j % N_GENRES}"] + (["long"] if j % 5 == 0 else []) for j in range(N_ITEMS)]


def _ratings(seed: int = 0, n_users: int = N_USERS, cold: int = 6) -> Ratings:
    """Ratings driven by each item's genre; the last ``cold`` items have no rating at all."""
    rng = np.random.default_rng(seed)
    taste = rng.normal(0, 1, size=(n_users, N_GENRES))
    genre = np.arange(N_ITEMS) % N_GENRES
    mask = rng.random((n_users, N_ITEMS)) < 0.45
    mask[:, N_ITEMS - cold:] = False
    users, items = np.nonzero(mask)
    values = np.clip(np.rint(3 + 1.2 * taste[users, genre[items]] + rng.normal(0, 0.5, len(users))), 1, 5)
    return Ratings.from_arrays(users, items, values, user_ids=np.arange(n_users), item_ids=np.arange(N_ITEMS))


def _config(**overrides) -> DPCMFConfig:
    base = dict(rank=3, n_steps=2, contribution_bound=8, frequent_fraction=0.5, noise_multiplier=2.0,
                reg_item=20.0, seed=3)
    return DPCMFConfig(**{**base, **overrides})


def _metadata() -> PublicData:
    return PublicData((metadata_source(_genres()),))


# ---------------------------------------------------------------------------- public sources
def test_metadata_source_is_one_binary_row_per_token():
    source = metadata_source([["a", "b"], ["b"], ["c", "c"], []], min_items=1)
    assert source.row_labels == ("a", "b", "c")
    assert source.matrix.toarray().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0]]
    assert metadata_source([["a", "b"], ["b"], ["c"]], min_items=2).row_labels == ("b",)


def test_similarity_source_rows_are_neighbour_lists():
    source = similarity_source([0, 0, 2], [1, 2, 0], [0.9, 0.5, 0.7], n_items=3)
    assert source.row_labels == ("0", "2")
    assert np.allclose(source.matrix.toarray(), [[0, 0.9, 0.5], [0.7, 0, 0]])
    with pytest.raises(ValueError):
        similarity_source([0, 0], [1, 1], [0.9, 0.5], n_items=3)  # duplicate pair
    with pytest.raises(ValueError):
        similarity_source([0], [3], [0.9], n_items=3)  # out of range


def test_split_public_users_keeps_the_item_space_and_drops_the_users():
    ratings = _ratings()
    private, source = split_public_users(ratings, [3, 7, 7])
    assert np.array_equal(private.item_ids, ratings.item_ids)
    assert 3 not in private.user_ids.tolist() and 7 not in private.user_ids.tolist()
    assert private.nnz + source.matrix.nnz == ratings.nnz
    assert source.row_labels == ("3", "7")
    assert np.array_equal(source.matrix.toarray(), ratings.csr[[3, 7]].toarray())
    with pytest.raises(ValueError):
        split_public_users(ratings, [10_000])


@pytest.mark.parametrize(
    "build",
    [
        lambda: PublicSource("wiki", sp.csr_matrix(np.ones((2, N_ITEMS)))),  # unknown source
        lambda: PublicSource("metadata", sp.csr_matrix(np.array([[np.nan] + [1.0] * (N_ITEMS - 1)]))),
        lambda: PublicSource("metadata", sp.csr_matrix(np.array([[np.inf, 1.0]]))),
        lambda: PublicSource("metadata", sp.csr_matrix(np.ones((2, 3))), ("only-one-label",)),
        lambda: PublicData((metadata_source(_genres()), metadata_source(_genres()))),  # duplicate names
        lambda: PublicData((metadata_source(_genres()), similarity_source([0], [1], [1.0], N_ITEMS + 1))),
        lambda: _config(alpha_metadata=-1.0),
        lambda: _config(alpha_public_users=float("nan")),
        lambda: _config(reg_feature=0.0),
        lambda: _config(public_unobserved_weight=-0.1),
        lambda: _config(implicit=True, reg_gravity=0.0),
        lambda: DPCMFConfig.from_dict({"alpha_wiki": 1.0}),
    ],
)
def test_bad_public_inputs_raise(build):
    with pytest.raises(ValueError):
        build()


def test_misaligned_public_data_raises():
    ratings = _ratings()
    wrong = PublicData((metadata_source(_genres()[:-1]),))
    with pytest.raises(ValueError, match="item columns"):
        train_dpcmf(ratings, _config(alpha_metadata=1.0), public=wrong)


# ---------------------------------------------------------------------------- accounting
@pytest.mark.parametrize(
    "overrides",
    [{}, {"reg_gravity": 0.4, "implicit": True, "public_unobserved_weight": 0.2},
     {"contribution_mode": "tail", "mean_mode": "public", "n_steps": 4},
     {"contribution_mode": "uniform", "gram_noise_ratio": 3.0, "alpha_metadata": 9.0}],
)
def test_event_is_dpals_event_for_the_same_config(overrides):
    config = _config(**overrides)
    assert dpcmf_event(config) == dpals.dpals_event(config.dpals)
    assert event_parameters(config) == {**dpals.event_parameters(config.dpals), "algorithm": "dpcmf"}
    # and what a run actually releases: the same record as DPALS, with public data switched on
    ratings = _ratings()
    on = train_dpcmf(ratings, replace(config, alpha_metadata=5.0), public=_metadata())
    off = dpals.train_dpals(ratings, config.dpals)
    assert on.event == off.event == dpals.dpals_event(config.dpals)
    assert on.metadata["releases"] == off.metadata["releases"]
    assert accounting.count_gaussian_releases(on.event) == len(on.metadata["releases"])


@pytest.mark.parametrize("epsilon,delta", [(1.0, 1e-5), (10.0, 1e-6)])
def test_calibrate_gives_dpals_noise(epsilon, delta):
    config = _config(alpha_metadata=3.0, alpha_public_users=2.0, reg_gravity=0.3)
    calibrated = calibrate(epsilon, delta, config)
    assert calibrated.noise_multiplier == dpals.calibrate(epsilon, delta, config.dpals).noise_multiplier
    assert calibrated.alpha_metadata == 3.0 and calibrated.alpha_public_users == 2.0
    assert accounting.epsilon_rdp(dpcmf_event(calibrated), delta) == pytest.approx(epsilon, rel=1e-3)


@pytest.mark.parametrize("gravity", [0.0, 0.5])
def test_zero_alpha_is_dpals_bit_for_bit(gravity):
    ratings = _ratings()
    config = _config(reg_gravity=gravity)
    reference = dpals.train_dpals(ratings, config.dpals)
    everything = PublicData((metadata_source(_genres()), similarity_source([0, 1], [1, 0], [1.0, 1.0], N_ITEMS)))
    for public in (None, everything):
        model = train_dpcmf(ratings, config, public=public)
        assert model.algorithm == "dpcmf"
        assert np.array_equal(model.item_factors, reference.item_factors)
        assert np.array_equal(model.trained_mask, reference.trained_mask)
        assert np.array_equal(model.item_counts, reference.item_counts)
        assert model.global_mean == reference.global_mean
        assert model.metadata["cold_start_items"] == []


def test_public_terms_change_the_model_not_the_noise():
    ratings = _ratings()
    config = _config(alpha_metadata=5.0)
    with_public = train_dpcmf(ratings, config, public=_metadata())
    without = train_dpcmf(ratings, config)
    trained = without.trained_mask
    assert not np.allclose(with_public.item_factors[trained], without.item_factors[trained])
    assert np.array_equal(with_public.item_counts, without.item_counts)
    assert with_public.global_mean == without.global_mean


# ---------------------------------------------------------------------------- public users
def _released_statistics(tap: AuditTap) -> tuple[np.ndarray, np.ndarray]:
    """The released item statistics (Ã_j upper triangles, b̃_j) of a one-step run, in item order
    (chunks are released in parallel, in any order); with the same seed the noise is the same, so
    they are equal iff the statistics are (up to the release grid)."""

    def in_item_order(chunks: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        items = np.concatenate([positions for positions, _ in chunks])
        assert np.array_equal(np.sort(items), np.arange(len(items)))  # every trained item, once
        return np.concatenate([values for _, values in chunks])[np.argsort(items)]

    grams = [(items, np.triu(gram)) for items, gram in tap.rows["item_grams"]]  # all the release reads
    return in_item_order(grams), in_item_order(tap.rows["item_linear"])


def test_public_users_never_enter_a_private_statistic():
    ratings = _ratings()
    public_ids = [0, 5, 11, 20, 33]
    rng = np.random.default_rng(9)
    changed = ratings.with_values(
        np.where(np.isin(ratings.coo()[0], public_ids), rng.integers(1, 6, ratings.nnz), ratings.csr.data)
    )
    assert not np.array_equal(changed.csr.data, ratings.csr.data)
    config = _config(alpha_public_users=3.0, n_steps=1)  # one step: U comes from the data-free init
    runs = []
    for data in (ratings, changed):
        private, source = split_public_users(data, public_ids)
        with audit_tap() as tap:
            model = train_dpcmf(private, config, public=PublicData((source,)))
        runs.append((private, source, model, _released_statistics(tap)))
    (p0, s0, m0, (g0, b0)), (p1, s1, m1, (g1, b1)) = runs
    assert not np.array_equal(s0.matrix.toarray(), s1.matrix.toarray())
    assert np.array_equal(p0.csr.toarray(), p1.csr.toarray()) and np.array_equal(p0.user_ids, p1.user_ids)
    assert np.array_equal(m0.item_counts, m1.item_counts)  # DP counts
    assert m0.global_mean == m1.global_mean  # DP mean
    assert np.array_equal(g0, g1) and np.array_equal(b0, b1)  # item Grams and linear terms
    assert not np.allclose(m0.item_factors, m1.item_factors)  # the public data was used


def test_public_users_left_in_the_private_ratings_raise():
    ratings = _ratings()
    _, source = split_public_users(ratings, [1, 2])
    with pytest.raises(ValueError, match="removed"):
        train_dpcmf(ratings, _config(alpha_public_users=1.0), public=PublicData((source,)))


def test_public_users_rows_are_centred_by_the_dp_mean_only():
    """S_fj = r_fj − m̃: each public user keeps her bias and nothing is clipped (public rows)."""
    ratings = _ratings()
    private, source = split_public_users(ratings, [2, 4])
    config = _config(alpha_public_users=1.0, clip_rating=1.0)
    model = train_dpcmf(private, config, public=PublicData((source,)))
    (block,) = _blocks([source], config, model.global_mean)
    assert np.allclose(block.matrix.toarray()[source.matrix.toarray() > 0],
                       source.matrix.data - model.global_mean)
    assert np.abs(block.matrix.data).max() > config.clip_rating
    with pytest.raises(ValueError, match="range"):
        _blocks([PublicSource("public_users", source.matrix * 2.0)], config, model.global_mean)


# ---------------------------------------------------------------------------- cold start
def test_features_only_items_get_embeddings_and_are_recommendable():
    ratings = _ratings(cold=6)
    genres = _genres()[:-1] + [[]]  # the last item: no rating and no metadata
    config = _config(alpha_metadata=5.0)
    model = train_dpcmf(ratings, config, public=PublicData((metadata_source(genres),)))
    private_set = dpals.train_dpals(ratings, config.dpals).trained_mask  # the DP frequent set
    no_ratings = ratings.item_counts() == 0
    cold = no_ratings & ~private_set
    cold[-1] = False
    assert cold.sum() >= 3 and not private_set[-1]
    assert np.all(model.trained_mask[cold])
    assert np.all(np.linalg.norm(model.item_factors[cold], axis=1) > 0)
    assert not model.trained_mask[-1] and np.all(model.item_factors[-1] == 0)
    assert set(np.flatnonzero(cold).tolist()) <= set(model.metadata["cold_start_items"])
    assert model.metadata["public_sources"] == [{"name": "metadata", "rows": 5, "entries": 47, "alpha": 5.0}]
    # the privileged endpoint scores them: a user who loves genre g gets g's cold items on top
    items, values = ratings.user_row(0)
    chosen, scores = recommend(model, items, values, N_ITEMS)
    assert np.all(np.isfinite(scores))
    assert set(np.flatnonzero(cold).tolist()) <= set(chosen.tolist())
    assert N_ITEMS - 1 not in chosen.tolist()


def test_metadata_helps_cold_items_match_the_genre_structure():
    """Cold items' embeddings come from their genres: same genre -> same embedding direction."""
    ratings = _ratings(cold=8)
    model = train_dpcmf(ratings, _config(alpha_metadata=5.0, noise_multiplier=0.5), public=_metadata())
    genre = np.arange(N_ITEMS) % N_GENRES
    cold = np.flatnonzero(ratings.item_counts() == 0)
    users = fold_in_users(model, ratings)
    # predicted preference for cold items correlates with each user's observed taste for the genre
    rows, cols, vals = ratings.coo()
    taste = np.zeros((ratings.n_users, N_GENRES))
    np.add.at(taste, (rows, genre[cols]), vals - vals.mean())
    predicted = users @ model.item_factors[cold].T
    corr = np.corrcoef(predicted.ravel(), taste[:, genre[cold]].ravel())[0, 1]
    assert corr > 0.4, corr  # 0.68 here; 0.43-0.68 over other seeds and alphas


# ---------------------------------------------------------------------------- implicit, artifacts
def test_implicit_variant_trains_with_the_dpals_event():
    ratings = _ratings()
    binary = ratings.with_values(np.ones(ratings.nnz))
    config = _config(rating_range=(0.0, 1.0), mean_mode="public", public_mean=0.0, user_centering=False,
                     clip_rating=1.0, reg_gravity=0.5, implicit=True, alpha_metadata=2.0,
                     public_unobserved_weight=0.3)
    model = train_dpcmf(binary, config, public=_metadata())
    assert model.event == dpals.dpals_event(config.dpals)
    assert np.all(np.isfinite(model.item_factors))
    assert model.metadata["cold_start_items"]


def test_registry_entry_takes_public_data_and_keeps_the_dpals_event():
    """DP-CMF specifics; the round trip every algorithm keeps is in test_algorithm_contract.py."""
    algo = get_algorithm("dpcmf")
    assert algo.data == "ratings+public" and get_algorithm("dpals").data == "ratings"
    config = algo.config_from_params({"rank": 3, "n_steps": 2, "contribution_bound": 8, "frequent_fraction": 0.5,
                                      "alpha_metadata": 4.0, "reg_item": 20.0}, (1.0, 5.0))
    config = algo.calibrate(5.0, 1e-5, config, N_ITEMS)
    assert algo.event(config, N_ITEMS) == dpals.dpals_event(config.dpals)
    model = algo.train(_ratings(), config, progress=None, public=_metadata())
    assert model.algorithm == "dpcmf" and model.metadata["cold_start_items"]
    assert "seed" not in model.config and model.config["alpha_metadata"] == 4.0
    assert algo.config_from_dict(model.config | {"seed": 0}).alpha_metadata == 4.0
    with pytest.raises(ValueError):
        algo.config_from_params({"rating_range": [0, 1]}, (1.0, 5.0))


def test_the_published_config_is_the_runs_with_the_bound_laws_applied():
    ratings = _ratings()
    config = _config(objective="ranking", mean_mode="public", item_bias=False, user_centering=False,
                     bound_quantile=0.5, bound_min=2, popularity_prior=0.5, prior_bound_floor=40.0,
                     ridge_bound_exponent=0.5, ridge_bound_reference=8.0, ridge_bound_cap=1.0, alpha_metadata=5.0)
    reference = dpals.train_dpals(ratings, config.dpals)
    model = train_dpcmf(ratings, config, public=_metadata())
    k = model.config["contribution_bound"]
    assert k == reference.config["contribution_bound"]
    for name in ("popularity_prior", "reg_user", "prior_bound_floor", "ridge_bound_exponent", "ridge_bound_reference",
                 "ridge_bound_cap"):
        assert model.config[name] == reference.config[name]
    assert model.config["popularity_prior"] == pytest.approx(0.5 + 40.0 / k**2) and model.config["prior_bound_floor"] == 0
    assert np.allclose(model.item_biases, reference.item_biases)
