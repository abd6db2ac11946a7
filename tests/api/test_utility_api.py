"""The utility indicator travels with a published version: computed at publish time from the
released counts (post-processing), shown by the versions API with its verdict."""

from __future__ import annotations

from tests.api.conftest import Env, seed_ratings, train_and_publish


def test_published_version_carries_its_utility_indicator(env: Env) -> None:
    seed_ratings(env)  # 60 users: at epsilon 0.5 no count clears its noise
    version_id = train_and_publish(env, epsilon=0.5)
    versions = env.client.get("/v1/admin/datasets/default/models", headers=env.admin).json()["items"]
    (version,) = [v for v in versions if v["id"] == version_id]
    utility = version["utility"]
    assert utility == version["metrics"]["utility"]
    assert utility["considered_items"] == version["metrics"]["n_trained_items"]
    assert utility["margin"] == 3.0 and utility["count_noise_std"] > 0
    assert utility["noise_dominated"] is True and utility["clearing_share"] < 0.1
    assert "raise epsilon or wait for more users" in utility["message"]
