"""The recommendation read maps the user's ratings to model rows by the items' database ids:
ratings of items outside the published model change nothing, a rating of a model item excludes it."""

from __future__ import annotations

from tests.api.conftest import Env, seed_ratings, train_and_publish

R = "/v1/datasets/default"


def _rate(env: Env, user: str, item: str, rating: float) -> None:
    r = env.client.post(f"{R}/ratings/batch", headers=env.ingest_service,
                        json={"ratings": [{"user_id": user, "item_id": item, "rating": rating}]})
    assert r.status_code == 200, r.text


def _reco(env: Env, user: str) -> dict:
    r = env.client.get(f"{R}/users/{user}/recommendations?n=24", headers=env.auth(user))
    assert r.status_code == 200, r.text
    return r.json()


def test_ratings_reach_the_model_rows_of_their_items(env: Env) -> None:
    seed_ratings(env)
    train_and_publish(env)
    before = _reco(env, "u0")
    assert before["fallback"] is False
    r = env.client.put(f"{R}/items/late", headers=env.ingest_service, json={"title": "added after training"})
    assert r.status_code == 201, r.text
    _rate(env, "u0", "late", 5.0)
    assert _reco(env, "u0") == before  # outside the model: no row, no signal
    target = before["items"][0]["item_id"]
    _rate(env, "u0", target, 1.0)
    after = _reco(env, "u0")
    assert target not in {x["item_id"] for x in after["items"]}  # now rated: excluded
    assert len(after["items"]) == len(before["items"]) - 1
