"""DP-CMF through the service on SQLite and PostgreSQL: public data (metadata tokens, a public
similarity source, public users) -> reserve -> train -> publish -> privileged recommendations.

* the reservation is exactly what DPALS reserves for the same hyper-parameters (public data is free);
* public users' rows never reach the private ratings: changing them arbitrarily leaves the
  private input, and the private DP releases drawn with the same seed, unchanged;
* an item with public data but no ratings gets a non-zero embedding and is recommended.
"""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import delete, select, update

from app import ledger, model_store
from app.core.algorithms import get_algorithm
from app.db import loaders
from app.db.models import Dataset, Item, Rating, User
from app.db.session import session_scope
from app.schemas.serving import RecommendationQuery
from app.services import public_data
from app.services.serving import active as serving_active
from app.services.serving import published, recommend
from app.services.training import requests as train_requests
from app.services.training import runner, schedule
from tests.integration.platform_helpers import create_dataset, schedule_clock, seed_ratings, synthetic_ratings

# Half the items are trained privately: at epsilon 10 the count noise (std ~11) is far below the
# ~70 ratings of the median item, so the unrated items stay outside the DP frequent set.
DPALS_HYPER = {"rank": 4, "n_steps": 2, "contribution_bound": 20, "frequent_fraction": 0.5}
EPSILON = 10.0
CMF_HYPER = {**DPALS_HYPER, "alpha_metadata": 2.0, "alpha_similarities": 1.0, "alpha_public_users": 1.0}
PUBLIC_USERS = ("u1", "u7", "u42", "u99", "nobody")  # "nobody" opts in but has no ratings
SOURCE = "wiki"


def _add_item(s, ds_id: int, external_id: str, categories: list[str], features: dict | None = None) -> None:
    s.add(Item(dataset_id=ds_id, external_id=external_id, title=external_id, categories=categories,
               features=features or {}))


@pytest.fixture
def seeded(db_url):
    """Ratings on i0..i59 with genres g0..g3 and an author; three items without any rating:
    ``cold_meta`` (genre g1 only), ``cold_sim`` (no metadata, public neighbours only) and
    ``cold_none`` (no public data at all); a public similarity source; five public users."""
    create_dataset(db_url, cap=3 * EPSILON)
    seed_ratings(db_url, "default", synthetic_ratings(n_users=600, n_ratings=6000))
    model_store.clear_cache()
    serving_active.invalidate_catalog()  # items are edited below without the ingest service
    with session_scope(db_url) as s:
        ds = s.scalar(select(Dataset).where(Dataset.name == "default"))
        for item in s.scalars(select(Item).where(Item.dataset_id == ds.id)):
            k = int(item.external_id[1:])
            item.categories, item.features = [f"g{k % 4}"], {"author": f"a{k % 7}", "year": 1990 + k}
        _add_item(s, ds.id, "cold_meta", ["g1"])
        _add_item(s, ds.id, "cold_sim", [])
        _add_item(s, ds.id, "cold_none", [])
        s.flush()
        public_data.put_similarity_source(s, dataset="default", name=SOURCE, provenance="https://example.org/graph",
                                          declared_public=True, actor="test")
        public_data.replace_neighbours(s, dataset="default", source=SOURCE, rows=[
            ("cold_sim", [("i2", 0.9), ("i6", 0.8), ("i10", 0.7)]),
            ("i3", [("i7", 0.5), ("i11", 0.4)]),
        ])
        for user in PUBLIC_USERS:
            public_data.set_public_ratings(s, dataset="default", user_id=user, public=True, actor=f"user:{user}")
    return db_url


def _start(url: str, algorithm: str, hyper: dict) -> int:
    with session_scope(url) as s:
        return train_requests.start_training(s, dataset="default", algorithm=algorithm, epsilon=EPSILON,
                                       hyperparameters=hyper, actor="admin").id


def _inputs(url: str):
    with session_scope(url) as s:
        ds = s.scalar(select(Dataset).where(Dataset.name == "default"))
        return loaders.load_ratings_and_public(s, ds)


def _user_db_ids(url: str, externals) -> dict[str, int]:
    with session_scope(url) as s:
        return dict(s.execute(select(User.external_id, User.id).where(User.external_id.in_(list(externals)))).all())


def test_dpcmf_reserves_exactly_what_dpals_reserves(seeded):
    dpcmf_run, dpals_run = _start(seeded, "dpcmf", CMF_HYPER), _start(seeded, "dpals", DPALS_HYPER)
    with session_scope(seeded) as s:
        cmf, als = ledger.reservation_for(s, dpcmf_run), ledger.reservation_for(s, dpals_run)
        assert cmf.event == als.event
        assert cmf.epsilon == als.epsilon
        assert cmf.parameters == {**als.parameters, "algorithm": "dpcmf"}


def test_public_users_never_reach_the_private_ratings(seeded):
    private, extra = _inputs(seeded)
    public_ids = _user_db_ids(seeded, PUBLIC_USERS)
    assert len(public_ids) == 5 and not set(public_ids.values()) & set(private.user_ids.tolist())
    users = extra["public"].get("public_users")
    assert users is not None and users.n_rows == 4  # "nobody" has no ratings
    # change every public user's ratings arbitrarily (values, a deletion, new items)
    with session_scope(seeded) as s:
        s.execute(update(Rating).where(Rating.user_id.in_(list(public_ids.values()))).values(value=1.0))
        first = s.scalars(select(Rating).where(Rating.user_id == public_ids["u1"])).first()
        s.delete(first)
        s.execute(delete(Rating).where(Rating.user_id == public_ids["u7"]))
        items = list(s.scalars(select(Item.id).where(Item.external_id.in_(["cold_none", "i0", "i1"]))))
        for item in items:
            s.add(Rating(dataset_id=first.dataset_id, user_id=public_ids["u7"], item_id=item, value=5.0))
    private2, extra2 = _inputs(seeded)
    assert np.array_equal(private.user_ids, private2.user_ids)
    assert np.array_equal(private.item_ids, private2.item_ids)
    for a, b in ((private.csr, private2.csr),):
        assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
        assert np.array_equal(a.data, b.data)
    assert (extra2["public"].get("public_users").matrix != users.matrix).nnz > 0
    # the private DP releases drawn with the same seed are identical (counts, mean, frequent set)
    algo = get_algorithm("dpcmf")
    config = algo.config_from_dict({**algo.config_from_params(CMF_HYPER, (1.0, 5.0)).to_dict(),
                                    "noise_multiplier": 1.0, "seed": 7})
    m1 = algo.train(private, config, public=extra["public"])
    m2 = algo.train(private2, config, public=extra2["public"])
    assert np.array_equal(m1.item_counts, m2.item_counts) and m1.global_mean == m2.global_mean
    assert m1.metadata["n_private_trained_items"] == m2.metadata["n_private_trained_items"]


def test_similarities_come_only_from_the_declared_public_sources(seeded):
    _, extra = _inputs(seeded)
    sims = extra["public"].get("similarities")
    assert sorted(sims.row_labels) == [f"{SOURCE}:cold_sim", f"{SOURCE}:i3"]
    # each row lists its neighbours and the item itself (with the row's largest score)
    item_ids = list(_inputs(seeded)[0].item_ids)
    row = sims.matrix.getrow(list(sims.row_labels).index(f"{SOURCE}:cold_sim")).toarray()[0]
    assert row[item_ids.index("cold_sim")] == pytest.approx(0.9) and row[item_ids.index("i6")] == pytest.approx(0.8)
    meta = extra["public"].get("metadata")
    assert "category:g1" in meta.row_labels and "author:a3" in meta.row_labels
    assert not any(t.startswith("year") for t in meta.row_labels)  # numbers are not tokens


def test_dpcmf_trains_publishes_and_recommends_cold_start_items(seeded, settings):
    url = seeded
    run_id = _start(url, "dpcmf", CMF_HYPER)
    assert runner.run_training(run_id, url=url, settings=settings) == "succeeded"
    with session_scope(url) as s:
        row, model = model_store.get_active_model(s, "default")
        assert row.algorithm == "dpcmf" and model.algorithm == "dpcmf"
        pos = model.item_index()
        for item in ("cold_meta", "cold_sim"):
            assert model.trained_mask[pos[item]] and np.linalg.norm(model.item_factors[pos[item]]) > 0
        assert not model.trained_mask[pos["cold_none"]]
        assert not np.any(model.item_factors[pos["cold_none"]])
        info = published.model_info(s, dataset="default")
        used = {src["name"]: src for src in info.privacy["public_sources"]}
        assert used["public_users"]["rows"] == 4 and used["similarities"]["rows"] == 2
        assert used["metadata"]["rows"] > 0 and set(info.privacy["cold_start_items"]) >= {"cold_meta", "cold_sim"}
        out = recommend.recommend_for_user(s, dataset="default", user_id="u3", query=RecommendationQuery(n=100))
        ids = [x.item_id for x in out.items]
        assert not out.fallback and "cold_meta" in ids and "cold_sim" in ids and "cold_none" not in ids
        g1 = recommend.recommend_for_user(s, dataset="default", user_id="u3",
                                          query=RecommendationQuery(n=100, categories=["g1"]))
        assert "cold_meta" in [x.item_id for x in g1.items]


def test_dpals_on_the_same_data_cannot_recommend_cold_items(seeded, settings):
    """The contrast that makes the cold-start test meaningful: DPALS leaves them untrained."""
    run_id = _start(seeded, "dpals", DPALS_HYPER)
    assert runner.run_training(run_id, url=seeded, settings=settings) == "succeeded"
    with session_scope(seeded) as s:
        out = recommend.recommend_for_user(s, dataset="default", user_id="u3", query=RecommendationQuery(n=100))
        assert not {"cold_meta", "cold_sim"} & {x.item_id for x in out.items}


def test_scheduled_retraining_keeps_the_active_algorithm_and_its_public_hyperparameters(seeded, settings):
    """A DP-CMF model is retrained as DP-CMF (same α), re-calibrated to the retrain epsilon,
    not replaced by a DPALS model; without an active model the default is DPALS."""
    clock = schedule_clock(settings)  # one retrain interval between ticks: each is due
    sched = lambda: schedule.scheduled_retrain(url=seeded, settings=settings, enqueue=False, now=clock())["default"]  # noqa: E731
    assert runner.run_training(_start(seeded, "dpcmf", CMF_HYPER), url=seeded, settings=settings) == "succeeded"
    with session_scope(seeded) as s:
        from app.db.models import bump_ratings_version

        bump_ratings_version(s, s.scalar(select(Dataset.id).where(Dataset.name == "default")))
    out = sched()
    assert out.startswith("started:"), out
    with session_scope(seeded) as s:
        from app.db.models import TrainingRun

        run = s.get(TrainingRun, int(out.split(":")[1]))
        assert run.algorithm == "dpcmf" and run.trigger == "schedule"
        assert {k: run.config[k] for k in CMF_HYPER} == CMF_HYPER
        assert run.requested_epsilon == settings.retrain_epsilon
