"""Privileged recommendations, public model routes, authorisation and the joint-DP boundary."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest

from app.auth import issue_token
from tests.api.conftest import SECRET, Env, seed_ratings, train_and_publish

R = "/v1/datasets/default"


@pytest.fixture
def published(env: Env) -> Env:
    seed_ratings(env)
    train_and_publish(env)
    return env


def _reco(env: Env, user: str, headers=None, **params):
    return env.client.get(f"{R}/users/{user}/recommendations", params=params, headers=headers or env.auth(user))


def test_recommendations_exclude_rated_and_name_the_version(published: Env) -> None:
    env = published
    info = env.client.get(f"{R}/model").json()
    body = _reco(env, "u0", n=5).json()
    assert body["model_version"] == info["model_version"] and body["algorithm"] == "dpals"
    assert body["fallback"] is False and len(body["items"]) == 5
    rated = {r["item_id"] for r in env.client.get(f"{R}/users/u0/ratings", headers=env.auth("u0")).json()["items"]}
    got = [x["item_id"] for x in body["items"]]
    assert not rated & set(got)
    assert [x["rank"] for x in body["items"]] == [1, 2, 3, 4, 5]
    scores = [x["score"] for x in body["items"]]
    assert scores == sorted(scores, reverse=True)


def test_category_filter_exclude_list_and_post_form(published: Env) -> None:
    env = published
    body = _reco(env, "u1", n=50, category="even").json()
    assert body["items"] and all(int(x["item_id"][1:]) % 2 == 0 for x in body["items"])
    first = body["items"][0]["item_id"]
    again = _reco(env, "u1", n=50, category="even", exclude=[first]).json()
    assert first not in {x["item_id"] for x in again["items"]}
    post = env.client.post(f"{R}/users/u1/recommendations", headers=env.auth("u1"),
                           json={"n": 50, "categories": ["even"], "exclude": [first]}).json()
    assert post == again
    empty = _reco(env, "u1", category="no-such-category").json()
    assert empty["items"] == [] and empty["notes"] == ["no item carries category 'no-such-category'"]
    assert body["notes"] == []
    # deactivated items disappear from recommendations
    env.client.put(f"{R}/items/{again['items'][0]['item_id']}", headers=env.admin,
                   json={"categories": ["even"], "active": False})
    from app.services.serving.catalogue_cache import invalidate_catalog
    invalidate_catalog()
    later = _reco(env, "u1", n=50, category="even").json()
    assert again["items"][0]["item_id"] not in {x["item_id"] for x in later["items"]}


def test_new_user_gets_flagged_dp_popular_fallback(published: Env) -> None:
    env = published
    body = _reco(env, "newcomer", n=5).json()
    popular = env.client.get(f"{R}/popular", params={"n": 5}).json()
    assert body["fallback"] is True and body["fallback_reason"].startswith("dp_popular")
    assert [x["item_id"] for x in body["items"]] == [x["item_id"] for x in popular["items"]]
    assert body["model_version"] == popular["model_version"]


def test_public_model_routes(published: Env) -> None:
    env = published
    info = env.client.get(f"{R}/model").json()
    assert info["algorithm"] == "dpals" and info["n_items"] == 24 and info["rank"] == 4
    assert info["dataset_version"] == 1  # the first model of this data set
    assert 0 < info["epsilon"] <= 2.0 + 1e-3 and info["delta"] > 0
    page = env.client.get(f"{R}/model/embeddings", params={"offset": 20, "limit": 10}).json()
    assert page["total"] == 24 and len(page["items"]) == 4 and page["next_offset"] is None
    assert all(len(row["vector"]) == 4 for row in page["items"])
    r = env.client.get(f"{R}/model/embeddings.npy")
    assert r.status_code == 200 and r.headers["x-model-version"] == str(info["model_version"])
    v = np.load(io.BytesIO(r.content), allow_pickle=False)
    assert v.shape == (24, 4) and v.dtype == np.float32
    assert np.allclose(v[20], page["items"][0]["vector"], atol=1e-6)
    sim = env.client.get(f"{R}/items/i0/similar", params={"n": 3}).json()
    assert len(sim["items"]) == 3 and "i0" not in {x["item_id"] for x in sim["items"]}
    assert env.client.get(f"{R}/items/unknown/similar").status_code == 404
    pop = env.client.get(f"{R}/popular", params={"n": 24}).json()["items"]
    counts = [x["dp_count"] for x in pop]
    assert counts == sorted(counts, reverse=True)
    assert env.client.get(f"{R}/popular", params={"n": 100000}).status_code == 422


def test_no_active_model_is_clear_404(env: Env) -> None:
    r = _reco(env, "u0")
    assert r.status_code == 404 and r.json()["error"]["code"] == "no_active_model"
    assert env.client.get(f"{R}/model").json()["error"]["code"] == "no_active_model"


# ----------------------------------------------------------------------------- authorisation
def test_user_cannot_read_another_users_data(published: Env) -> None:
    env = published
    r = _reco(env, "u0", headers=env.auth("u1"))
    assert r.status_code == 403 and r.json()["error"]["code"] == "wrong_subject"
    assert env.client.post(f"{R}/users/u0/recommendations", json={}, headers=env.auth("u1")).status_code == 403
    assert env.client.get(f"{R}/users/u0/ratings", headers=env.auth("u1")).status_code == 403
    # a service may act for users only with that scope
    assert _reco(env, "u0", headers=env.auth("svc", "service", ("act_for_users",))).status_code == 200
    assert _reco(env, "u0", headers=env.auth("svc", "service", ("ingest",))).status_code == 403
    # admins administer budgets; they do not read users' private data
    assert _reco(env, "u0", headers=env.admin).status_code == 403


def test_user_cannot_write_another_users_ratings_or_items(published: Env) -> None:
    env = published
    before = env.count("ratings")
    r = env.client.put(f"{R}/users/u0/ratings/i0", json={"rating": 3}, headers=env.auth("u1"))
    assert r.status_code == 403
    r = env.client.post(f"{R}/ratings/batch", headers=env.auth("u1"),
                        json={"ratings": [{"user_id": "u1", "item_id": "i0", "rating": 3},
                                          {"user_id": "u0", "item_id": "i0", "rating": 3}]})
    assert r.status_code == 403
    assert env.client.delete("/v1/users/u0", headers=env.auth("u1")).status_code == 403
    assert env.client.put(f"{R}/items/i0", json={"title": "x"}, headers=env.auth("u1")).status_code == 403
    assert env.count("ratings") == before


ADMIN_ROUTES = [
    ("get", "/v1/admin/datasets/default/budget", None),
    ("patch", "/v1/admin/datasets/default/budget", {"epsilon_cap": 100, "reason": "x"}),
    ("get", "/v1/admin/datasets/default/ledger", None),
    ("post", "/v1/admin/datasets/default/trainings", {"epsilon": 1.0}),
    ("get", "/v1/admin/datasets/default/trainings", None),
    ("get", "/v1/admin/trainings/1", None),
    ("get", "/v1/admin/datasets/default/models", None),
    ("post", "/v1/admin/datasets/default/models/1/activate", None),
]


@pytest.mark.parametrize("method,path,body", ADMIN_ROUTES)
def test_admin_routes_refuse_non_admins(sqlite_env: Env, method: str, path: str, body) -> None:
    env = sqlite_env
    for headers, status in [
        ({}, 401),
        (env.auth("u0"), 403),
        (env.auth("svc", "service", ("ingest", "act_for_users")), 403),
        ({"Authorization": "Bearer not-a-jwt"}, 401),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, 401),
    ]:
        r = env.client.request(method, path, json=body, headers=headers)
        assert r.status_code == status, (headers, r.text)
        assert set(r.json()) == {"error"}
    assert env.count("training_runs") == 0


def test_expired_and_tampered_tokens_refused(sqlite_env: Env) -> None:
    env = sqlite_env
    expired = issue_token("u0", secret=SECRET, ttl_seconds=5, now=time.time() - 60)
    r = _reco(env, "u0", headers={"Authorization": f"Bearer {expired}"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "token_expired"
    assert r.headers["www-authenticate"] == "Bearer"
    good = env.token("u0")
    head, payload, sig = good.split(".")
    other = env.token("u1").split(".")[1]
    for bad in (f"{head}.{other}.{sig}", good[:-2] + ("AA" if not good.endswith("AA") else "BB"),
                issue_token("u0", secret="another-secret-0123456789abcdefXYZ")):
        r = _reco(env, "u0", headers={"Authorization": f"Bearer {bad}"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_token"
    admin_forged = issue_token("root", secret="another-secret-0123456789abcdefXYZ", kind="admin")
    r = env.client.get("/v1/admin/datasets/default/budget", headers={"Authorization": f"Bearer {admin_forged}"})
    assert r.status_code == 401


# ----------------------------------------------------------------------------- joint DP
def test_joint_dp_boundary(published: Env) -> None:
    """A's recommendations depend only on the published model and A's own ratings: other users'
    rating changes have no effect until a retrain publishes a new model."""
    env = published
    before = _reco(env, "u0", n=10).json()
    # other users change, add and delete ratings
    rows = [{"user_id": f"u{u}", "item_id": f"i{i}", "rating": 0.5 if (u + i) % 2 else 5.0}
            for u in range(1, 60) for i in range(0, 24, 3)]
    assert env.client.post(f"{R}/ratings/batch", json={"ratings": rows}, headers=env.ingest_service).status_code == 200
    assert env.client.delete("/v1/users/u3", headers=env.auth("u3")).status_code == 200
    for _ in range(2):
        assert _reco(env, "u0", n=10).json() == before
    # A's own new rating does change A's answer (and the item leaves the list)
    target = before["items"][0]["item_id"]
    env.client.put(f"{R}/users/u0/ratings/{target}", json={"rating": 1.0}, headers=env.auth("u0"))
    mine = _reco(env, "u0", n=10).json()
    assert target not in {x["item_id"] for x in mine["items"]} and mine["model_version"] == before["model_version"]
    # a retrain publishes a new version, which the running app picks up without restart
    new_version = train_and_publish(env)
    after = _reco(env, "u0", n=10).json()
    assert new_version != before["model_version"] and after["model_version"] == new_version


def test_rollback_to_older_version(published: Env) -> None:
    env = published
    v1 = env.client.get(f"{R}/model").json()["model_version"]
    v2 = train_and_publish(env)
    versions = env.client.get("/v1/admin/datasets/default/models", headers=env.admin).json()
    assert versions["total"] == 2 and {v["id"] for v in versions["items"]} == {v1, v2}
    assert [v["active"] for v in versions["items"] if v["id"] == v2] == [True]
    r = env.client.post(f"/v1/admin/datasets/default/models/{v1}/activate", headers=env.admin)
    assert r.status_code == 200 and r.json()["active"] is True
    assert env.client.get(f"{R}/model").json()["model_version"] == v1
    assert _reco(env, "u0").json()["model_version"] == v1
    assert env.client.post("/v1/admin/datasets/default/models/999999/activate", headers=env.admin).status_code == 404
