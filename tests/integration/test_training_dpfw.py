"""DPFW through the service on SQLite and PostgreSQL: reserve -> train -> publish -> privileged
replay scoring and DP-popular items, with the ledger charging exactly the DPFW event."""

from __future__ import annotations

import numpy as np
import pytest

from app import ledger, model_store
from app.core.mf.dpfw import FrankWolfeModel, replay_user
from app.core.privacy.accounting import epsilon_rdp, event_to_json
from app.db.session import session_scope
from app.errors import InvalidRequest
from app.schemas.serving import RecommendationQuery
from app.services.ingest import user_ratings_arrays
from app.services.serving import popular as serving_popular
from app.services.serving import recommend
from app.services.training import requests as train_requests
from app.services.training import runner
from tests.integration.platform_helpers import create_dataset, seed_ratings, synthetic_ratings

HYPER = {"n_steps": 4, "row_clip": 3.0, "nuclear_norm": 200.0, "max_ratings_per_user": 20}


@pytest.fixture
def seeded(db_url):
    create_dataset(db_url, cap=10.0)
    seed_ratings(db_url, "default", synthetic_ratings())
    model_store.clear_cache()
    return db_url


def _start(url: str, **kw) -> int:
    args = dict(dataset="default", algorithm="dpfw", epsilon=2.0, hyperparameters=HYPER, actor="admin")
    args.update(kw)
    with session_scope(url) as s:
        return train_requests.start_training(s, **args).id


def test_dpfw_trains_publishes_and_serves(seeded, settings):
    url = seeded
    run_id = _start(url)
    with session_scope(url) as s:
        reserved = ledger.reservation_for(s, run_id)
        assert reserved.parameters["algorithm"] == "dpfw"
        assert reserved.parameters["eigen_method"] == "dense"  # "auto" resolved at reservation (60 items)
        assert reserved.epsilon <= 2.0 + 1e-9
    assert runner.run_training(run_id, url=url, settings=settings) == "succeeded"
    with session_scope(url) as s:
        row, model = model_store.get_active_model(s, "default")
        assert isinstance(model, FrankWolfeModel) and row.algorithm == "dpfw"
        assert "seed" not in model.config
        assert event_to_json(model.event) == ledger.reservation_for(s, run_id).event
        assert row.epsilon == pytest.approx(epsilon_rdp(model.event, row.delta))
        user = "u3"
        out = recommend.recommend_for_user(s, dataset="default", user_id=user, query=RecommendationQuery(n=5))
        assert out.algorithm == "dpfw" and not out.fallback and len(out.items) == 5
        # the service's scores are the replay of this user's own row against the released sequence
        item_ids, values = user_ratings_arrays(s, dataset_id=row.dataset_id, user_id=user)
        positions = model.item_index()
        scores = replay_user(model, np.array([positions[i] for i in item_ids]), np.asarray(values))
        for scored in out.items:
            assert scored.item_id not in set(item_ids)
            assert scored.score == pytest.approx(scores[positions[scored.item_id]])
        popular = serving_popular.popular(s, dataset="default", n=3)
        assert len(popular.items) == 3  # DP counts released (and charged) by DPFW


def test_dpfw_rejects_a_rating_range_and_unknown_parameters(seeded):
    with pytest.raises(InvalidRequest, match="rating_range"):
        _start(seeded, hyperparameters={**HYPER, "rating_range": [1, 5]})
    with pytest.raises(InvalidRequest, match="unknown"):
        _start(seeded, hyperparameters={**HYPER, "contribution_bound": 5})
